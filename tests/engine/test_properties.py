"""Property tests of the engine against independent, obviously-correct references.

The references here share no code with ``shared/engine``: they enumerate every meld a hand
holds and search every disjoint combination (docs/RULES.md R2.1 to R2.4), and every sequence of
layoffs a defender could make (R7.1, R7.2). The engine's fast searches must agree with them on
random hands, on hands where mistakes hide (low cards, few ranks, near-melds), and all through
seeded random matches, where the bookkeeping (R3, R5, R8, R9), ``legal`` and the views
(R11) are checked at every step.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Iterator
from itertools import combinations, pairwise
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.contracts import commands as c
from shared.contracts.events import (
    CardDiscarded,
    CardDrawn,
    HandEnded,
    HandStarted,
    MatchEnded,
    StockLow,
    UpcardTaken,
)
from shared.contracts.options import TableOptions
from shared.engine import (
    GameState,
    IllegalAction,
    Timing,
    apply,
    best_arrangement,
    best_discard,
    best_layoffs,
    deal,
    legal,
    new_game,
    to_act,
    view,
)

# --- an independent model of the cards (docs/RULES.md section 1) ------------------------------

RANK_TEXT = "A23456789TJQK"
SUIT_TEXT = "cdhs"
TEXT_OF = [RANK_TEXT[i % 13] + SUIT_TEXT[i // 13] for i in range(52)]
CARD_OF = {text: i for i, text in enumerate(TEXT_OF)}
ALL_CARDS = frozenset(range(52))


def rank(card: int) -> int:
    return card % 13


def suit(card: int) -> int:
    return card // 13


def value(card: int) -> int:
    """R1.3: A = 1, 2..10 face value, J Q K = 10."""
    return min(rank(card) + 1, 10)


def total(cards: Any) -> int:
    return sum(value(card) for card in cards)


def card_set(texts: Any) -> frozenset[int]:
    return frozenset(CARD_OF[str(t)] for t in texts)


def ref_is_meld(cards: Any) -> bool:
    """R2.1, R2.2, R1.4: a set of 3 or 4 of one rank, or a run of 3+ of one suit, ace low."""
    cards = list(cards)
    if len(cards) < 3 or len(set(cards)) != len(cards):
        return False
    ranks = sorted(rank(x) for x in cards)
    if len({rank(x) for x in cards}) == 1:
        return len(cards) <= 4
    if len({suit(x) for x in cards}) == 1:
        return all(b == a + 1 for a, b in pairwise(ranks))
    return False


def all_melds(cards: frozenset[int]) -> list[frozenset[int]]:
    """Every meld contained in ``cards``: each set of 3 and of 4 of a rank, each run of 3+."""
    melds: list[frozenset[int]] = []
    by_rank: dict[int, list[int]] = {}
    for x in sorted(cards):
        by_rank.setdefault(rank(x), []).append(x)
    for same in by_rank.values():
        for size in (3, 4):
            melds += [frozenset(m) for m in combinations(same, size)]
    for s in range(4):
        for low in range(13):
            run: list[int] = []
            for r in range(low, 13):  # ace (0) low, king (12) high: no wrap
                if s * 13 + r not in cards:
                    break
                run.append(s * 13 + r)
                if len(run) >= 3:
                    melds.append(frozenset(run))
    return melds


@functools.lru_cache(maxsize=500_000)
def ref_deadwood(cards: frozenset[int]) -> int:
    """The lowest deadwood over every combination of disjoint melds of the hand (R2.4)."""
    melds = [(sum(1 << x for x in m), total(m)) for m in all_melds(cards)]
    whole = total(cards)
    best = whole

    def search(start: int, used: int, melded: int) -> None:
        nonlocal best
        best = min(best, whole - melded)
        for i in range(start, len(melds)):
            mask, points = melds[i]
            if not mask & used:
                search(i + 1, used | mask, melded + points)

    search(0, 0, 0)
    return best


def accepts(meld: frozenset[int], card: int) -> bool:
    """R7.1: whether a (possibly already extended) knocker's meld takes this card now."""
    if card in meld:
        return False
    ranks = {rank(x) for x in meld}
    if len(ranks) == 1:  # a set: only the fourth card of a set of three
        return len(meld) == 3 and rank(card) in ranks
    (meld_suit,) = {suit(x) for x in meld}
    # a run: just below its lowest or just above its highest; the ace is never above a king
    return suit(card) == meld_suit and rank(card) in (min(ranks) - 1, max(ranks) + 1)


def reachable_layoffs(
    melds: list[frozenset[int]], defender: frozenset[int]
) -> dict[frozenset[int], tuple[tuple[int, int], ...]]:
    """Every set of defender cards that can be laid off, each with one legal sequence."""
    found: dict[frozenset[int], tuple[tuple[int, int], ...]] = {}
    visited: set[frozenset[tuple[int, int]]] = set()

    def walk(current: tuple[frozenset[int], ...], laid: tuple[tuple[int, int], ...]) -> None:
        key = frozenset(laid)
        if key in visited:
            return
        visited.add(key)
        used = frozenset(card for card, _ in laid)
        found.setdefault(used, laid)
        for card in sorted(defender - used):
            for i, meld in enumerate(current):
                if accepts(meld, card):
                    extended = (*current[:i], meld | {card}, *current[i + 1 :])
                    walk(extended, (*laid, (card, i)))

    walk(tuple(melds), ())
    return found


def ref_layoffs(melds: list[frozenset[int]], defender: frozenset[int]) -> tuple[int, int]:
    """The defender's lowest deadwood after layoffs, and the fewest layoffs that reach it."""
    options = [
        (ref_deadwood(defender - laid), len(laid)) for laid in reachable_layoffs(melds, defender)
    ]
    return min(options)


def check_arrangement(cards: frozenset[int], melds: Any, deadwood: Any, points: int) -> None:
    """Melds are valid, disjoint melds of ``cards``; deadwood is the rest and adds to points."""
    seen: set[int] = set()
    for meld in melds:
        ints = [CARD_OF[str(x)] for x in meld]
        assert ref_is_meld(ints), f"{meld} is not a meld"
        assert not seen & set(ints), f"{meld} shares a card with another meld"
        seen |= set(ints)
    assert seen <= cards, "a meld holds a card not in the hand"
    rest = card_set(deadwood)
    assert rest == cards - seen, "the deadwood is not exactly the unmelded cards"
    assert total(rest) == points


# --- strategies: random hands, and hands where mistakes hide --------------------------------

LOW_CARDS = [s * 13 + r for s in range(4) for r in range(5)]  # ranks A..5


@st.composite
def few_rank_hands(draw: st.DrawFn, max_size: int = 11) -> frozenset[int]:
    """Cards from a window of 2 to 5 neighbouring ranks across all suits: sets and runs cross."""
    width = draw(st.integers(2, 5))
    low = draw(st.integers(0, 13 - width))
    pool = [s * 13 + r for s in range(4) for r in range(low, low + width)]
    return frozenset(draw(st.sets(st.sampled_from(pool), max_size=min(max_size, len(pool)))))


@st.composite
def meld_specs(draw: st.DrawFn) -> frozenset[int]:
    """One valid meld: a set of 3 or 4, or a run of 3 to 7."""
    if draw(st.booleans()):
        r = draw(st.integers(0, 12))
        suits = draw(st.sets(st.integers(0, 3), min_size=3, max_size=4))
        return frozenset(s * 13 + r for s in suits)
    s = draw(st.integers(0, 3))
    length = draw(st.integers(3, 7))
    low = draw(st.integers(0, 13 - length))
    return frozenset(s * 13 + r for r in range(low, low + length))


@st.composite
def near_meld_hands(draw: st.DrawFn, max_size: int = 11) -> frozenset[int]:
    """The union of a few (maybe overlapping) melds, plus a few cards, cut to ``max_size``."""
    cards: set[int] = set()
    for meld in draw(st.lists(meld_specs(), min_size=1, max_size=4)):
        cards |= meld
    cards |= draw(st.sets(st.integers(0, 51), max_size=3))
    ordered = draw(st.permutations(sorted(cards)))
    size = draw(st.integers(0, min(max_size, len(ordered))))
    return frozenset(ordered[:size])


def hands(max_size: int = 11, min_size: int = 0) -> st.SearchStrategy[frozenset[int]]:
    return st.one_of(
        st.frozensets(st.integers(0, 51), max_size=max_size),
        st.frozensets(st.sampled_from(LOW_CARDS), max_size=max_size),
        few_rank_hands(max_size),
        near_meld_hands(max_size),
    ).filter(lambda h: len(h) >= min_size)


@st.composite
def exact_hands(draw: st.DrawFn, size: int) -> frozenset[int]:
    """Exactly ``size`` cards: a hand from ``hands`` topped up with random cards."""
    cards = set(draw(hands(size)))
    extra = draw(st.permutations(sorted(ALL_CARDS - cards)))
    return frozenset(cards | set(extra[: size - len(cards)]))


# Derandomized, so every run checks the same examples. For a deeper search now and then:
# GIN_PROPERTY_EXAMPLES=20000 runs that many random (not derandomized) examples per test.
DEEP = os.environ.get("GIN_PROPERTY_EXAMPLES")
PROPS = settings(
    deadline=None,
    derandomize=DEEP is None,
    database=None,
    max_examples=int(DEEP) if DEEP else 600,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# --- the best arrangement (R2.1 to R2.5) ---------------------------------------------------


def test_reference_sanity() -> None:
    """The reference itself, on the rule book's own examples (R1.4, R2.1, R2.2, section 12)."""

    def parse(text: str) -> frozenset[int]:
        return card_set(text.split())

    assert ref_deadwood(parse("Ah 2h 3h")) == 0
    assert ref_deadwood(parse("Qh Kh Ah")) == 21  # Q-K-A is no run
    assert ref_deadwood(parse("Kh Ah 2h")) == 13
    assert ref_deadwood(parse("8c 8d 8h 8s")) == 0
    assert ref_deadwood(parse("7d 8d 9d Td 4c 4d 4h")) == 0
    # 4d is wanted by the run and by the set: the run wins, 4c 4h Kc are left (18)
    assert ref_deadwood(parse("4d 5d 6d 4c 4h Kc")) == 18
    assert ref_deadwood(parse("4d 5d 6d 4c 4h 4s Kc")) == 10  # 4c 4h 4s and the run
    assert ref_layoffs([parse("8c 8d 8h"), parse("Ah 2h 3h 4h")], parse("8s 5h Kc")) == (10, 2)
    assert ref_layoffs([parse("4h 5h 6h")], parse("7h 8h Kc")) == (10, 2)
    assert ref_layoffs([parse("Jh Qh Kh")], parse("Ah")) == (1, 0)


@pytest.mark.slow
@PROPS
@given(hands())
def test_best_arrangement_matches_exhaustive_reference(cards: frozenset[int]) -> None:
    """R2.4: the engine's deadwood is the true minimum, and its melds really give it."""
    result = best_arrangement(sorted(cards))
    assert result.points == ref_deadwood(cards), sorted(TEXT_OF[x] for x in cards)
    check_arrangement(cards, result.melds, result.deadwood, result.points)
    assert list(result.deadwood) == sorted(result.deadwood), "deadwood in canonical order"
    assert all(list(m) == sorted(m) for m in result.melds), "each meld in canonical order"


@settings(PROPS, max_examples=int(DEEP) if DEEP else 200)
@given(hands().flatmap(lambda h: st.permutations(sorted(h))))
def test_best_arrangement_is_deterministic(shuffled: list[int]) -> None:
    """R2.4: the same cards always give the same arrangement, whatever their order."""
    assert best_arrangement(shuffled) == best_arrangement(sorted(shuffled))


@pytest.mark.slow
@PROPS
@given(exact_hands(11), st.data())
def test_best_discard_matches_reference(cards: frozenset[int], data: st.DataObject) -> None:
    """R2.5, R6.5: the lowest deadwood of the 10 kept; ties to highest value, rank, suit."""
    forbidden = data.draw(st.sampled_from([None, *sorted(cards)]), label="forbidden")
    mask = sum(1 << x for x in cards)
    allowed = sorted(cards - {forbidden})
    card, dead = best_discard(mask, 0 if forbidden is None else 1 << forbidden)
    left = {x: ref_deadwood(cards - {x}) for x in allowed}
    best = min(left.values())
    assert dead == best
    assert int(card) in allowed
    assert left[int(card)] == best
    tied = [x for x in allowed if left[x] == best]
    assert int(card) == max(tied, key=lambda x: (value(x), rank(x), suit(x)))


# --- layoffs (R7.1 to R7.3) -----------------------------------------------------------------


@st.composite
def knocker_melds(draw: st.DrawFn) -> list[frozenset[int]]:
    """Valid disjoint melds a knocker might show: built directly, or a real best arrangement."""
    if draw(st.booleans()):
        melds: list[frozenset[int]] = []
        used: set[int] = set()
        for meld in draw(st.lists(meld_specs(), min_size=1, max_size=4)):
            if not meld & used and len(used | meld) <= 10:
                melds.append(meld)
                used |= meld
        return melds
    hand = draw(near_meld_hands(10).filter(lambda h: len(h) >= 3))
    return [card_set(m) for m in best_arrangement(sorted(hand)).melds]


@st.composite
def knock_cases(draw: st.DrawFn) -> tuple[list[frozenset[int]], frozenset[int]]:
    """Knocker melds and defender cards (disjoint), many of them next to the melds."""
    melds = draw(knocker_melds())
    shown = frozenset().union(*melds)
    near: set[int] = set()
    for meld in melds:
        for x in meld:
            near |= {s * 13 + rank(x) for s in range(4)}  # the same rank
            for step in (-3, -2, -1, 1, 2, 3):  # neighbours in the suit
                if 0 <= rank(x) + step <= 12:
                    near.add(x + step)
    near_pool = sorted(near - shown)
    rest_pool = sorted(ALL_CARDS - shown)
    size = draw(st.integers(0, 11))
    chosen: set[int] = set()
    if near_pool:
        chosen |= draw(st.sets(st.sampled_from(near_pool), max_size=min(size, len(near_pool))))
    if len(chosen) < size:
        others = draw(st.permutations([x for x in rest_pool if x not in chosen]))
        chosen |= set(others[: size - len(chosen)])
    return melds, frozenset(chosen)


@pytest.mark.slow
@PROPS
@given(knock_cases())
def test_best_layoffs_matches_exhaustive_reference(
    case: tuple[list[frozenset[int]], frozenset[int]],
) -> None:
    """R7.1, R7.2: the lowest deadwood after layoffs, reached legally with the fewest layoffs."""
    melds, defender = case
    result = best_layoffs([sorted(m) for m in melds], sorted(defender))
    expected_points, fewest = ref_layoffs(melds, defender)
    where = (
        [[TEXT_OF[x] for x in sorted(m)] for m in melds],
        [TEXT_OF[x] for x in sorted(defender)],
    )
    assert result.points == expected_points, where
    # the laid-off cards form a legal sequence: each can be laid when its turn comes
    current = list(melds)
    laid: set[int] = set()
    for card, index in result.laid_off:
        card = int(card)
        assert card in defender, where
        assert card not in laid, where
        assert 0 <= index < len(current), where
        assert accepts(current[index], card), (where, TEXT_OF[card], index)
        current[index] = current[index] | {card}
        laid.add(card)
    assert len(result.laid_off) == fewest, where
    # the defender's own melds, deadwood and laid-off cards partition the defender's cards
    check_arrangement(defender - laid, result.melds, result.deadwood, result.points)
    assert ref_deadwood(defender - laid) == result.points


# --- seeded random matches (R3 to R11) ------------------------------------------------------

OPTIONS = [
    TableOptions(),
    TableOptions(dealer="loser", target=60),
    TableOptions(dealer="alternate", big_gin=False, target=80),
    TableOptions(oklahoma=True, target=60),
    TableOptions(straight_gin=True, target=25),
    TableOptions(
        gin_bonus=10,
        big_gin_bonus=12,
        undercut_bonus=0,
        box_bonus=5,
        game_bonus=50,
        shutout_bonus=75,
        target=50,
    ),
]
NOT_PLAYED = (c.Resign, c.Leave, c.ClaimAbsence)
STOCK_START = 31


def card_strings(value_: Any) -> Iterator[str]:
    """Every string in a JSON-like value that is a card's text."""
    if isinstance(value_, str):
        if value_ in CARD_OF:
            yield value_
    elif isinstance(value_, list):
        for item in value_:
            yield from card_strings(item)
    elif isinstance(value_, dict):
        for item in value_.values():
            yield from card_strings(item)


def cards_in(obj: Any) -> set[int]:
    return {CARD_OF[t] for t in card_strings(msgspec.to_builtins(obj))}


def mask_cards(mask: int) -> frozenset[int]:
    return frozenset(x for x in range(52) if mask >> x & 1)


class Referee:
    """Plays one seeded match with random players and checks every step independently."""

    def __init__(self, seed: int, options: TableOptions) -> None:
        self.seed = seed
        self.options = options
        self.rng = random.Random(seed)
        self.knock_pref = self.rng.choice([0.3, 0.7, 1.0])
        self.smart_pref = self.rng.choice([0.6, 0.9])
        self.now = 1000.0
        self.log: list[tuple[Any, ...]] = []
        self.events: list[Any] = []
        self.scores = [0, 0]
        self.hands_won = [0, 0]
        self.previous: tuple[int, int | None] | None = None  # (dealer, winner) of the last hand
        self.commands = 0

    # the model of the hand in progress, kept from the commands alone
    def new_hand(self, deck: list[int]) -> None:
        self.deck = deck
        self.stock_left = STOCK_START
        self.known: list[set[int]] = [set(), set()]
        self.pile = [deck[20]]
        self.taken: int | None = None
        self.stock_only = False

    def timing(self) -> Timing:
        self.now += 7.0
        return Timing(now=self.now)

    def play(self) -> GameState:
        state, events = new_game(self.options, self.timing())
        self.events += events
        for _ in range(20_000):
            if state.status != "playing":
                return state
            state = self.deal(state) if state.needs_deal else self.move(state)
            self.check_state(state)
        raise AssertionError("the match did not end")

    def deal(self, state: GameState) -> GameState:
        deck = list(range(52))
        self.rng.shuffle(deck)
        salt = f"salt-{self.seed}-{len(self.log)}"
        lot = self.rng.randrange(2)
        state, events = deal(state, deck, salt, lot, self.timing())
        self.log.append(("deal", deck, salt, lot))
        self.events += events
        self.new_hand(deck)
        (started,) = events
        assert isinstance(started, HandStarted)
        # R3.2, R3.3: who deals and why
        if self.previous is None:
            assert (started.dealer, started.reason) == (lot, "lot")
        else:
            dealer, winner = self.previous
            if winner is None:
                expected = (dealer, "dead_hand_redeal")
            elif self.options.dealer == "winner":
                expected = (winner, "won_previous_hand")
            elif self.options.dealer == "loser":
                expected = (1 - winner, "lost_previous_hand")
            else:
                expected = (1 - dealer, "alternate")
            assert (started.dealer, started.reason) == expected
        # R3.1: one card at a time, the non-dealer first; the 21st card is the upcard
        hand = state.hand
        assert hand is not None
        first = 1 - started.dealer
        assert mask_cards(hand.hands[first]) == frozenset(deck[0:20:2])
        assert mask_cards(hand.hands[started.dealer]) == frozenset(deck[1:20:2])
        assert started.upcard == TEXT_OF[deck[20]]
        assert started.stock_count == STOCK_START
        assert to_act(state) == first  # R4.1
        # R6.0, R9.5: the knock limit
        if self.options.straight_gin:
            limit = 0
        elif self.options.oklahoma:
            limit = 0 if rank(deck[20]) == 0 else value(deck[20])
        else:
            limit = 10
        assert started.knock_limit == hand.knock_limit == limit
        return state

    def choose(self, moves: list[c.Command]) -> c.Command:
        rng = self.rng
        big = [m for m in moves if isinstance(m, c.BigGin)]
        if big and rng.random() < 0.9:
            return big[0]
        knocks = [m for m in moves if isinstance(m, c.Knock)]
        if knocks and rng.random() < self.knock_pref:
            if rng.random() < 0.3:
                return c.Knock()  # the server picks the discard (R6.5)
            return rng.choice(knocks)
        discards = [m for m in moves if isinstance(m, c.Discard)]
        if discards and rng.random() < self.smart_pref:
            return min(
                discards,
                key=lambda m: (ref_deadwood(self.hand_cards - {CARD_OF[m.card]}), rng.random()),
            )
        plain = [m for m in moves if not isinstance(m, c.Knock | c.BigGin)]
        return rng.choice(plain)

    def move(self, state: GameState) -> GameState:
        hand = state.hand
        assert hand is not None
        seat = to_act(state)
        assert seat == hand.to_act
        timing = self.timing()
        self.hand_cards = mask_cards(hand.hands[seat])
        moves = [m for m in legal(state, seat, timing) if not isinstance(m, NOT_PLAYED)]
        self.check_legal(state, seat, moves, timing)
        command = self.choose(moves)
        assert command in moves or (
            command == c.Knock() and any(isinstance(m, c.Knock) for m in moves)
        )
        new, events = apply(state, seat, command, timing)
        self.log.append(("move", seat, command))
        self.events += events
        self.commands += 1
        self.check_events(state, seat, command, events)
        return new

    # --- checks ---------------------------------------------------------------------------

    def check_legal(
        self, state: GameState, seat: int, moves: list[c.Command], timing: Timing
    ) -> None:
        """``legal`` lists exactly what the rules allow, checked against the reference."""
        hand = state.hand
        assert hand is not None
        other = legal(state, 1 - seat, timing)
        assert other == [c.Resign(), c.Leave()], "the waiting seat may only resign or leave"
        with pytest.raises(IllegalAction) as refused:
            apply(state, 1 - seat, c.Draw(source="stock"), timing)
        assert refused.value.code == "not_your_turn"
        if hand.phase == "upcard":
            assert moves == [c.TakeUpcard(), c.PassUpcard()]
            return
        mine = mask_cards(hand.hands[seat])
        if hand.phase == "draw":
            assert len(mine) == 10
            expected = [c.Draw(source="stock")]
            if not self.stock_only and self.pile:
                expected.append(c.Draw(source="discard"))
            assert moves == expected
            return
        assert len(mine) == 11
        allowed = mine - {self.taken} if self.taken is not None else mine
        discards = {CARD_OF[m.card] for m in moves if isinstance(m, c.Discard)}
        assert discards == allowed  # R5.3
        knocks = {CARD_OF[m.card]: m.deadwood for m in moves if isinstance(m, c.Knock)}
        expected_knocks = {
            x: ref_deadwood(mine - {x})
            for x in allowed
            if ref_deadwood(mine - {x}) <= hand.knock_limit
        }
        assert knocks == expected_knocks  # R6.1, R6.2, R6.6
        big_gin = any(isinstance(m, c.BigGin) for m in moves)
        assert big_gin == (self.options.big_gin and ref_deadwood(mine) == 0)  # R6.3
        if self.taken is not None:
            for refused_command in (
                c.Discard(card=TEXT_OF[self.taken]),
                c.Knock(card=TEXT_OF[self.taken]),
            ):
                with pytest.raises(IllegalAction):
                    apply(state, seat, refused_command, timing)

    def check_events(
        self, before: GameState, seat: int, command: c.Command, events: list[Any]
    ) -> None:
        """Public events show no hidden card; the model of the hand follows the command."""
        hand = before.hand
        assert hand is not None
        public_before = set(self.pile) | self.known[0] | self.known[1]
        if isinstance(command, c.TakeUpcard | c.Draw) and not (
            isinstance(command, c.Draw) and command.source == "stock"
        ):
            card = self.pile.pop()
            self.known[seat].add(card)
            self.taken = card
            self.stock_only = False
        elif isinstance(command, c.Draw):
            self.stock_left -= 1
            self.taken = None
            self.stock_only = False
        elif isinstance(command, c.PassUpcard) and hand.upcard_passes == 1:
            self.stock_only = True  # R4.4
        elif isinstance(command, c.Discard):
            card = CARD_OF[command.card]
            self.pile.append(card)
            self.known[seat].discard(card)
            self.taken = None
        ended = [e for e in events if isinstance(e, HandEnded)]
        for event in events:
            if isinstance(event, HandEnded | MatchEnded):
                continue
            leaked = cards_in(event) - public_before - set(self.pile)
            assert not leaked, (event, leaked)
        if isinstance(command, c.Draw) and command.source == "stock":
            drawn = [e for e in events if isinstance(e, CardDrawn)]
            assert len(drawn) == 1
            assert drawn[0].card is None
            assert drawn[0].stock_count == self.stock_left
            low = [e for e in events if isinstance(e, StockLow)]
            assert len(low) == (1 if self.stock_left == 4 else 0)  # R8.3
        if isinstance(command, c.TakeUpcard):
            assert [type(e) for e in events] == [UpcardTaken]
        if isinstance(command, c.Discard):
            assert isinstance(events[0], CardDiscarded)
            dead = self.stock_left <= 2  # R8.1
            assert len(ended) == (1 if dead else 0)
            if dead:
                assert ended[0].how == "dead_hand"
                assert ended[0].winner is None
                assert ended[0].points == 0
        if isinstance(command, c.Knock | c.BigGin):
            assert len(ended) == 1
            self.check_score(before, seat, command, ended[0])
        if ended:
            record = ended[0]
            if record.winner is not None:
                self.scores[record.winner] += record.points
                self.hands_won[record.winner] += 1
            assert record.scores == self.scores
            assert record.hands_won == self.hands_won
            assert record.deck == [TEXT_OF[x] for x in self.deck]  # the reveal
            self.previous = (hand.dealer, record.winner)
        for event in events:
            if isinstance(event, MatchEnded):
                self.check_match_end(event)

    def check_score(
        self, before: GameState, seat: int, command: c.Command, record: HandEnded
    ) -> None:
        """R6.4, R6.5, R7.3 to R7.9 against the references."""
        hand = before.hand
        assert hand is not None
        options = self.options
        mine = mask_cards(hand.hands[seat])
        defender = mask_cards(hand.hands[1 - seat])
        assert record.knocker == seat
        knocker_hand = record.seats[seat]
        defender_hand = record.seats[1 - seat]
        assert knocker_hand.seat == seat
        assert defender_hand.seat == 1 - seat
        if isinstance(command, c.BigGin):
            kept = mine
            assert record.knock_discard is None
            assert ref_deadwood(kept) == 0
        else:
            assert isinstance(command, c.Knock)
            assert record.knock_discard is not None
            discard = CARD_OF[record.knock_discard]
            allowed = mine - {self.taken} if self.taken is not None else mine
            assert discard in allowed
            if command.card is None:  # R6.5: the server's pick
                left = {x: ref_deadwood(mine - {x}) for x in allowed}
                best = min(left.values())
                tied = [x for x in allowed if left[x] == best]
                assert discard == max(tied, key=lambda x: (value(x), rank(x), suit(x)))
                assert record.knock_discard_chosen_by_server
            else:
                assert discard == CARD_OF[command.card]
                assert not record.knock_discard_chosen_by_server
            kept = mine - {discard}
        assert card_set(knocker_hand.cards) == kept
        assert card_set(defender_hand.cards) == defender
        check_arrangement(kept, knocker_hand.melds, knocker_hand.deadwood, knocker_hand.points)
        knocker_points = ref_deadwood(kept)
        assert knocker_hand.points == knocker_points  # R6.4: the best arrangement
        assert knocker_points <= hand.knock_limit
        if knocker_points == 0:  # R7.3, R7.7, R7.8: no layoffs against gin
            big = isinstance(command, c.BigGin)
            defender_points = ref_deadwood(defender)
            check_arrangement(
                defender, defender_hand.melds, defender_hand.deadwood, defender_hand.points
            )
            assert defender_hand.points == defender_points
            assert record.layoffs == []
            assert record.how == ("big_gin" if big else "gin")
            bonus = options.big_gin_bonus if big else options.gin_bonus
            assert (record.winner, record.points) == (seat, bonus + defender_points)
            return
        melds = [card_set(m) for m in knocker_hand.melds]
        defender_points, _ = ref_layoffs(melds, defender)
        assert defender_hand.points == defender_points  # R7.2
        # R7.1, R7.4: each laid-off card, in order, goes on the shown meld its index names
        laid: set[int] = set()
        current = list(melds)
        for layoff in record.layoffs:
            card = CARD_OF[layoff.card]
            assert layoff.by == 1 - seat
            assert card in defender - laid
            assert accepts(current[layoff.meld], card), (layoff, knocker_hand.melds)
            current[layoff.meld] = current[layoff.meld] | {card}
            laid.add(card)
        check_arrangement(
            defender - laid, defender_hand.melds, defender_hand.deadwood, defender_hand.points
        )
        if knocker_points < defender_points:  # R7.5
            expected = ("knock", seat, defender_points - knocker_points)
        else:  # R7.6
            expected = (
                "undercut",
                1 - seat,
                knocker_points - defender_points + options.undercut_bonus,
            )
        assert (record.how, record.winner, record.points) == expected

    def check_match_end(self, ended: MatchEnded) -> None:
        """R9.1, R9.2: the winner reached the target; the tally adds up."""
        assert ended.reason == "target"
        winner = ended.winner
        assert winner is not None
        assert self.scores[winner] >= self.options.target > self.scores[1 - winner]
        for seat_, line in enumerate(ended.tally):
            assert line.points == self.scores[seat_]
            assert line.hands_won == self.hands_won[seat_]
            assert line.box_bonus == self.options.box_bonus * self.hands_won[seat_]
            if seat_ == winner:
                shutout = self.scores[1 - winner] == 0
                game = self.options.shutout_bonus if shutout else self.options.game_bonus
            else:
                game = 0
            assert line.game_bonus == game
            assert line.total == line.points + line.game_bonus + line.box_bonus

    def check_state(self, state: GameState) -> None:
        """Every card once; scores; what each viewer sees (R11)."""
        assert list(state.scores) == self.scores
        assert list(state.hands_won) == self.hands_won
        hand = state.hand
        if hand is None:
            for seat in (None, 0, 1):
                match, hand_view = view(state, seat)
                assert hand_view is None
                assert match.scores == self.scores
            return
        stock = hand.deck[len(hand.deck) - hand.stock_count :]
        assert hand.stock_count == self.stock_left
        assert list(stock) == self.deck[52 - self.stock_left :]
        parts = [
            mask_cards(hand.hands[0]),
            mask_cards(hand.hands[1]),
            frozenset(hand.discard_pile),
            frozenset(stock),
        ]
        assert sum(len(p) for p in parts) == 52
        assert frozenset().union(*parts) == ALL_CARDS
        assert len(hand.discard_pile) == len(set(hand.discard_pile))
        assert list(hand.discard_pile) == self.pile
        known = [self.known[0], self.known[1]]
        timing = Timing(now=self.now)
        for seat in (None, 0, 1):
            match, hand_view = view(state, seat)
            assert hand_view is not None
            allowed = set(self.pile) | known[0] | known[1]
            if seat is not None:
                allowed |= parts[seat]
            assert not cards_in(hand_view) - allowed, seat
            assert [card_set(k) for k in hand_view.known] == known
            assert hand_view.stock_count == self.stock_left
            assert hand_view.discard_pile == [TEXT_OF[x] for x in self.pile]
            if match.last_hand is not None:
                assert match.last_hand.hand < hand.number, "a record of this hand is shown"
            assert not cards_in(msgspec.structs.replace(match, last_hand=None)) - allowed
            if seat is None:
                assert hand_view.my_cards is None
                assert hand_view.my_arrangement is None
                continue
            assert not cards_in(legal(state, seat, timing)) - allowed
            assert card_set(hand_view.my_cards) == parts[seat]
            assert hand_view.opponent_card_count == len(parts[1 - seat])
            assert card_set(hand_view.opponent_known) == known[1 - seat]
            arrangement = hand_view.my_arrangement
            assert arrangement is not None
            mine = parts[seat]
            if len(mine) == 10:  # R2.5
                assert arrangement.discard is None
                assert arrangement.points == ref_deadwood(mine)
                check_arrangement(mine, arrangement.melds, arrangement.deadwood, arrangement.points)
            else:
                assert arrangement.discard is not None
                discard = CARD_OF[arrangement.discard]
                assert discard != self.taken
                kept = mine - {discard}
                allowed_discards = mine - {self.taken} if self.taken is not None else mine
                best = min(ref_deadwood(mine - {x}) for x in allowed_discards)
                assert arrangement.points == ref_deadwood(kept) == best
                check_arrangement(kept, arrangement.melds, arrangement.deadwood, arrangement.points)


SEEDS = range(30)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_random_match_is_consistent(seed: int) -> None:
    """A whole match of random legal play, checked at every step against the references."""
    referee = Referee(seed, OPTIONS[seed % len(OPTIONS)])
    state = referee.play()
    assert state.status == "match_over"
    assert state.result is not None
    assert isinstance(referee.events[-1], MatchEnded)
    assert referee.events[-1] == state.result


def replay(options: TableOptions, log: list[tuple[Any, ...]]) -> tuple[GameState, list[Any]]:
    """Run the same deals and commands again, at the same times."""
    now = 1000.0
    state, events = new_game(options, Timing(now=now + 7.0))
    now += 7.0
    for entry in log:
        now += 7.0
        if entry[0] == "deal":
            _, deck, salt, lot = entry
            state, more = deal(state, deck, salt, lot, Timing(now=now))
        else:
            _, seat, command = entry
            state, more = apply(state, seat, command, Timing(now=now))
        events += more
    return state, events


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 11])
def test_replay_gives_identical_events(seed: int) -> None:
    """R3.5: the same seed and the same commands replay the same match, event for event."""
    options = OPTIONS[seed % len(OPTIONS)]
    first = Referee(seed, options)
    first_state = first.play()
    again = Referee(seed, options)
    again_state = again.play()
    assert again.log == first.log
    encode = msgspec.json.encode
    assert [encode(e) for e in again.events] == [encode(e) for e in first.events]
    replayed_state, replayed = replay(options, first.log)
    assert [encode(e) for e in replayed] == [encode(e) for e in first.events]
    assert encode(replayed_state) == encode(first_state)
    assert encode(again_state) == encode(first_state)


def rigged(non_dealer: str, dealer: str, upcard: str, stock: str) -> list[int]:
    """A deck dealing these hands (one card at a time, non-dealer first), upcard, stock top."""
    first, second = [CARD_OF[x] for x in non_dealer.split()], [CARD_OF[x] for x in dealer.split()]
    top = [CARD_OF[upcard], *(CARD_OF[x] for x in stock.split())]
    deck = [x for pair in zip(first, second, strict=True) for x in pair] + top
    return deck + [x for x in range(52) if x not in deck]


@pytest.mark.parametrize(
    "melds", [None, [["Ad", "Ah", "As"], ["7c", "8c", "9c", "Tc", "Jc"]]], ids=["auto", "sent"]
)
def test_r7_4_layoff_index_names_the_meld_shown(melds: list[list[str]] | None) -> None:
    """R7.4: a layoff's ``meld`` names the knocker's meld it went on, as the record shows it.

    Seat 0 knocks with 7c-Jc and Ad Ah As (3d 4d: 7 points); seat 1 lays off Ac on the aces.
    """
    deck = rigged(
        "7c 8c 9c Tc Jc Ad Ah As 3d 4d", "Ac 2s 5s 6h 8h Th Qd Kd 9s 6s", upcard="Kh", stock="Ks"
    )
    state, _ = new_game(TableOptions(), Timing(now=0))
    state, _ = deal(state, deck, "salt", 1, Timing(now=0))  # seat 1 deals, seat 0 starts
    for seat, command in [(0, c.PassUpcard()), (1, c.PassUpcard()), (0, c.Draw(source="stock"))]:
        state, _ = apply(state, seat, command, Timing(now=0))
    state, events = apply(state, 0, c.Knock(card="Ks", melds=melds), Timing(now=0))
    (record,) = [x for x in events if isinstance(x, HandEnded)]
    assert record.how == "knock"
    assert record.knocker == 0
    assert [(x.card, x.by) for x in record.layoffs] == [("Ac", 1)]
    shown = record.seats[0].melds
    assert sorted(map(sorted, shown)) == sorted(
        [sorted(["7c", "8c", "9c", "Tc", "Jc"]), sorted(["Ad", "Ah", "As"])]
    )
    assert shown[record.layoffs[0].meld] == ["Ad", "Ah", "As"]
