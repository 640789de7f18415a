"""The table's outbox relay as a process of its own (GIN_RELAY_APART, services.table.relay):
a replica commits and wakes it; the relay app publishes, in order."""

from __future__ import annotations

from typing import Any

import msgspec

from services.table.app import RELAY, create_relay_app
from shared.contracts.names import BOTS_EXCHANGE, EVENTS_EXCHANGE
from shared.infra.settings import Settings
from tests.table.conftest import Tap, open_api, serving


async def test_a_replica_with_its_relay_apart_publishes_only_through_the_relay_app(
    settings: Settings,
) -> None:
    apart = msgspec.structs.replace(settings, relay_apart=True)
    async with open_api(apart) as api:
        ana = api.token("Ana")
        async with (
            Tap(settings, EVENTS_EXCHANGE, "table.#") as events,
            Tap(settings, BOTS_EXCHANGE, "#") as turns,
        ):
            table_id = (await api.create(ana))["table_id"]
            status, body = await api.call(
                "POST", f"/v1/tables/{table_id}/bot", ana, {"level": "tito"}
            )
            assert status == 200, body
            ours = {table_id}

            def of_ours(bodies: list[Any]) -> list[Any]:
                return [b for b in bodies if b["table_id"] in ours]

            # Committed, and not published: the replica runs no relay of its own.
            assert not of_ours(await events.drain(1.0))
            # The relay app publishes what was committed before it started (its first look)...
            relay_app = create_relay_app(msgspec.structs.replace(apart, relay_poll_s=60.0))
            async with serving(relay_app):
                seen = of_ours(await events.collect(lambda got: len(of_ours(got)) >= 3))
                assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1)), seen
                assert seen[0]["type"] == "table_created"
                assert "seat_taken" in [e["type"] for e in seen]
                assert await turns.collect(lambda got: bool(got)), "no bot turn published"
                # ...and, woken by the replica's NOTIFY (its poll is a minute), each next commit.
                other = (await api.create(ana))["table_id"]
                ours.add(other)
                later = of_ours(
                    await events.collect(lambda got: any(b["table_id"] == other for b in got))
                )
                assert [e["type"] for e in later if e["table_id"] == other] == ["table_created"]
                assert relay_app[RELAY].metrics.published._value.get() >= len(seen) + 1
