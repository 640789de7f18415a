// Cards as the server writes them ("Ah", "Td", "7c") and as the page draws them.

const RANKS = "A23456789TJQK";
const SUITS = "cdhs";
const SUIT_SYMBOL = { c: "♣", d: "♦", h: "♥", s: "♠" };
const SUIT_NAME = { c: "paus", d: "ouros", h: "copas", s: "espadas" };

export function rankOf(card) {
  return card[0].toUpperCase();
}

export function suitOf(card) {
  return card[1].toLowerCase();
}

/** "10♥", "A♠": the card as a person reads it. */
export function label(card) {
  const rank = rankOf(card) === "T" ? "10" : rankOf(card);
  return `${rank}${SUIT_SYMBOL[suitOf(card)]}`;
}

/** "o 7♥", "a Q♦"... simply "o"/"a" is too fussy for a game log: the label alone. */
export function labels(cards) {
  const names = cards.map(label);
  if (names.length <= 1) return names.join("");
  return `${names.slice(0, -1).join(", ")} e ${names[names.length - 1]}`;
}

/** By suit, then rank: the order of a hand not arranged. */
export function bySuit(a, b) {
  const s = SUITS.indexOf(suitOf(a)) - SUITS.indexOf(suitOf(b));
  return s || RANKS.indexOf(rankOf(a)) - RANKS.indexOf(rankOf(b));
}

/** A face-up card. */
export function cardEl(card, extra = {}) {
  const el = document.createElement("div");
  const suit = suitOf(card);
  el.className = `card face suit-${suit}${extra.className ? ` ${extra.className}` : ""}`;
  el.dataset.card = card;
  el.setAttribute("role", extra.button ? "button" : "img");
  el.setAttribute("aria-label", `${label(card)} (${SUIT_NAME[suit]})`);
  const rank = rankOf(card) === "T" ? "10" : rankOf(card);
  const corner = document.createElement("span");
  corner.className = "corner";
  corner.textContent = rank;
  const pip = document.createElement("span");
  pip.className = "pip";
  pip.textContent = SUIT_SYMBOL[suit];
  const small = document.createElement("span");
  small.className = "corner-suit";
  small.textContent = SUIT_SYMBOL[suit];
  el.append(corner, small, pip);
  if (extra.tag) {
    const tag = document.createElement("span");
    tag.className = "tag";
    tag.textContent = extra.tag;
    el.append(tag);
  }
  return el;
}

/** A face-down card. */
export function backEl(className = "") {
  const el = document.createElement("div");
  el.className = `card back${className ? ` ${className}` : ""}`;
  el.setAttribute("aria-hidden", "true");
  return el;
}

/** A row of cards that belong together (a meld, the deadwood). */
export function groupEl(cards, { className = "", title = "", make = cardEl } = {}) {
  const el = document.createElement("div");
  el.className = `group${className ? ` ${className}` : ""}`;
  if (title) {
    const t = document.createElement("div");
    t.className = "group-title";
    t.textContent = title;
    el.append(t);
  }
  const row = document.createElement("div");
  row.className = "group-cards";
  for (const card of cards) row.append(make(card));
  el.append(row);
  return el;
}
