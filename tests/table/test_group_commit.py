"""Group commit (issue 16): people's commands on remembered rows, saved many to a statement
(services/table/commits.py). Each is saved as if alone or not at all; a statement PostgreSQL
refuses sends its commands the locked way; one whose connection dies answers them 503, and
each sent again applies once."""

from __future__ import annotations

import asyncio
import contextlib
import doctest
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import asyncpg
import msgspec
import pytest

from services.table import commits
from services.table.http import GROUP_COMMIT
from services.table.ws import HUB
from shared.infra import ops
from shared.infra.ops import REGISTRY
from shared.infra.settings import Settings
from tests.table.conftest import Api, all_events, assert_error, open_api
from tests.table.test_one_statement import ways

TABLES = 6
Answer = tuple[int, Any]


def statements(api: Api) -> tuple[float, float]:
    """Group-commit statements so far, and the changes they carried."""
    registry = api.client.app[REGISTRY]
    count = registry.get_sample_value("gin_group_commit_changes_count") or 0.0
    changes = registry.get_sample_value("gin_group_commit_changes_sum") or 0.0
    return count, changes


class Table:
    """A table of two, played through one replica."""

    def __init__(self, api: Api, table_id: str, tokens: list[str]) -> None:
        self.api = api
        self.table_id = table_id
        self.tokens = tokens
        self.n = 0

    async def next_move(self, api: Api | None = None) -> tuple[str, dict[str, Any], int]:
        """The token of the seat to act, a plain move of its (with a command id of its own),
        and the version it is for."""
        api = api or self.api
        seat = (await api.view(self.table_id))["hand"]["to_act"]
        view = await api.view(self.table_id, self.tokens[seat])
        move = next(m for m in view["legal"] if m["type"] in ("pass_upcard", "draw", "discard"))
        self.n += 1
        return (
            self.tokens[seat],
            {**move, "command_id": f"{self.table_id}-{self.n}"},
            view["version"],
        )

    async def play(self, api: Api | None = None) -> tuple[int, Any]:
        token, move, _ = await self.next_move(api)
        return await (api or self.api).command(self.table_id, token, **move)


async def tables_remembered(api: Api, count: int) -> list[Table]:
    """Tables whose row and both players' deck designs the replica remembers (each player
    moved once): their next commands take the one-statement way."""
    tables = []
    for _ in range(count):
        table_id, ana, bia = await api.table_for_two()
        table = Table(api, table_id, [ana, bia])
        for _ in range(2):
            status, body = await table.play()
            assert status == 200, body
        tables.append(table)
    return tables


@contextlib.asynccontextmanager
async def row_held(settings: Settings, table_id: str) -> AsyncIterator[None]:
    """A transaction of the test's own that holds a table's row lock until the block ends."""
    conn = await asyncpg.connect(
        settings.database_url, server_settings={"search_path": "gin_table"}
    )
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM tables WHERE table_id = $1 FOR UPDATE", table_id)
            yield
    finally:
        await conn.close()


async def waiting_on_locks(settings: Settings, count: int) -> list[int]:
    """The pids of the backends waiting for a lock, once there are ``count``."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            pids: list[int] = [
                r[0]
                for r in await conn.fetch(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ]
            if len(pids) >= count:
                return pids
            assert asyncio.get_running_loop().time() < deadline, "nothing waited for the lock"
            await asyncio.sleep(0.01)
    finally:
        await conn.close()


async def queued(api: Api, attempts: int) -> None:
    """Wait until ``attempts`` commands wait for a group-commit statement."""
    group = api.client.app[GROUP_COMMIT]
    deadline = asyncio.get_running_loop().time() + 10
    while len(group.waiting) < attempts:
        assert asyncio.get_running_loop().time() < deadline, "the commands did not queue"
        await asyncio.sleep(0.01)


@pytest.fixture
def one_statement(settings: Settings) -> Settings:
    """One group-commit statement at a time: those that come while it runs wait together."""
    return msgspec.structs.replace(settings, group_commit_statements=1)


async def together(
    api: Api, settings: Settings, blocker: Table, requests: list[Coroutine[Any, Any, Answer]]
) -> list[asyncio.Future[Answer]]:
    """Send ``requests`` while the blocker's statement waits for its row (one statement at a
    time), so that all of them go in the next statement, together; their answers, once the
    blocker's came."""
    async with row_held(settings, blocker.table_id):
        first = asyncio.ensure_future(blocker.play())
        await waiting_on_locks(settings, 1)
        answers = [asyncio.ensure_future(request) for request in requests]
        await queued(api, len(requests))
    assert (await first)[0] == 200
    return answers


async def assert_log_whole(api: Api, table: Table, version: int) -> None:
    """The table is at ``version`` and its log's seqs run 1..n, each once."""
    assert (await api.view(table.table_id))["version"] == version
    log = await all_events(api, table.table_id)
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))


async def test_commands_at_many_tables_are_saved_together_each_as_if_alone(
    one_statement: Settings,
) -> None:
    async with open_api(one_statement) as api:
        blocker, *tables = await tables_remembered(api, TABLES + 1)
        before_log = {t.table_id: await all_events(api, t.table_id) for t in tables}
        before = statements(api)
        moves = [await t.next_move() for t in tables]
        requests = [
            api.command(t.table_id, token, **move)
            for t, (token, move, _) in zip(tables, moves, strict=True)
        ]
        results = await asyncio.gather(*await together(api, one_statement, blocker, requests))
        count, changes = statements(api)
        assert (count - before[0], changes - before[1]) == (2, TABLES + 1)  # alone, then together
        for table, (_, _, version), (status, body) in zip(tables, moves, results, strict=True):
            assert status == 200, body
            assert body["version"] == version + 1
            await assert_log_whole(api, table, version + 1)
            log = await all_events(api, table.table_id)
            assert log[len(before_log[table.table_id]) :] == body["events"]


async def test_outbox_rows_of_a_statement_keep_each_tables_order(
    one_statement: Settings, db: asyncpg.Connection
) -> None:
    async with open_api(one_statement) as api:
        blocker, *tables = await tables_remembered(api, TABLES + 1)
        answers = await together(api, one_statement, blocker, [t.play() for t in tables])
        assert all(status == 200 for status, _ in await asyncio.gather(*answers))
        for table in tables:
            rows = await db.fetch(
                "SELECT id, body FROM outbox WHERE routing_key LIKE $1 ORDER BY id",
                f"table.{table.table_id}.%",
            )
            seqs = [msgspec.json.decode(r["body"])["seq"] for r in rows]
            assert seqs == list(range(1, len(seqs) + 1))


async def test_a_change_on_a_row_moved_on_elsewhere_is_not_saved_and_the_rest_are(
    one_statement: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move made at replica b leaves a's row of that table behind. The same move sent to a
    (another command id) applies to a's old row, so it goes into a's statement with the
    others: it alone is not saved (its table is at another version), and the locked way then
    refuses it as it always would (the move was made: the turn passed, or the card is drawn).

    a drops a row once the relay's batch tells it of b's commit; here that batch is late (as
    a batch may be, or lost: the feed has no acks), so a still has the old row."""
    async with open_api(one_statement) as a, open_api(one_statement) as b:
        monkeypatch.setattr(a.client.app[HUB], "_forget_stale", lambda *_: None)
        blocker, stale, *tables = await tables_remembered(a, TABLES + 2)
        token, move, version = await stale.next_move(b)
        status, _ = await b.command(stale.table_id, token, **move)
        assert status == 200
        before_ways, before = ways(a), statements(a)
        again = a.command(stale.table_id, token, **{**move, "command_id": "again-at-a"})
        late, *answers = await together(
            a, one_statement, blocker, [again, *(t.play() for t in tables)]
        )
        status, body = await late
        assert status == 409, body  # as the locked way refuses it: the move was made
        assert body["error"]["code"] in ("not_your_turn", "already_drawn"), body
        assert all(status == 200 for status, _ in await asyncio.gather(*answers))
        after_ways, after = ways(a), statements(a)
        assert after_ways["locked"] - before_ways["locked"] == 0  # a refusal counts in neither
        assert after_ways["one_statement"] - before_ways["one_statement"] == TABLES + 1
        assert (after[0] - before[0], after[1] - before[1]) == (2, TABLES + 2)
        await assert_log_whole(a, stale, version + 1)
        status, body = await stale.play(a)  # a reads the row again: the next move applies
        assert status == 200, body
        assert body["version"] == version + 2


async def test_a_statement_postgresql_refuses_sends_each_command_the_locked_way(
    one_statement: Settings,
) -> None:
    """The statement waits for a row past the statement timeout: PostgreSQL cancels it, so it
    wrote nothing, and each of its commands is applied the locked way (the held table's then
    times out too: 503, and sent again it applies once)."""
    settings = msgspec.structs.replace(one_statement, db_statement_timeout_s=1.0)
    async with open_api(settings) as api:
        blocker, held, *tables = await tables_remembered(api, TABLES + 2)
        moves = [await t.next_move() for t in (held, *tables)]
        before_ways = ways(api)
        requests = [
            api.command(t.table_id, token, **move)
            for t, (token, move, _) in zip((held, *tables), moves, strict=True)
        ]
        async with row_held(settings, held.table_id):
            results = await asyncio.gather(*await together(api, settings, blocker, requests))
        held_status, held_body = results[0]
        assert_error(held_status, held_body, 503, "busy", None)
        for table, (_, _, version), (status, body) in zip(
            tables, moves[1:], results[1:], strict=True
        ):
            assert status == 200, body
            await assert_log_whole(api, table, version + 1)
        after_ways = ways(api)
        assert after_ways["locked"] - before_ways["locked"] == TABLES
        assert after_ways["one_statement"] - before_ways["one_statement"] == 1  # the blocker's
        token, move, version = moves[0]
        status, body = await api.command(held.table_id, token, **move)  # sent again
        assert status == 200, body
        await assert_log_whole(api, held, version + 1)


async def test_a_statement_whose_connection_dies_answers_503_and_each_sent_again_applies_once(
    one_statement: Settings,
) -> None:
    """Whether a statement whose connection died committed is not known: each of its
    commands answers 503, and each sent again with its command id applies once."""
    async with open_api(one_statement) as api:
        blocker, held, *tables = await tables_remembered(api, TABLES + 2)
        moves = [await t.next_move() for t in (held, *tables)]
        requests = [
            api.command(t.table_id, token, **move)
            for t, (token, move, _) in zip((held, *tables), moves, strict=True)
        ]
        async with row_held(one_statement, held.table_id):
            answers = await together(api, one_statement, blocker, requests)
            (pid,) = await waiting_on_locks(one_statement, 1)  # the statement of all of them
            conn = await asyncpg.connect(one_statement.database_url)
            try:
                await conn.execute("SELECT pg_terminate_backend($1)", pid)
            finally:
                await conn.close()
            for status, body in await asyncio.gather(*answers):
                assert_error(status, body, 503, "database_unavailable", None)
        for table, (token, move, version) in zip((held, *tables), moves, strict=True):
            status, body = await api.command(table.table_id, token, **move)
            assert status == 200, body
            assert body["version"] == version + 1
            again = await api.command(table.table_id, token, **move)
            assert again == (status, body)  # its first answer, applied once
            await assert_log_whole(api, table, version + 1)


def test_doctests() -> None:
    assert doctest.testmod(commits).failed == 0
    assert doctest.testmod(ops).failed == 0
