"""The bot strategies (issue 4): legal moves only, seeded replays, the view and nothing else.

Positions come from real seeded games between the strategies, under the default rules and
under the table options that change the knock limit (Oklahoma, straight gin).
"""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from services.bots import tournament
from services.bots.strategies import (
    STRATEGIES,
    NoDecision,
    carmen,
    hunter,
    knowledge,
    load,
    luna,
    tito,
)
from services.bots.strategies.knowledge import read
from shared.contracts import commands as c
from shared.contracts.events import AnyEvent, MatchEnded, Player
from shared.contracts.options import TableOptions
from shared.contracts.views import TableView
from shared.engine import Timing, apply, deal, new_game, to_act
from shared.engine.cards import BY_TEXT
from shared.engine.melds import best_arrangement
from shared.engine.state import GameState
from shared.engine.view import seat_table_view

T0 = Timing(now=0.0)
STRATEGY_DIR = Path(__file__).resolve().parents[2] / "services" / "bots" / "strategies"
QUITS = (c.Resign, c.Leave, c.DeclineRematch, c.ClaimAbsence)


def seat_view(state: GameState, seat: int, version: int = 0) -> TableView:
    """Exactly the view a bot in ``seat`` gets."""
    return seat_table_view(
        state,
        seat,
        T0,
        table_id="test-table",
        version=version,
        status=state.status,
        seats=[Player(name="zero"), Player(name="one")],
        options=state.options,
    )


def play_match(
    names: tuple[str, str],
    seed: int,
    options: TableOptions,
    views: list[TableView] | None = None,
    seat_only: int | None = None,
) -> tuple[GameState, list[AnyEvent], list[c.Command]]:
    """A whole seeded match between two levels or module callables (``load``); every view of
    the seat to act (of ``seat_only``, if given) is kept in ``views``."""
    players = (load(names[0]), load(names[1]))
    deals = random.Random(seed)
    state, events = new_game(options, T0)
    commands: list[c.Command] = []
    version = 0
    while state.status == "playing":
        version += 1
        if state.needs_deal:
            deck = list(range(52))
            deals.shuffle(deck)
            state, new = deal(state, deck, "salt", deals.randrange(2), T0)
        else:
            seat = to_act(state)
            assert seat is not None
            view = seat_view(state, seat, version)
            if views is not None and seat_only in (None, seat):
                views.append(view)
            command = players[seat](view, random.Random(f"{seed}:{version}"))
            commands.append(command)
            state, new = apply(state, seat, command, T0)
        events += new
    return state, events, commands


@pytest.fixture(scope="module")
def positions() -> list[TableView]:
    """Views from seeded games: every phase, stock-only draws, knocks, other knock limits."""
    views: list[TableView] = []
    games = [
        (("luna", "carmen"), 1, TableOptions(target=60)),
        (("tito", "luna"), 2, TableOptions(target=40, oklahoma=True)),
        (("carmen", "tito"), 3, TableOptions()),
        (("tito", "carmen"), 4, TableOptions(target=30, straight_gin=True)),
    ]
    for names, seed, options in games:
        state, _, _ = play_match(names, seed, options, views)
        views += [seat_view(state, 0), seat_view(state, 1)]
    return views


def _sample(views: list[TableView], count: int) -> list[TableView]:
    return random.Random(0).sample(views, min(count, len(views)))


def _kinds(views: list[TableView]) -> Iterator[str]:
    for view in views:
        hand = view.hand
        if view.status == "match_over":
            yield "match_over"
        elif hand is not None:
            yield hand.phase
            if hand.stock_only:
                yield "stock_only"
            moves = view.legal
            if any(isinstance(m, c.Knock) for m in moves):
                yield "knock"
            if hand.phase == "discard" and sum(isinstance(m, c.Discard) for m in moves) == 10:
                yield "after_taking"
            if hand.knock_limit != 10:
                yield "other_limit"


def test_positions_cover_every_kind_of_decision(positions: list[TableView]) -> None:
    kinds = set(_kinds(positions))
    expected = {"upcard", "draw", "discard", "stock_only", "knock", "after_taking"}
    assert expected | {"match_over", "other_limit"} <= kinds


@pytest.mark.parametrize("name", ["tito", "carmen", "luna"])
def test_strategy_only_returns_a_legal_move(name: str, positions: list[TableView]) -> None:
    decide = STRATEGIES[name]
    views = positions
    if name == "luna":  # every knock decision, and a sample of the rest
        knocks = [v for v in positions if any(isinstance(m, c.Knock) for m in v.legal)]
        views = knocks + _sample(positions, 120)
    for i, view in enumerate(views):
        move = decide(view, random.Random(i))
        assert move in view.legal, (name, view.hand, move)
        assert not isinstance(move, QUITS)


@pytest.mark.parametrize("name", ["tito", "carmen", "luna"])
def test_match_over_asks_for_a_rematch_once(name: str) -> None:
    state, _, _ = play_match(("carmen", "tito"), 5, TableOptions(target=20))
    assert state.status == "match_over"
    assert STRATEGIES[name](seat_view(state, 0), random.Random(0)) == c.Rematch()
    state, _ = apply(state, 0, c.Rematch(), T0)
    with pytest.raises(NoDecision):
        STRATEGIES[name](seat_view(state, 0), random.Random(0))


@pytest.mark.parametrize("names", [("tito", "carmen"), ("luna", "tito"), ("carmen", "luna")])
def test_bots_play_a_hollywood_match_to_its_end(names: tuple[str, str]) -> None:
    """R9.6 to R9.11: every bot keeps playing a Hollywood table, through the engine, until
    all three games have closed (each move goes through ``apply``, which refuses any other)."""
    views: list[TableView] = []
    options = TableOptions(hollywood=True, target=40)
    state, events, _ = play_match(names, 7, options, views)
    assert state.status == "match_over"
    assert state.result is not None
    assert state.result.reason == "target"
    assert [game.closed for game in state.games] == [True, True, True]
    assert all(v.match is not None and v.match.games is not None for v in views)
    assert any(isinstance(e, MatchEnded) and e.games is not None for e in events)
    name = names[0]
    assert STRATEGIES[name](seat_view(state, 0), random.Random(0)) == c.Rematch()


def test_a_bot_weighs_the_first_open_hollywood_game() -> None:
    """At a Hollywood table a bot's scores are those of the first game still open."""
    options = TableOptions(hollywood=True, target=40)
    views: list[TableView] = []
    play_match(("luna", "carmen"), 3, options, views)
    later = next(
        v
        for v in views
        if v.match is not None and v.match.games and v.match.games[0].closed and v.hand
    )
    assert later.match is not None
    assert later.match.games is not None
    assert later.you is not None
    game = next(g for g in later.match.games if not g.closed)
    k = knowledge.read(later)
    assert k.scores == (game.scores[later.you], game.scores[1 - later.you])


@pytest.mark.parametrize("name", ["tito", "carmen", "luna"])
def test_nothing_to_decide_on_the_opponents_turn(name: str, positions: list[TableView]) -> None:
    view = next(v for v in positions if v.hand is not None)
    other = seat_view_of_other(view)
    with pytest.raises(NoDecision):
        STRATEGIES[name](other, random.Random(0))


def seat_view_of_other(view: TableView) -> TableView:
    """The same view, as if it were the other seat's turn (only resign and leave are legal)."""
    assert view.hand is not None
    assert view.you is not None
    hand = msgspec.structs.replace(view.hand, to_act=1 - view.you)
    return msgspec.structs.replace(view, hand=hand, legal=[c.Resign(), c.Leave()])


@pytest.mark.parametrize("names", [("luna", "carmen"), ("tito", "luna")])
def test_seeded_match_replays_identically(names: tuple[str, str]) -> None:
    options = TableOptions(target=50)
    first = play_match(names, 11, options)
    second = play_match(names, 11, options)
    assert first[2] == second[2]
    assert msgspec.json.encode(first[1]) == msgspec.json.encode(second[1])


@pytest.mark.parametrize("name", ["tito", "carmen", "luna"])
def test_decision_is_a_function_of_the_view_alone(name: str, positions: list[TableView]) -> None:
    """The same view, also one rebuilt from its JSON (as a worker gets it), and the same
    seed give the same move, whatever the global random state."""
    decide = STRATEGIES[name]
    for i, view in enumerate(_sample(positions, 40)):
        random.seed(i)
        move = decide(view, random.Random(i))
        rebuilt = msgspec.json.decode(msgspec.json.encode(view), type=TableView)
        random.seed(i + 1000)
        assert decide(rebuilt, random.Random(i)) == move
        assert decide(view, random.Random(i)) == move


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize("path", sorted(STRATEGY_DIR.glob("*.py")), ids=lambda p: p.name)
def test_strategy_modules_cannot_reach_the_state(path: Path) -> None:
    """No strategy module imports the engine's state, its state machine, the table service,
    or anything with a clock or I/O."""
    forbidden = ("shared.engine.state", "shared.engine.game", "services.table", "shared.infra")
    impure = {"time", "datetime", "os", "socket", "asyncio", "aio_pika", "asyncpg"}
    for name in _imports(path):
        assert not name.startswith(forbidden), (path.name, name)
        assert name.split(".")[0] not in impure, (path.name, name)
        assert name not in ("shared.engine.GameState", "shared.engine.HandState"), name


def test_tito_never_breaks_a_meld_while_holding_an_unmatched_card(
    positions: list[TableView],
) -> None:
    for i, view in enumerate(positions):
        if view.hand is None or view.hand.phase != "discard" or view.hand.my_cards is None:
            continue
        move = tito.decide(view, random.Random(i))
        if not isinstance(move, c.Discard):
            continue
        allowed = {m.card for m in view.legal if isinstance(m, c.Discard)}
        cards = [BY_TEXT[t] for t in view.hand.my_cards]
        unmatched = {str(x) for x in best_arrangement(cards).deadwood} & allowed
        assert not unmatched or move.card in unmatched, (view.hand.my_cards, move)


def test_carmen_knocks_at_the_first_chance(positions: list[TableView]) -> None:
    for view in positions:
        knocks = [m for m in view.legal if isinstance(m, c.Knock)]
        if knocks:
            move = carmen.decide(view, random.Random(0))
            lowest = min(k.deadwood or 0 for k in knocks)
            assert isinstance(move, c.BigGin) or (
                isinstance(move, c.Knock) and move.deadwood == lowest
            )


def test_luna_never_misses_gin(positions: list[TableView]) -> None:
    for view in positions:
        gin = [m for m in view.legal if isinstance(m, c.Knock) and m.deadwood == 0]
        if gin:
            move = luna.decide(view, random.Random(0))
            assert isinstance(move, c.BigGin) or (isinstance(move, c.Knock) and move.deadwood == 0)


def test_load_takes_a_level_or_module_callable() -> None:
    assert load("luna") is luna.decide
    assert load("services.bots.strategies.tito:decide") is tito.decide
    with pytest.raises(ValueError, match="unknown strategy"):
        load("nobody")
    with pytest.raises(AttributeError):
        load("services.bots.strategies.tito:nothing")


def test_small_tournament_prints_one_consistent_json_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tito_spec = "services.bots.strategies.tito:decide"
    tournament.main(["--a", tito_spec, "--b", "carmen", "--matches", "4", "--seed", "7"])
    out = capsys.readouterr()
    result = json.loads(out.out.strip().splitlines()[-1])
    assert "matches" in out.err
    assert (result["a"], result["b"]) == (tito_spec, "carmen")
    assert result["matches"] == 4
    assert result["a_wins"] + result["b_wins"] == 4
    assert 0 <= result["ci95"][0] <= result["a_win_rate"] <= result["ci95"][1] <= 1
    for field in ("points_per_hand", "gins", "undercuts", "decision_ms", "decision_cpu_ms"):
        assert set(result[field]) == {"a", "b"}
    for label in ("a", "b"):
        assert set(result["decision_ms"][label]) >= {"p50", "p99"}
        assert set(result["decision_cpu_ms"][label]) >= {"p50", "p99"}
    assert result["target"] == 100
    assert isinstance(result["dead_hands"], int)


def test_mirrored_pairs_share_their_decks_and_swap_seats() -> None:
    first, second = tournament.play_pair((("carmen", "tito"), 3, 0, 2))
    assert first.pair == second.pair == 0
    assert tournament.deck_for(3, 0, 0) == tournament.deck_for(3, 0, 0)
    assert tournament.deck_for(3, 0, 0) != tournament.deck_for(3, 1, 0)
    assert {first.winner, second.winner} <= {"a", "b"}
    assert len(first.decision_s["a"]) > 0
    assert len(second.decision_s["b"]) > 0


def test_wilson_interval() -> None:
    low, high = tournament.wilson(60, 100)
    assert low == pytest.approx(0.5020, abs=1e-4)
    assert high == pytest.approx(0.6906, abs=1e-4)


def pairs_of(*wins_in_pair: int) -> list[tournament.MatchResult]:
    """Mirrored pairs with the given count of the first strategy's wins (0, 1 or 2) each."""
    return [
        tournament.MatchResult(pair=pair, winner="a" if match < wins else "b")
        for pair, wins in enumerate(wins_in_pair)
        for match in range(2)
    ]


def test_a_pairs_matches_that_go_together_widen_the_interval() -> None:
    # 60 pairs won twice, 40 lost twice: by hand, the variance over pairs is 100/99 * 96 / 200^2
    # against the binomial 0.24 / 200, an effect of 2.0202, so 200 matches count as 99.
    low, high, effect = tournament.paired_interval(pairs_of(*[2] * 60, *[0] * 40))
    assert effect == pytest.approx(2.0202, abs=1e-4)
    # Wilson's interval of the rate 0.6 at 99 matches, by hand; at 200 it would be narrower.
    assert low == pytest.approx(0.50151, abs=1e-5)
    assert high == pytest.approx(0.69102, abs=1e-5)
    independent = tournament.wilson(120, 200)
    assert low < independent[0]
    assert high > independent[1]


def test_pairs_that_split_narrow_it_and_an_even_split_keeps_wilsons() -> None:
    mostly_split = pairs_of(*[1] * 80, *[2] * 20)  # 120 wins of 200, fewer extremes than chance
    low, high, effect = tournament.paired_interval(mostly_split)
    assert effect < 1
    assert high - low < tournament.wilson(120, 200)[1] - tournament.wilson(120, 200)[0]
    every_pair_split = pairs_of(*[1] * 50)
    low, high, effect = tournament.paired_interval(every_pair_split)
    assert effect == 0
    assert (low, high) == tournament.wilson(50, 100)


def test_the_tournaments_interval_is_the_paired_one() -> None:
    results = pairs_of(*[2] * 30, *[0] * 10)
    result = tournament.summarize(("a", "b"), results)
    low, high, effect = tournament.paired_interval(results)
    assert result["ci95"] == [round(low, 4), round(high, 4)]
    assert result["design_effect"] == round(effect, 3) > 1


def test_the_gin_hunter_only_returns_a_legal_move(positions: list[TableView]) -> None:
    """The second yardstick (issue 35) plays the views every level plays."""
    for i, view in enumerate(positions):
        move = hunter.decide(view, random.Random(i))
        assert move in view.legal, (view.hand, move)
        assert not isinstance(move, QUITS)


def test_the_gin_hunter_takes_the_pile_top_only_into_a_meld(positions: list[TableView]) -> None:
    taking = 0
    for view in positions:
        if view.hand is None or view.hand.phase not in ("upcard", "draw"):
            continue
        move = hunter.decide(view, random.Random(0))
        took = isinstance(move, c.TakeUpcard) or (
            isinstance(move, c.Draw) and move.source == "discard"
        )
        k = read(view)
        assert took == (
            k.top is not None
            and hunter.melds_with(k.hand, k.top)
            and any(
                isinstance(m, c.TakeUpcard) or (isinstance(m, c.Draw) and m.source == "discard")
                for m in view.legal
            )
        ), (view.hand, move)
        taking += took
    assert taking  # the positions hold such takes


def test_the_gin_hunter_knocks_early_and_later_plays_for_gin(positions: list[TableView]) -> None:
    early = late = 0
    for view in positions:
        knocks = [m for m in view.legal if isinstance(m, c.Knock) and m.deadwood]
        if not knocks or any(isinstance(m, c.Knock) and m.deadwood == 0 for m in view.legal):
            continue
        move = hunter.decide(view, random.Random(0))
        if hunter.my_turns(read(view)) <= hunter.KNOCK_TURNS:
            early += 1
            assert isinstance(move, c.Knock), (view.hand, move)
        else:
            late += 1
            assert isinstance(move, c.Discard), (view.hand, move)
    assert early  # both kinds of position were met
    assert late


def _views_of(seat_name: str, opponent: str, seed: int, options: TableOptions) -> list[TableView]:
    """Every view ``seat_name`` decided on in a seeded match against ``opponent`` (seat 0)."""
    views: list[TableView] = []
    play_match((seat_name, opponent), seed, options, views, seat_only=0)
    return views


HUNTER = "services.bots.strategies.hunter:decide"
SIMPLE = "services.bots.strategies.simple:decide"


def test_luna_sees_a_patient_opponent_pass_up_a_knock_in_the_last_hand() -> None:
    """Issue 35: the last hand's record (R7.4) shows a gin hunter holding a hand it could
    have knocked with when LUNA ended the hand; an eager knocker never shows one."""
    seen = 0
    for seed in (1, 2, 3):
        for view in _views_of("luna", HUNTER, seed, TableOptions()):
            if not knowledge.passed_up_a_knock(view, 0):
                continue
            seen += 1
            last = view.match.last_hand if view.match else None
            assert last is not None
            assert last.how == "dead_hand" or 0 in (last.knocker, last.winner)
            [theirs] = [s for s in last.seats if s.seat == 1]
            assert best_arrangement(BY_TEXT[t] for t in theirs.cards).points <= 10
    assert seen
    for name in (SIMPLE, "carmen"):
        for seed in (1, 2):
            views = _views_of("luna", name, seed, TableOptions())
            assert not any(knowledge.passed_up_a_knock(v, 0) for v in views)


def _knock_choices(positions: list[TableView]) -> list[TableView]:
    """Views where LUNA weighs a knock against waiting (her heaviest decisions)."""
    return [
        v
        for v in positions
        if any(isinstance(m, c.Knock) and m.deadwood for m in v.legal)
        and not any(isinstance(m, c.Knock) and m.deadwood == 0 for m in v.legal)
    ]


def test_luna_decision_work_stops_growing_at_its_budget(positions: list[TableView]) -> None:
    """Issue 35: a decision's meld searches are its time budget; once spent, its samples and
    rollouts stop growing, and the same view and seed still make the same move."""
    knocks = _knock_choices(positions)
    assert knocks
    small, free = luna.Style(budget=300), luna.Style(budget=1 << 40)
    for i, view in enumerate(knocks[:12]):
        tight = luna.think(view, random.Random(i), small)
        move = luna.end_turn(view, tight)
        full = luna.think(view, random.Random(i), free)
        luna.end_turn(view, full)
        assert move in view.legal
        assert tight.outlook.effort.exhausted
        assert len(tight.sampled) < len(full.sampled)
        assert tight.outlook.effort.spent < full.outlook.effort.spent
        again = luna.think(view, random.Random(i), small)
        assert luna.end_turn(view, again) == move
        assert again.outlook.effort.spent == tight.outlook.effort.spent
