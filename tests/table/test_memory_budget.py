"""A table replica's sockets bounded by its memory (issue 31, part 5): a new WebSocket is closed
at once with 1013 (reason ``memory``) while the memory in use is past ``GIN_MEMORY_FULL_SHARE``
of the limit, the container's or ``GIN_MEMORY_LIMIT_BYTES``; the sockets already open go on,
and once under it a socket is admitted again."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import structlog

from services.table.app import create_app
from services.table.ws import CLOSE_TRY_AGAIN_LATER, MEMORY, TRY_AGAIN_REASON
from shared.infra.memory import MemoryBudget, container_limit, resident_bytes
from shared.infra.settings import Settings
from tests.table.conftest import Api, Clock, SeededShuffle, serving, ws_receive
from tests.table.test_file_budget import refused_count, refused_with, ws_path

MIB = 1 << 20


def cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    return tmp_path


@pytest.mark.parametrize(
    ("files", "limit", "use"),
    [
        ({"memory.max": "536870912", "memory.current": "1"}, 512 * MIB, "memory.current"),
        ({"memory.max": "max", "memory.current": "1"}, None, None),
        (
            {
                "memory/memory.limit_in_bytes": "268435456",
                "memory/memory.usage_in_bytes": "1",
            },
            256 * MIB,
            "memory/memory.usage_in_bytes",
        ),
        ({"memory/memory.limit_in_bytes": "9223372036854771712"}, None, None),  # v1's "none"
        ({}, None, None),  # no memory controller
    ],
)
def test_the_containers_limit_is_read_from_its_cgroup(
    tmp_path: Path, files: dict[str, str], limit: int | None, use: str | None
) -> None:
    found = container_limit(cgroup(tmp_path, files))
    if limit is None:
        assert found is None
    else:
        assert found == (limit, tmp_path / str(use))


def test_the_budget_measures_the_container_against_its_limit(tmp_path: Path) -> None:
    root = cgroup(tmp_path, {"memory.max": "1000", "memory.current": "849"})
    budget = MemoryBudget.of_process(0, 0.85, root)
    assert (budget.limit, budget.ceiling) == (1000, 850)
    assert budget.admits()
    (root / "memory.current").write_text("850\n")
    assert not budget.admits()
    (root / "memory.current").write_text("10\n")
    assert budget.admits()


def test_a_limit_set_here_measures_the_process_and_no_limit_admits_all(tmp_path: Path) -> None:
    mine = resident_bytes()
    assert mine > MIB
    assert not MemoryBudget.of_process(mine // 2, 0.85, tmp_path).admits()
    assert MemoryBudget.of_process(mine * 4, 0.85, tmp_path).admits()
    unlimited = MemoryBudget.of_process(0, 0.85, tmp_path)  # an empty cgroup: no limit
    assert unlimited.ceiling is None
    assert unlimited.admits()


def test_a_refusal_and_its_end_log_one_line_each() -> None:
    used = [0]
    budget = MemoryBudget(100, 0.5, lambda: used[0])
    with structlog.testing.capture_logs() as logs:
        for value in (10, 60, 70, 80, 20, 30):
            used[0] = value
            budget.admits()
    assert [line["event"] for line in logs] == ["memory_past_ceiling", "memory_under_ceiling"]
    assert logs[0]["used_bytes"] == 60
    assert logs[0]["ceiling_bytes"] == 50


async def test_a_socket_past_the_memory_ceiling_is_closed_with_1013_and_the_rest_go_on(
    settings: Settings,
) -> None:
    """The real app under a limit set far above its use; the test then sets the use past the
    ceiling and back."""
    limited = msgspec.structs.replace(settings, memory_limit_bytes=1 << 40)
    app = create_app(limited, clock=Clock(), shuffle=SeededShuffle(7))
    async with serving(app) as client:
        api = Api(client, limited)
        table_id, ana, bia = await api.table_for_two()
        budget = client.app[MEMORY]
        assert budget.ceiling == int((1 << 40) * 0.85)
        first = await client.ws_connect(ws_path(table_id, ana))
        assert (await ws_receive(first))["kind"] == "snapshot"

        budget.used = lambda: 1 << 40  # past the ceiling
        second = await client.ws_connect(ws_path(table_id))
        assert await refused_with(second) == (CLOSE_TRY_AGAIN_LATER, TRY_AGAIN_REASON)
        async with client.get("/metrics") as r:
            text = await r.text()
        assert refused_count(text, "memory") == 1
        assert refused_count(text, "sockets") == 0
        status, _ = await api.call("GET", f"/v1/tables/{table_id}")
        assert status == 200  # plain requests still answer
        assert not first.closed

        budget.used = resident_bytes  # under it again: admitted
        third = await client.ws_connect(ws_path(table_id, bia))
        assert (await ws_receive(third))["kind"] == "snapshot"
        await third.close()
        await first.close()


async def test_a_limit_under_the_process_refuses_every_socket(settings: Settings) -> None:
    small = msgspec.structs.replace(settings, memory_limit_bytes=MIB)
    app = create_app(small, clock=Clock(), shuffle=SeededShuffle(7))
    async with serving(app) as client:
        api = Api(client, small)
        table_id, _, _ = await api.table_for_two()
        ws = await client.ws_connect(ws_path(table_id))
        assert await refused_with(ws) == (CLOSE_TRY_AGAIN_LATER, TRY_AGAIN_REASON)
