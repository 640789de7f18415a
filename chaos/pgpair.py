"""A PostgreSQL primary and a streaming standby on this machine, as CloudNativePG runs them.

``make chaos-cluster`` fails the primary over to the standby during play and brings the old
primary back as a standby, so this is the production shape in miniature: streaming
replication from a ``pg_basebackup``, ``synchronous_standby_names`` with each node's
``application_name``, ``synchronous_commit = on``, ``wal_log_hints = on`` (what ``pg_rewind``
needs), ``hot_standby = on``, fsync and full page writes on (``servers.PRODUCTION``).

The services reach the primary as they do through CloudNativePG's ``-rw`` Service, by a
multi-host URL with ``target_session_attrs=read-write`` (``admin_url``, ``url_for``): a client
tries each host in turn and keeps the one that accepts writes.

Synchronous (the default) is production's ``dataDurability: required``: both nodes list
``ANY 1 ("a", "b")``, and a node never waits for itself, so whichever is primary waits for
the other. The one standby stays synchronous through a failover: from the promotion until
the old primary has rejoined, every commit on the new primary waits (none is acknowledged,
or visible to other sessions, while it is on one node only). PostgreSQL disarms the
statement timeout before a commit, so nothing but the standby's return (or a client's
cancel, which leaves the commit standing with a WARNING) ends that wait: the services'
requests in flight wait, and the next ones answer 503 once no pool connection is free.
``synchronous=False`` makes the standby asynchronous: a commit is acknowledged before the
standby has it, and a failover can lose it (``CHAOS_SYNC=off``).

Everything lives under ``state_dir`` (or, when the PostgreSQL user cannot reach it, a folder
of its own in the temporary directory) and is deleted by ``stop``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import servers
from servers import LOCALHOST, OWNER_ENV, ServerError

NODES = ("a", "b")
READY_TIMEOUT_S = 60.0
WAL_KEEP = "512MB"  # enough for a rejoining node to stream what it missed, without a slot


def _other(node: str) -> str:
    return "b" if node == "a" else "a"


class PgPair:
    """A primary and a standby on this machine (throwaway, under state_dir), production's way."""

    def __init__(self, state_dir: Path, synchronous: bool = True) -> None:
        """Start both: the primary, then a standby made by ``pg_basebackup`` of it, streaming
        under its own ``application_name``; return once the standby streams (and, when
        ``synchronous``, once the primary counts it as synchronous)."""
        self.state_dir = state_dir.resolve()
        self.synchronous = synchronous
        self.owner = servers.owner_of(self.state_dir)
        self.bindir = servers.pg_bindir(servers.Installer())
        self.os_user: str | None = None
        self.passwd: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            self.passwd = servers.ensure_os_user(servers.PG_OS_USER)
            self.os_user = servers.PG_OS_USER
        self.env = servers.pg_env()
        self.env.pop("PGCONNECT_TIMEOUT")
        self.env[OWNER_ENV] = self.owner
        self.base = self._base_dir()
        self._ports = dict(zip(NODES, servers.free_ports(2), strict=True))
        self._primary = "a"
        self._down: set[str] = set()
        try:
            self._initdb("a")
            self._write_conf("a", standby=False)
            self._start("a")
            self._basebackup("b", source="a")
            self._write_conf("b", standby=True)
            self._start("b")
            self._wait_streaming("b")
        except BaseException:
            self.stop()
            raise

    # -- addresses ------------------------------------------------------------------------

    @property
    def admin_url(self) -> str:
        """A multi-host URL reaching the current primary as superuser, database postgres."""
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        """The multi-host URL of ``database`` on whichever node accepts writes."""
        hosts = ",".join(f"{LOCALHOST}:{port}" for port in self.ports())
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def ports(self) -> list[int]:
        """Both servers' ports, node a's first."""
        return [self._ports[node] for node in NODES]

    def node_url(self, node: str, database: str = "postgres") -> str:
        """One node's own URL (whatever its role)."""
        return f"postgresql://postgres@{LOCALHOST}:{self._ports[node]}/{database}"

    def primary(self) -> str:
        """``"a"`` or ``"b"``: which node is primary now."""
        return self._primary

    # -- faults -----------------------------------------------------------------------------

    def kill_primary(self) -> None:
        """kill -9 of the primary's postmaster and of its backends (a crash of its machine:
        nothing of it is left to flush, finish or answer)."""
        node = self._primary
        pid = self._postmaster(node)
        if pid is None:
            raise ServerError(f"postgres {node}: no postmaster of ours to kill")
        children = _children(pid)
        servers.send_signal(pid, signal.SIGKILL)
        for child in children:
            servers.send_signal(child, signal.SIGKILL)
        if not servers.wait_gone([pid, *children], 10):
            raise ServerError(f"postgres {node}: pid {pid} outlived SIGKILL")
        # Its lock files name a pid that may linger as a zombie (kill(pid, 0) still succeeds
        # then, and a new postmaster would refuse to start): it is gone, so are they.
        (self._data(node) / "postmaster.pid").unlink(missing_ok=True)
        for lock in (self._root(node) / "sock").glob(".s.PGSQL.*"):
            lock.unlink(missing_ok=True)
        self._down.add(node)

    def promote_standby(self) -> None:
        """``pg_ctl promote`` of the standby; return once it accepts writes."""
        node = _other(self._primary)
        self._ctl(node, "promote", "-w", "-t", str(int(READY_TIMEOUT_S)))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self._sql(node, "SELECT pg_is_in_recovery()") != "f":
            if time.monotonic() > deadline:
                raise ServerError(f"postgres {node}: still in recovery after promote")
            time.sleep(0.05)
        self._primary = node
        self._write_conf(node, standby=False)  # its next start is a primary's

    def rejoin_old_primary(self) -> None:
        """The node that is not primary back as its standby: ``pg_rewind`` onto the new
        timeline (a fresh ``pg_basebackup`` when that fails), ``standby.signal`` and
        ``primary_conninfo``, start; return once it streams and, when synchronous, counts
        as the synchronous standby again (commits waiting for it go on then)."""
        node, source = _other(self._primary), self._primary
        pid = self._postmaster(node)
        if pid is not None:  # not killed: a switchover's old primary, shut down cleanly
            servers.send_signal(pid, signal.SIGINT)
            servers.wait_gone([pid], READY_TIMEOUT_S)
        # A promoted node writes its new timeline into pg_control at its first checkpoint;
        # before that, pg_rewind sees one timeline and rewinds nothing.
        self._sql(source, "CHECKPOINT")
        conninfo = f"host={LOCALHOST} port={self._ports[source]} user=postgres dbname=postgres"
        rewind = servers.run(
            servers.as_user(
                self.os_user,
                [
                    str(self.bindir / "pg_rewind"),
                    "-D",
                    str(self._data(node)),
                    f"--source-server={conninfo}",
                ],
            ),
            env=self.env,
            cwd=self._root(node),
            timeout=READY_TIMEOUT_S * 2,
        )
        if rewind.returncode != 0:
            servers.log(
                f"postgres {node}: pg_rewind failed ({servers.output_of(rewind)});"
                " taking a new base backup"
            )
            shutil.rmtree(self._data(node))
            self._basebackup(node, source=source)
        self._write_conf(node, standby=True)
        self._start(node)
        self._down.discard(node)
        self._wait_streaming(node)

    def failover(self) -> None:
        """``kill_primary`` and ``promote_standby`` (the caller rejoins the old primary)."""
        self.kill_primary()
        self.promote_standby()

    def stop(self) -> None:
        """Both stopped (immediate shutdown) and their data deleted (only ours)."""
        for node in NODES:
            pid = self._postmaster(node)
            if pid is not None:
                servers.send_signal(pid, signal.SIGQUIT)
                if not servers.wait_gone([pid], 20):
                    servers.send_signal(pid, signal.SIGKILL)
                    servers.wait_gone([pid], 10)
        for node in NODES:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(self._root(node))
        with contextlib.suppress(OSError):  # left when something else is in it
            self.base.rmdir()

    # -- the parts ----------------------------------------------------------------------------

    def _base_dir(self) -> Path:
        """state_dir/pgpair when the PostgreSQL user can reach it, else a folder in /tmp."""
        base = self.state_dir / "pgpair"
        servers.prepare_dir(base, self.passwd)
        if servers.user_can_write(self.os_user, base):
            return base
        shutil.rmtree(base, ignore_errors=True)
        digest = hashlib.sha256(self.owner.encode()).hexdigest()[:12]
        base = Path(tempfile.gettempdir()) / f"gin-pgpair-{digest}"
        servers.prepare_dir(base, self.passwd)
        return base

    def _root(self, node: str) -> Path:
        return self.base / node

    def _data(self, node: str) -> Path:
        return self._root(node) / "data"

    def _prepare(self, node: str) -> None:
        for sub in ("", "sock", "log"):
            servers.prepare_dir(self._root(node) / sub, self.passwd)

    def _initdb(self, node: str) -> None:
        self._prepare(node)
        shutil.rmtree(self._data(node), ignore_errors=True)
        argv = [str(self.bindir / "initdb"), "-D", str(self._data(node)), "-U", "postgres",
                "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"]  # fmt: skip
        self._must("initdb", node, argv)

    def _basebackup(self, node: str, source: str) -> None:
        self._prepare(node)
        shutil.rmtree(self._data(node), ignore_errors=True)
        argv = [str(self.bindir / "pg_basebackup"), "-D", str(self._data(node)),
                "-h", LOCALHOST, "-p", str(self._ports[source]), "-U", "postgres",
                "-X", "stream", "-c", "fast", "--no-sync"]  # fmt: skip
        self._must("pg_basebackup", node, argv)

    def _write_conf(self, node: str, *, standby: bool) -> None:
        """gin.conf (servers.write_pg_conf) for this node's port and role; standby.signal
        present exactly when it starts as a standby. Written before every start: a base
        backup and pg_rewind copy the other node's files."""
        names = ", ".join(f'"{n}"' for n in NODES)
        conf = {
            **servers.PRODUCTION,
            "wal_level": "replica",
            "wal_log_hints": "on",
            "hot_standby": "on",
            "wal_keep_size": WAL_KEEP,
            "max_wal_senders": "10",
            "cluster_name": node,
            "synchronous_standby_names": f"ANY 1 ({names})" if self.synchronous else "",
        }
        if standby:
            source = self._ports[_other(node)]
            conf["primary_conninfo"] = (
                f"host={LOCALHOST} port={source} user=postgres application_name={node}"
            )
        servers.write_pg_conf(self._data(node), self._root(node), self._ports[node], conf)
        auto = self._data(node) / "postgresql.auto.conf"  # a copied one must not override
        auto.write_text("# Written by chaos/pgpair.py: settings live in gin.conf.\n")
        signal_file = self._data(node) / "standby.signal"
        if standby:
            signal_file.touch()
        else:
            signal_file.unlink(missing_ok=True)
        if self.passwd is not None:
            for path in (auto, self._data(node) / "gin.conf", signal_file):
                if path.exists():
                    os.chown(path, self.passwd.pw_uid, self.passwd.pw_gid)

    def _start(self, node: str) -> None:
        log_file = self._root(node) / "log" / "postgres.log"
        self._ctl(node, "-l", str(log_file), "-w", "-t", str(int(READY_TIMEOUT_S)), "start")

    def _ctl(self, node: str, *args: str) -> None:
        self._must("pg_ctl", node, [str(self.bindir / "pg_ctl"), "-D", str(self._data(node)),
                                    *args])  # fmt: skip

    def _must(self, what: str, node: str, argv: list[str]) -> None:
        result = servers.run(
            servers.as_user(self.os_user, argv),
            env=self.env,
            cwd=self._root(node),
            timeout=READY_TIMEOUT_S * 2,
        )
        if result.returncode != 0:
            log_file = self._root(node) / "log" / "postgres.log"
            raise ServerError(
                f"postgres {node}: {what} failed: {servers.output_of(result)}\n"
                f"--- {log_file} ---\n{servers.tail(log_file)}"
            )

    def _postmaster(self, node: str) -> int | None:
        pid = servers.read_postmaster_pid(self._data(node))
        if servers.owned_by(pid, self.owner, "postgres", str(self._data(node))):
            return pid
        return None

    def _sql(self, node: str, sql: str) -> str:
        result = servers.psql_query(self.node_url(node), sql)
        if result.returncode != 0:
            raise ServerError(f"postgres {node}: {sql}: {servers.output_of(result)}")
        return result.stdout.strip()

    def _wait_streaming(self, standby: str) -> None:
        """Until the primary streams to ``standby`` (as a synchronous standby when the pair
        is synchronous: ``quorum`` under ``ANY 1``)."""
        states = "('quorum', 'sync')" if self.synchronous else "('async', 'quorum', 'sync')"
        sql = (
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = "
            f"'{standby}' AND state = 'streaming' AND sync_state IN {states}"
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self._sql(self._primary, sql) != "1":
            if time.monotonic() > deadline:
                log_file = self._root(standby) / "log" / "postgres.log"
                raise ServerError(
                    f"postgres {standby}: not streaming from {self._primary} after"
                    f" {READY_TIMEOUT_S:.0f} s\n{servers.tail(log_file)}"
                )
            time.sleep(0.05)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a postmaster's backends and helpers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.name))
    return found
