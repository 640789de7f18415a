"""scripts/servers.py: finding or starting PostgreSQL and RabbitMQ, and stopping only its own."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

import pytest

from scripts.gin_servers import common

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "servers.py"


def load_servers() -> ModuleType:
    """scripts/servers.py as a module (scripts/ is not a package)."""
    name = "gin_scripts_servers"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GIN_DATABASE_URL", "GIN_AMQP_URL")}
    env.update(extra)
    return env


def servers(
    *args: str | Path, env: Mapping[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        env=dict(env) if env is not None else clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def parse_exports(text: str) -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in text.splitlines():
        assert line.startswith("export "), line
        name, _, value = line.removeprefix("export ").partition("=")
        settings[name] = value
    return settings


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait_closed(port: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while port_open(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def amqp_first_frame(port: int) -> bytes:
    """What the server answers to the AMQP 0-9-1 protocol header (its first 11 bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        data = b""
        while len(data) < 11:
            chunk = sock.recv(11 - len(data))
            if not chunk:
                break
            data += chunk
    return data


def psql(url: str, sql: str) -> str:
    binary = shutil.which("psql")
    assert binary is not None, "psql is needed to check the PostgreSQL URL"
    result = subprocess.run(
        [binary, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A state dir whose throwaway servers are stopped and purged whatever the test did."""
    state = tmp_path / "state"
    try:
        yield state
    finally:
        if state.exists():
            result = servers("stop", "--state-dir", state, "--purge")
            assert result.returncode == 0, result.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_throwaway_servers_start_answer_are_reused_and_stop(
    state_dir: Path, tmp_path: Path
) -> None:
    env_file = tmp_path / "servers.env"
    standard_before = [port_open(port) for port in (5432, 5672)]
    began = time.monotonic()
    result = servers("ensure", "--state-dir", state_dir, "--env-file", env_file, "--throwaway")
    elapsed = time.monotonic() - began
    assert result.returncode == 0, result.stderr
    print(f"ensure --throwaway took {elapsed:.1f} s\n{result.stderr}")

    settings = parse_exports(result.stdout)
    assert set(settings) == {"GIN_DATABASE_URL", "GIN_AMQP_URL"}
    assert env_file.read_text() == result.stdout
    pg_port = urlsplit(settings["GIN_DATABASE_URL"]).port
    amqp_port = urlsplit(settings["GIN_AMQP_URL"]).port
    assert pg_port is not None
    assert amqp_port is not None
    assert pg_port != 5432
    assert amqp_port != 5672

    assert psql(settings["GIN_DATABASE_URL"], "select 1") == "1"
    frame = amqp_first_frame(amqp_port)
    assert frame[:1] == b"\x01", frame  # a method frame: Connection.Start
    assert frame[7:11] == b"\x00\x0a\x00\x0a", frame  # class 10 (connection), method 10 (start)

    state = json.loads((state_dir / "state.json").read_text())
    epmd_port = state["rabbitmq"]["epmd_port"]
    dist_port = state["rabbitmq"]["dist_port"]
    assert port_open(epmd_port)

    # A second ensure reuses the running servers instead of starting new ones.
    again = servers("ensure", "--state-dir", state_dir, "--throwaway", timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stdout == result.stdout
    assert "reusing" in again.stderr

    # Each test run can have a database of its own.
    module = load_servers()
    admin_url = settings["GIN_DATABASE_URL"]
    db_url = module.create_database(admin_url, "gin_infra_test")
    assert urlsplit(db_url).path == "/gin_infra_test"
    assert psql(db_url, "select current_database()") == "gin_infra_test"
    module.drop_database(admin_url, "gin_infra_test")
    module.drop_database(admin_url, "gin_infra_test")  # absent already: no error
    assert psql(admin_url, "select count(*) from pg_database where datname = 'gin_infra_test'") == (
        "0"
    )

    stopped = servers("stop", "--state-dir", state_dir, timeout=180)
    assert stopped.returncode == 0, stopped.stderr
    for port in (pg_port, amqp_port, dist_port, epmd_port):
        assert wait_closed(port), f"port {port} still open after stop"
    # Servers this script did not start (the machine's own, on the standard ports) still run.
    assert [port_open(port) for port in (5432, 5672)] == standard_before


@pytest.mark.parametrize(
    ("name", "url_template"),
    [
        ("GIN_DATABASE_URL", "postgresql://postgres@127.0.0.1:{port}/postgres"),
        ("GIN_AMQP_URL", "amqp://guest:guest@127.0.0.1:{port}/"),
    ],
)
def test_ensure_fails_clearly_when_a_given_url_does_not_answer(
    tmp_path: Path, name: str, url_template: str
) -> None:
    port = common.free_port()
    env_file = tmp_path / "servers.env"
    state = tmp_path / "state"
    env = clean_env(**{name: url_template.format(port=port)})
    result = servers("ensure", "--state-dir", state, "--env-file", env_file, env=env, timeout=60)
    assert result.returncode != 0
    assert result.stdout == ""
    assert name in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert "error:" in result.stderr
    assert "Traceback" not in result.stderr
    assert not env_file.exists()
    assert not state.exists()  # failed before starting anything


def test_stop_never_touches_a_process_it_did_not_start(tmp_path: Path) -> None:
    """A state file naming someone else's processes: stop leaves them running."""
    stranger = subprocess.Popen(
        ["sleep", "60"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        state = tmp_path / "state"
        state.mkdir()
        pid = stranger.pid
        (state / "state.json").write_text(
            json.dumps(
                {
                    "postgres": {
                        "root": str(state / "pg"),
                        "data_dir": str(state / "pg" / "data"),
                        "port": common.free_port(),
                        "url": "postgresql://postgres@127.0.0.1:1/postgres",
                        "os_user": None,
                        "pid": pid,
                    },
                    "rabbitmq": {
                        "root": str(state / "rabbitmq"),
                        "nodename": "gin-x@localhost",
                        "port": common.free_port(),
                        "dist_port": common.free_port(),
                        "epmd_port": common.free_port(),
                        "url": "amqp://guest:guest@127.0.0.1:1/",
                        "script_pid": pid,
                        "beam_pid": pid,
                        "epmd_pid": pid,
                    },
                }
            )
        )
        result = servers("stop", "--state-dir", state, timeout=60)
        assert result.returncode == 0, result.stderr
        assert stranger.poll() is None, "stop killed a process it did not start"
        assert "no server of ours" in result.stderr
    finally:
        stranger.kill()
        stranger.wait()


def test_stop_without_state_is_a_no_op(tmp_path: Path) -> None:
    result = servers("stop", "--state-dir", tmp_path / "absent", timeout=60)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "absent").exists()


def test_env_files_written_at_once_are_each_whole(tmp_path: Path) -> None:
    # make test's two workers each run `ensure` and write the same env file at about the same
    # time: no writer may fail, and a reader sees one writer's whole text, never a mix.
    write_env_file = load_servers().write_env_file
    path = tmp_path / "servers.env"
    texts = [f"export GIN_DATABASE_URL='postgresql://w{i}'\n" * 200 for i in range(8)]
    seen: set[str] = set()
    with ThreadPoolExecutor(max_workers=len(texts) + 1) as pool:
        writers = [
            pool.submit(lambda t=t: [write_env_file(path, t) for _ in range(50)]) for t in texts
        ]
        while not all(w.done() for w in writers):
            if path.exists():
                seen.add(path.read_text())
        for w in writers:
            w.result()
    seen.add(path.read_text())
    assert seen <= set(texts), "a reader saw a mix of two writes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["servers.env"]
    assert (path.stat().st_mode & 0o777) == 0o644


def hold_ports_in_another_process(count: int) -> tuple[subprocess.Popen[str], list[int]]:
    """A second process that reserves ``count`` ports and keeps them until its stdin closes."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from gin_servers.common import free_ports;"
        "print(*free_ports(int(sys.argv[2])), flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(REPO / "scripts"), str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    return holder, [int(p) for p in holder.stdout.readline().split()]


def test_free_ports_are_outside_the_ephemeral_range_and_distinct() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = common.free_ports(5) + [common.free_port() for _ in range(5)]
    assert len(set(ports)) == 10
    assert all(common.PORT_FLOOR <= p < low for p in ports), ports
    for port in ports:  # each still bindable: reserved, not listened on
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_another_process_reserved_is_never_handed_out() -> None:
    holder, held = hold_ports_in_another_process(3)
    try:
        assert len(held) == 3
        assert common.free_ports(3, preferred=held)[0] not in held  # even when asked for
        mine = common.free_ports(200)
        assert not set(mine) & set(held)
    finally:
        holder.communicate(timeout=30)  # closes its stdin: it exits, and its locks go


def test_a_port_in_use_is_skipped_and_a_free_preferred_one_is_kept() -> None:
    (wanted,) = common.free_ports(1)
    # Asked again for a port this process holds: a restarted server keeps its port.
    assert common.free_ports(1, preferred=[wanted]) == [wanted]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", wanted))
        listener.listen()
        assert common.free_ports(1, preferred=[wanted]) != [wanted]
