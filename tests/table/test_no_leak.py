"""Who sees what (docs/RULES.md section 11): nothing a spectator or the other seat receives holds a
card hidden from them at that moment, on any channel.

Hidden at a moment: the cards of a seat's hand except those it took from the discard pile
(the view's ``known``), and the stock. Revealed only by that hand's ``hand_ended`` (and the
``/hands/{n}`` record, and the match's ``last_hand``, once the hand is over). Each seat's
cards at each version come from that seat's own view; they are checked against the revealed
deck when the hand ends, so the bookkeeping itself cannot drift.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import msgspec
import pytest

from shared.contracts.names import BOTS_EXCHANGE, COMMANDS_QUEUE, EVENTS_EXCHANGE
from shared.infra.settings import Settings
from tests.table.conftest import ALL_CARDS, Api, Tap, all_events, strings_in

Viewer = str | int  # "public" or a seat number


class Moments:
    """What each viewer may not see, at every version of one table."""

    def __init__(self) -> None:
        self.hidden: dict[int, dict[Viewer, frozenset[str]]] = {}
        self.hand_on: dict[int, int | None] = {}  # version -> the hand being played
        self.event_hidden: dict[int, frozenset[str]] = {}  # seq -> hidden from everyone
        self.event_version: dict[int, int] = {}
        self.revealed: dict[int, dict[str, Any]] = {}  # hand -> its hand_ended data
        self.started: dict[int, dict[str, Any]] = {}  # hand -> its hand_started data
        self.stocks: dict[int, list[tuple[int, frozenset[str]]]] = {}  # hand -> stock seen
        self.dealt: dict[int, tuple[frozenset[str], frozenset[str]]] = {}  # hand -> at deal
        self.last_cards: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
        self.seen: set[str] = set()  # every string sent before any reveal
        self.checked = 0

    # --- recording -----------------------------------------------------------------------

    def record(self, version: int, seats: list[dict[str, Any]], public: dict[str, Any]) -> None:
        """The hidden cards at ``version``, from both seats' views and the public one."""
        for view in (*seats, public):
            assert view["version"] == version
        hand = public["hand"]
        if hand is None:
            assert seats[0]["hand"] is None
            assert seats[1]["hand"] is None
            self.hand_on[version] = None
            self.hidden[version] = {"public": frozenset(), 0: frozenset(), 1: frozenset()}
            return
        mine = [frozenset(view["hand"]["my_cards"]) for view in seats]
        known = [frozenset(k) for k in hand["known"]]
        pile = frozenset(hand["discard_pile"])
        # The views agree with each other and with the counts (the bookkeeping holds).
        assert not mine[0] & mine[1]
        assert not (mine[0] | mine[1]) & pile
        for s in (0, 1):
            assert seats[s]["you"] == s
            assert len(mine[s]) == hand["card_counts"][s] == len(seats[s]["hand"]["my_cards"])
            assert known[s] <= mine[s]
            assert seats[s]["hand"]["opponent_known"] == hand["known"][1 - s]
            assert seats[s]["hand"]["opponent_card_count"] == hand["card_counts"][1 - s]
            for field in ("number", "phase", "to_act", "discard_pile", "stock_count", "known"):
                assert seats[s]["hand"][field] == hand[field]
        assert "my_cards" not in hand
        assert public["legal"] == []
        stock = ALL_CARDS - mine[0] - mine[1] - pile
        assert len(stock) == hand["stock_count"]
        number = hand["number"]
        self.hand_on[version] = number
        self.hidden[version] = {
            "public": (mine[0] - known[0]) | (mine[1] - known[1]) | stock,
            0: (mine[1] - known[1]) | stock,
            1: (mine[0] - known[0]) | stock,
        }
        self.stocks.setdefault(number, []).append((hand["stock_count"], stock))
        if number not in self.dealt:
            assert hand["phase"] == "upcard"
            self.dealt[number] = (mine[0], mine[1])
        self.last_cards[number] = (mine[0], mine[1])

    def record_events(
        self, version: int, events: list[dict[str, Any]], discarded: str | None
    ) -> None:
        """The moment of each event of the command that made ``version``."""
        before = self.hidden.get(version - 1, {}).get("public", frozenset())
        after = self.hidden[version]["public"]
        for envelope in events:
            seq = envelope["seq"]
            self.event_version[seq] = version
            data = envelope["data"]
            if envelope["type"] == "hand_ended":
                # Revealed only once that hand is over.
                assert self.hand_on[version] != data["hand"]
                self.revealed[data["hand"]] = data
                self.event_hidden[seq] = frozenset()
                self.verify_hand(data, discarded)
            elif "hand" in data and self.hand_on[version] != data["hand"]:
                # An event of the hand that this same command ended (the dead hand's discard).
                self.event_hidden[seq] = before - {discarded}
            else:
                self.event_hidden[seq] = after
            if envelope["type"] == "hand_started":
                self.started[data["hand"]] = data

    def verify_hand(self, ended: dict[str, Any], discarded: str | None) -> None:
        """Once a hand is revealed, the cards recorded for it must match its deck (the last
        cards seen, less the knock discard or the dead hand's last discard)."""
        number, deck = ended["hand"], ended["deck"]
        started = self.started[number]
        text = " ".join(deck) + ":" + ended["salt"]
        assert hashlib.sha256(text.encode()).hexdigest() == started["deck_commitment"]
        assert sorted(deck) == sorted(ALL_CARDS)
        dealer = started["dealer"]
        dealt: list[frozenset[str]] = [frozenset(), frozenset()]
        dealt[1 - dealer] = frozenset(deck[0:20:2])
        dealt[dealer] = frozenset(deck[1:20:2])
        assert deck[20] == started["upcard"]
        assert self.dealt[number] == tuple(dealt)
        for count, stock in self.stocks[number]:
            assert stock == frozenset(deck[52 - count :])
        last = self.last_cards[number]
        for seat_hand in ended["seats"]:
            shown = frozenset(seat_hand["cards"])
            extra = last[seat_hand["seat"]] - shown
            assert shown <= last[seat_hand["seat"]]
            assert extra <= {ended["knock_discard"], discarded}
            if ended["how"] == "dead_hand":
                assert discarded in ended["deck"]

    # --- checking --------------------------------------------------------------------------

    def leaks(self, strings: list[str], hidden: frozenset[str]) -> set[str]:
        self.seen.update(strings)
        self.checked += 1
        return {s for s in strings if s in hidden}

    def view_strings(self, view: dict[str, Any]) -> list[str]:
        """A view's strings, without the last finished hand's record (revealed)."""
        view = copy.deepcopy(view)
        match = view.get("match") or {}
        last = match.pop("last_hand", None)
        if last is not None:
            assert self.revealed.get(last["hand"]) == last, "a last_hand before its hand_ended"
            if view["hand"] is not None:
                assert last["hand"] < view["hand"]["number"]
        return list(strings_in(view))

    def check_view(self, view: dict[str, Any], viewer: Viewer, where: str) -> None:
        hidden = self.hidden[view["version"]][viewer]
        leaked = self.leaks(self.view_strings(view), hidden)
        assert not leaked, f"{where}: the view for {viewer} shows {leaked}"

    def check_event(self, envelope: dict[str, Any], where: str) -> None:
        if envelope["type"] == "hand_ended":
            assert envelope["data"] == self.revealed[envelope["data"]["hand"]]
            return
        hidden = self.event_hidden[envelope["seq"]]
        leaked = self.leaks(list(strings_in(envelope)), hidden)
        assert not leaked, f"{where}: event {envelope['seq']} {envelope['type']} shows {leaked}"

    def check_secrets_kept(self) -> None:
        """No deck order or salt of a hand was ever sent outside its reveal."""
        assert self.revealed
        for ended in self.revealed.values():
            assert ended["salt"] not in self.seen


class Socket:
    """A WebSocket read all along (so the server never waits on us); closed on exit."""

    def __init__(self, api: Api, table_id: str, token: str | None) -> None:
        self.api = api
        self.path = f"/v1/tables/{table_id}/ws" + (f"?token={token}" if token else "")
        self.messages: list[dict[str, Any]] = []
        self.ws: Any = None
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Socket:
        self.ws = await self.api.client.ws_connect(self.path)
        self.task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        async for msg in self.ws:
            self.messages.append(json.loads(msg.data))

    def last_seq(self) -> int:
        seqs = [m["event"]["seq"] for m in self.messages if m["kind"] == "event"]
        return max(seqs, default=0)

    async def wait_for_seq(self, seq: int, within_s: float = 15.0) -> None:
        deadline = asyncio.get_running_loop().time() + within_s
        while self.last_seq() < seq:
            assert asyncio.get_running_loop().time() < deadline, f"{self.path}: no seq {seq}"
            await asyncio.sleep(0.02)

    async def __aexit__(self, *_: object) -> None:
        await self.ws.close()
        assert self.task is not None
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def views_at(
    api: Api, table_id: str, tokens: list[str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    seats = [await api.view(table_id, token) for token in tokens]
    return seats, await api.view(table_id)


def choose(rng: random.Random, view: dict[str, Any]) -> dict[str, Any]:
    """A random legal move (never resign, leave or claim): any knock, mostly the SOBRA's
    discard, so that hands end."""
    moves = [m for m in view["legal"] if m["type"] not in ("resign", "leave", "claim_absence")]
    knocks = [m for m in moves if m["type"] in ("knock", "big_gin")]
    if knocks:
        return rng.choice(knocks)
    best = view["hand"] and view["hand"]["my_arrangement"].get("discard")
    if best and rng.random() < 0.8:
        return {"type": "discard", "card": best}
    return rng.choice(moves)


@pytest.mark.parametrize(
    ("seed", "options"),
    [
        (20, {"target": 25}),
        (21, {"target": 25}),
        (22, {"target": 25, "oklahoma": True, "dealer": "alternate"}),
        (23, {"target": 20, "big_gin": False, "dealer": "loser"}),
    ],
    ids=["dead-hand", "undercut", "oklahoma", "loser-deals"],
)
async def test_r11_no_channel_shows_a_hidden_card(
    api: Api, settings: Settings, seed: int, options: dict[str, Any]
) -> None:
    rng = random.Random(seed)
    moments = Moments()
    ana, bia = api.token("Ana"), api.token("Bia")
    tokens = [ana, bia]
    created = await api.create(ana, options)
    table_id = created["table_id"]
    moments.hand_on[1] = None
    moments.hidden[1] = {"public": frozenset(), 0: frozenset(), 1: frozenset()}
    for envelope in await all_events(api, table_id):  # table_created, seat_taken
        moments.event_hidden[envelope["seq"]] = frozenset()
    events_tap = Tap(settings, EVENTS_EXCHANGE, f"table.{table_id}.*")
    bots_tap = Tap(settings, BOTS_EXCHANGE, "#")
    async with (
        events_tap,
        bots_tap,
        Socket(api, table_id, None) as spectator,
        Socket(api, table_id, ana) as ana_socket,
        Socket(api, table_id, bia) as bia_socket,
    ):
        status, joined = await api.call(
            "POST", f"/v1/tables/{table_id}/join", bia, {"invite_code": created["invite_code"]}
        )
        assert status == 200, joined
        seats, public = await views_at(api, table_id, tokens)
        moments.record(joined["version"], seats, public)
        moments.record_events(joined["version"], joined["events"], None)
        logged = await all_events(api, table_id)
        last_seq = logged[-1]["seq"]

        view = seats[0]
        for _ in range(3000):
            if view["status"] != "playing":
                break
            seat = view["hand"]["to_act"]
            move = choose(rng, seats[seat])
            status, result = await api.command(table_id, tokens[seat], **move)
            assert status == 200, (move, result)
            version = result["version"]
            seats, public = await views_at(api, table_id, tokens)
            moments.record(version, seats, public)
            discarded = move.get("card") if move["type"] == "discard" else None
            moments.record_events(version, result["events"], discarded)
            # What the acting seat got back holds nothing hidden from it.
            moments.check_view(result["view"], seat, "command result")
            for envelope in result["events"]:
                moments.check_event(envelope, "command result")
            # The other seat's view, the public view, and the new public events.
            moments.check_view(seats[1 - seat], 1 - seat, "GET with the other seat's token")
            moments.check_view(seats[seat], seat, "GET with the acting seat's token")
            moments.check_view(public, "public", "GET without a token")
            new = await all_events(api, table_id, after=last_seq)
            assert new == result["events"]
            for envelope in new:
                moments.check_event(envelope, "GET events")
            last_seq = new[-1]["seq"]
            # A hand's record exists only once the hand is over.
            if public["hand"] is not None and public["hand"]["phase"] == "upcard":
                number = public["hand"]["number"]
                status, _ = await api.call("GET", f"/v1/tables/{table_id}/hands/{number}")
                assert status == 404
            view = seats[0]
        else:
            raise AssertionError("the match did not end")
        assert view["status"] == "match_over"
        assert moments.revealed, "no hand ended"

        # Every finished hand's public record is its hand_ended, deck and salt included.
        for number, ended in moments.revealed.items():
            status, record = await api.call("GET", f"/v1/tables/{table_id}/hands/{number}")
            assert status == 200
            assert record == ended

        # RabbitMQ: each event as logged, with nothing hidden at its moment.
        by_seq = {e["seq"]: e for e in await all_events(api, table_id)}
        assert list(by_seq) == list(range(1, last_seq + 1))
        published = await events_tap.collect(lambda got: bool(got) and got[-1]["seq"] >= last_seq)
        assert published, "nothing was published"
        assert published[-1]["seq"] == last_seq
        for envelope in published:
            assert envelope == by_seq[envelope["seq"]]
            moments.check_event(envelope, "RabbitMQ gin.events")
        assert {e["seq"] for e in published} >= set(range(3, last_seq + 1))

        # The WebSockets: the spectator's and each seat's.
        for socket, viewer in ((spectator, "public"), (ana_socket, 0), (bia_socket, 1)):
            await socket.wait_for_seq(last_seq)
            assert [m["kind"] for m in socket.messages].count("snapshot") == 1
            for message in socket.messages:
                assert message["kind"] in ("snapshot", "event"), message
                moments.check_view(message["view"], viewer, f"WebSocket of {viewer}")
                if message["kind"] == "event":
                    assert message["event"] == by_seq[message["event"]["seq"]]
                    moments.check_event(message["event"], f"WebSocket of {viewer}")
            if viewer == "public":
                assert all("my_cards" not in (m["view"]["hand"] or {}) for m in socket.messages)

        # Nobody's view went to the bots' exchange: both seats are people.
        bot_turns = [b for b in await bots_tap.drain(0.2) if b.get("table_id") == table_id]
        assert bot_turns == []
    moments.check_secrets_kept()
    assert moments.checked > 100


# --- the bots' exchange -----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def command_queue(settings: Settings) -> AsyncIterator[aio_pika.abc.AbstractExchange]:
    """Publish to ``gin.commands`` as a bot worker would."""
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        yield channel.default_exchange


async def send_as_bot(
    exchange: aio_pika.abc.AbstractExchange,
    settings: Settings,
    table_id: str,
    seat: int,
    move: dict[str, Any],
) -> None:
    body = {
        "table_id": table_id,
        "source": "bot",
        "seat": seat,
        "command": {**move, "command_id": uuid.uuid4().hex},
    }
    await exchange.publish(
        aio_pika.Message(msgspec.json.encode(body), content_type="application/json"),
        routing_key=settings.prefix + COMMANDS_QUEUE,
    )


async def test_r11_4_a_bot_turn_carries_only_the_bot_seats_view(
    api: Api, settings: Settings
) -> None:
    """Play a hand against a bot seat, acting as the bot worker: every bot-turn message on
    ``gin.bots`` is the bot's own view at that version and nothing more."""
    rng = random.Random(5)
    ana = api.token("Ana")
    created = await api.create(ana, {"target": 500})
    table_id = created["table_id"]
    ana_views: dict[int, dict[str, Any]] = {}
    turns: list[dict[str, Any]] = []
    async with (
        Tap(settings, BOTS_EXCHANGE, "bot.tito") as tap,
        command_queue(settings) as commands,
    ):
        status, seated = await api.call(
            "POST", f"/v1/tables/{table_id}/bot", ana, {"level": "tito"}
        )
        assert status == 200, seated
        assert seated["view"]["seats"][1] == {"name": "TITO", "bot": "tito"}
        view = await api.view(table_id, ana)
        ana_views[view["version"]] = view
        last_seq = (await all_events(api, table_id))[-1]["seq"]
        ended: dict[str, Any] | None = None
        for _ in range(200):
            if view["hand"] is None or ended is not None:
                break
            if view["hand"]["to_act"] == 0:
                status, result = await api.command(table_id, ana, **choose(rng, view))
                assert status == 200, result
                events = result["events"]
            else:
                # The bot's turn: its message for exactly this version.
                version = view["version"]

                def mine(turn: dict[str, Any], version: int = version) -> bool:
                    return bool(turn["table_id"] == table_id and turn["version"] == version)

                got = await tap.collect(lambda turns: any(map(mine, turns)), within_s=10)
                turn = next(filter(mine, got))
                turns.append(turn)
                await send_as_bot(commands, settings, table_id, 1, choose(rng, turn["view"]))
                for _ in range(500):  # the queued command is applied asynchronously
                    events = await all_events(api, table_id, after=last_seq)
                    if events:
                        break
                    await asyncio.sleep(0.02)
                else:
                    raise AssertionError("the bot's command was not applied")
            last_seq = events[-1]["seq"]
            view = await api.view(table_id, ana)
            ana_views[view["version"]] = view
            ended = next((e["data"] for e in events if e["type"] == "hand_ended"), None)
        assert ended is not None, "the hand did not end"
        leftover = [t for t in await tap.drain(0.3) if t["table_id"] == table_id]
    assert len(turns) >= 3

    # The revealed deck tells what was hidden from the bot at each of its turns.
    deck = ended["deck"]
    for turn in turns:
        assert turn["seat"] == 1
        assert turn["level"] == "tito"
        bot_view = turn["view"]
        assert bot_view["table_id"] == table_id
        assert bot_view["version"] == turn["version"]
        assert bot_view["you"] == 1
        assert bot_view["hand"]["to_act"] == 1
        assert bot_view["legal"]
        ana_view = ana_views[turn["version"]]
        hand = ana_view["hand"]
        stock = frozenset(deck[52 - hand["stock_count"] :])
        ana_hidden = frozenset(hand["my_cards"]) - frozenset(hand["known"][0])
        bot_cards = ALL_CARDS - frozenset(hand["my_cards"]) - frozenset(hand["discard_pile"])
        bot_cards -= stock
        assert frozenset(bot_view["hand"]["my_cards"]) == bot_cards
        leaked = {s for s in strings_in(turn) if s in ana_hidden | stock}
        assert not leaked, f"the bot's turn at version {turn['version']} shows {leaked}"
        assert ended["salt"] not in set(strings_in(turn))
        # The bot's view is what a person in that seat would see: same public parts as Ana's.
        for field in ("discard_pile", "stock_count", "known", "phase", "to_act"):
            assert bot_view["hand"][field] == hand[field]
        assert bot_view["hand"]["opponent_known"] == hand["known"][0]
    # A turn message only when the bot has a decision, never on Ana's turns.
    for turn in leftover:
        assert turn["view"]["hand"] is None or turn["view"]["hand"]["to_act"] == 1


# --- a command id is not a key to someone else's result --------------------------------------


@pytest.mark.parametrize("who", ["spectator", "opponent"])
async def test_r11_a_reused_command_id_shows_nobody_elses_cards(api: Api, who: str) -> None:
    table_id, ana, bia = await api.table_for_two()
    tokens = [ana, bia]
    seat = (await api.view(table_id))["hand"]["to_act"]
    status, first = await api.command(
        table_id, tokens[seat], type="pass_upcard", command_id="my-own-id"
    )
    assert status == 200, first
    secret = set(first["view"]["hand"]["my_cards"])
    other = api.token("Caio") if who == "spectator" else tokens[1 - seat]
    before = await all_events(api, table_id)
    # The upcard is now offered to the other seat (R4): the same id, their own move.
    status, body = await api.command(table_id, other, type="pass_upcard", command_id="my-own-id")
    leaked = {s for s in strings_in(body) if s in secret}
    assert not leaked, f"the {who} got {leaked} with status {status}"
    if who == "spectator":
        assert status == 403
        assert body["error"]["code"] == "not_seated"
        assert await all_events(api, table_id) == before
    else:  # ids are scoped by who sends them: the opponent's own command, applied
        assert status == 200, body
        assert body["view"]["you"] == 1 - seat
        assert body["version"] == first["version"] + 1
        assert await all_events(api, table_id) != before
