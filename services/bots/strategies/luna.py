"""LUNA (hard): reads the table, guesses the opponent's hand and plays for the match.

Every decision starts from what the seat has seen (``knowledge``) and a weighting of the
unseen cards by what the opponent took, threw and declined, and sampled opponent hands weighed
whole by the same evidence: a declined or thrown card rarely melds with the hand, a taken one
does, and the last discard rarely gave much deadwood away (``inference``). Draws compare the
hand's outlook after taking the pile top with its expected outlook after a stock draw
(``outlook``). Discards weigh deadwood (more when the opponent looks close to knocking) and the
chance the next draw helps. What a card would give the opponent's sampled hands has a weight
(``Style.feed``) but counts for nothing: the samples say too poorly which cards feed, and
avoiding them cost her own hand more than it saved (docs/bots.md). A possible knock is played
out against sampled hands, now and after waiting up to a few rounds for gin, a lower knock or
an undercut, in match-winning chances (``knocking``, ``matchplay``).
Gin and big gin are never missed.

Most players knock as soon as they can, so a hand it could have knocked with is unlikely; but
when the last hand's record shows the opponent holding one it did not knock with (a patient
gin hunter), LUNA stops assuming it (``Style.eager_seen_waiting``). Each decision has a time
budget counted in meld searches (``Style.budget``): the same view and seed always make the
same move, and once the budget is spent the samples and rollouts stop growing. A search costs
more on a slower or busier node, so the budget sits well below what the decision-time goal
allows on the machines measured (docs/bots.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from services.bots.strategies.inference import (
    DEVELOP,
    DEVELOP_CAP,
    held_chances,
    opponent_weights,
    sample_hands,
)
from services.bots.strategies.knocking import Stakes, knock_now, waiting
from services.bots.strategies.knowledge import (
    Knowledge,
    NoDecision,
    discard,
    discardable,
    draw_from,
    find,
    knocks,
    match_over,
    my_turn,
    passed_up_a_knock,
    read,
    rematch,
)
from services.bots.strategies.matchplay import win_chance
from services.bots.strategies.outlook import (
    REACH,
    Effort,
    Outlook,
    knock_threat,
    stock_chances,
)
from shared.contracts import commands as c
from shared.contracts.views import TableView
from shared.engine.cards import POINTS


@dataclass(frozen=True, slots=True)
class Style:
    """LUNA's weights and effort (``bench/luna_probe.py`` plays her with other ones)."""

    potential: float = 1.5  # how much the next draw's expected saving counts against deadwood
    feed: float = 0.0  # how much what a discard gives the opponent counts against it
    defense: float = 2.0  # extra weight of deadwood, times the chance the opponent can knock
    take_margin: float = 0.0  # how much better the pile top must be than the stock to take it
    feed_samples: int = 32  # opponent hands sampled to price discards
    knock_samples: int = 96  # opponent hands sampled to price a knock
    knock_choices: int = 3  # knock discards priced (the lowest deadwood ones)
    wait_rounds: int = 3  # how many turns a knock may wait for a better one, gin or undercut
    budget: int = 12_000  # meld searches a decision may make before its samples stop growing
    eager: float = 1.0  # the belief that the opponent knocks as soon as it can ...
    eager_seen_waiting: float = 0.0  # ... once its last hand showed it passing up a knock
    develop: float = DEVELOP  # extra cards drawn and dropped per opponent stock draw ...
    develop_cap: int = DEVELOP_CAP  # ... up to this many


STYLE = Style()

win_chance(0, 0, 100)  # the match table is built once, not during a timed decision


@dataclass
class Mind:
    """What one decision works with: the knowledge, the opponent model and the hand prices."""

    k: Knowledge
    rng: random.Random
    style: Style
    weights: list[float]
    outlook: Outlook
    waited: bool = False  # the opponent's last hand showed it passing up a knock
    sampled: list[int] = field(default_factory=list)

    @property
    def eager(self) -> float:
        """The belief that the opponent knocks as soon as it can, after its last hand."""
        return self.style.eager_seen_waiting if self.waited else self.style.eager

    def opponents(self, count: int) -> list[int]:
        """``count`` sampled opponent hands (the same ones for every question of a decision)."""
        spent = self.outlook.effort.exhausted and self.sampled
        if len(self.sampled) < count and not spent:
            more = count - len(self.sampled)
            self.sampled += sample_hands(
                self.k,
                self.weights,
                self.rng,
                more,
                self.style.develop,
                self.style.develop_cap,
                self.eager,
                self.outlook.effort,
            )
        return self.sampled[:count]


def think(view: TableView, rng: random.Random, style: Style) -> Mind:
    """The knowledge and opponent model of one decision."""
    k = read(view)
    weights = opponent_weights(k)
    held = held_chances(k, weights)
    outlook = Outlook(stock_chances(k.unseen, held), style.potential, Effort(style.budget))
    return Mind(k, rng, style, weights, outlook, passed_up_a_knock(view, k.seat))


def decide(view: TableView, rng: random.Random) -> c.Command:
    """LUNA's move."""
    return play(view, rng, STYLE)


def play(view: TableView, rng: random.Random, style: Style) -> c.Command:
    """LUNA's move with the given weights."""
    if match_over(view):
        return rematch(view)
    hand = my_turn(view)
    mind = think(view, rng, style)
    if hand.phase == "upcard":
        return c.TakeUpcard() if wants_top(mind) else c.PassUpcard()
    if hand.phase == "draw":
        pile = draw_from(view, "discard")
        if pile is not None and wants_top(mind):
            return pile
        stock = draw_from(view, "stock")
        if stock is None:
            raise NoDecision("no draw is legal")
        return stock
    return end_turn(view, mind)


def wants_top(mind: Mind) -> bool:
    """Whether the pile top leaves a better hand than the stock draw is expected to."""
    k, outlook = mind.k, mind.outlook
    top = k.top
    if top is None:
        return False
    if not k.hand & REACH[top] and outlook.taken(k.hand, top) >= outlook.dead(k.hand):
        return False  # it melds with nothing and lowers nothing
    take = outlook.value(outlook.keep(k.hand | 1 << top, 1 << top))
    return take < stock_value(k.hand, outlook) - mind.style.take_margin


def stock_value(hand: int, outlook: Outlook) -> float:
    """The expected value of the hand kept after a stock draw."""
    stay = outlook.value(hand)
    swap = outlook.keep(hand)  # the hand less its best card to throw
    swap_dead = outlook.dead(swap)
    swap_value = outlook.value(swap)
    total = 0.0
    for drawn, p in outlook.draws:
        if hand & REACH[drawn]:
            total += p * outlook.value(outlook.keep(hand | 1 << drawn))
        elif swap_dead + POINTS[drawn] < outlook.dead(hand):
            total += p * (swap_value + POINTS[drawn])  # a low card in for the highest one out
        else:
            total += p * stay
    return total


def discard_costs(mind: Mind, allowed: int) -> dict[int, float]:
    """The price of each allowed discard: the hand it leaves and what it feeds the opponent."""
    opponents = mind.opponents(mind.style.feed_samples)
    return price_discards(mind, allowed, opponents, opponents)


def price_discards(mind: Mind, allowed: int, fed: list[int], threat: list[int]) -> dict[int, float]:
    """Discard prices against ``fed`` (what a discard gives) and ``threat`` (how close the
    opponent is to knocking), two lists of opponent hands (the same ones, but for a probe)."""
    k, outlook = mind.k, mind.outlook
    guard = mind.style.defense * knock_threat(outlook, threat, k.knock_limit)
    costs = {}
    for card in range(52):
        if allowed >> card & 1:
            left = k.hand & ~(1 << card)
            given = outlook.feed(card, fed) if mind.style.feed else 0.0
            costs[card] = outlook.value(left) + guard * outlook.dead(left) + mind.style.feed * given
    return costs


def end_turn(view: TableView, mind: Mind) -> c.Command:
    """Big gin or gin at once; else knock or wait, by the match chances; else discard."""
    big = find(view, c.BigGin)
    if big is not None:
        return big
    options = knocks(view)
    if options and options[0][1] == 0:
        return options[0][2]
    costs = discard_costs(mind, discardable(view))
    if not options:
        return discard(view, min(costs, key=lambda card: (costs[card], card)))
    k = mind.k
    stakes = Stakes(
        mine=k.scores[0],
        theirs=k.scores[1],
        target=k.target,
        gin=view.options.gin_bonus,
        big_gin=view.options.big_gin_bonus,
        undercut=view.options.undercut_bonus,
    )
    opponents = mind.opponents(mind.style.knock_samples)
    priced = [
        (knock_now(stakes, mind.outlook, k.hand, card, opponents), command)
        for card, _, command in options[: mind.style.knock_choices]
    ]
    now, knock = max(priced, key=lambda x: x[0])
    wait_card = min((card for card, _, _ in options), key=lambda card: (costs[card], card))
    rounds = mind.style.wait_rounds
    later = waiting(stakes, mind.outlook, k, wait_card, opponents, mind.rng, rounds, mind.eager)
    return knock if now >= max(later) else discard(view, wait_card)
