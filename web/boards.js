// The end-of-hand board and the match-end board, drawn from the server's records
// (hand_ended and match_ended events, or the view's match.last_hand and match.result).

import { cardEl, groupEl, label, labels } from "./cards.js";
import { gameColumns, hollywoodEnding, hollywoodTally, scoredInText } from "./sheet.js";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

const HOW = {
  knock: (k) => `${k} bateu.`,
  gin: (k) => `${k} fez GIN!`,
  big_gin: (k) => `${k} fez BIG GIN!`,
  undercut: (k) => `${k} bateu, mas levou undercut.`,
  dead_hand: () => "O monte chegou a 2 cartas: a mão empatou, ninguém pontua.",
  abandoned: () => "A mão foi interrompida.",
};

/** The sentence saying who laid off what, on whose melds (R7.4), or null without layoffs. */
export function layoffSentence(record, names) {
  if (!record.layoffs.length || record.knocker === null || record.knocker === undefined) return null;
  const bySeat = new Map();
  for (const layoff of record.layoffs) {
    if (!bySeat.has(layoff.by)) bySeat.set(layoff.by, []);
    bySeat.get(layoff.by).push(layoff.card);
  }
  return [...bySeat]
    .map(([by, cards]) => `${names[by]} ajuntou ${labels(cards)} aos jogos de ${names[record.knocker]}.`)
    .join(" ");
}

/** One seat's hand laid out: its melds (the knocker's with the cards laid off on them, each
 * with a gold border and AJUNTOU), then its deadwood. */
function seatHand(record, seat, names) {
  const hand = record.seats.find((s) => s.seat === seat);
  const box = el("div", "board-seat");
  box.dataset.seat = String(seat);
  const who = record.knocker === seat ? " (bateu)" : "";
  box.append(el("div", "board-seat-name", `${names[seat]}${who}`));
  if (!hand) return box;
  const row = el("div", "board-groups");
  hand.melds.forEach((meld, index) => {
    const laid =
      record.knocker === seat ? record.layoffs.filter((x) => x.meld === index).map((x) => x.card) : [];
    const group = groupEl(meld, { className: "meld" });
    const cards = group.querySelector(".group-cards");
    for (const card of laid) cards.append(cardEl(card, { className: "laid-off", tag: "AJUNTOU" }));
    row.append(group);
  });
  if (hand.deadwood.length) {
    row.append(groupEl(hand.deadwood, { className: "deadwood", title: `sobra ${hand.points}` }));
  } else {
    row.append(el("div", "group no-deadwood", "sem sobra"));
  }
  box.append(row);
  return box;
}

/** The end-of-hand board of ``record`` (a hand_ended event's data). */
export function handBoard(record, names) {
  const board = el("div", "board hand-board");
  board.dataset.hand = String(record.hand);
  board.append(el("h2", "board-title", `Fim da mão ${record.hand}`));
  const knocker = record.knocker !== null && record.knocker !== undefined ? names[record.knocker] : "";
  board.append(el("p", "board-how", HOW[record.how] ? HOW[record.how](knocker) : record.how));
  if (record.knock_discard) {
    const text = record.knock_discard_chosen_by_server
      ? `Sem escolher uma carta, o jogo descartou ${label(record.knock_discard)}, a que deixa a menor sobra.`
      : `${knocker} descartou ${label(record.knock_discard)} ao bater.`;
    board.append(el("p", "board-knock-discard", text));
  }
  for (const seat of [0, 1]) board.append(seatHand(record, seat, names));
  const sentence = layoffSentence(record, names);
  if (sentence) board.append(el("p", "board-layoffs", sentence));
  else if (record.how === "knock" || record.how === "undercut") {
    board.append(el("p", "board-layoffs", "Ninguém ajuntou cartas."));
  }
  const points =
    record.winner === null || record.winner === undefined
      ? "Ninguém pontuou nesta mão."
      : `${names[record.winner]} fez ${record.points} ponto${record.points === 1 ? "" : "s"}.`;
  board.append(el("p", "board-points", points));
  const scoredIn = scoredInText(record);
  if (scoredIn) board.append(el("p", "board-scored-in", scoredIn));
  board.append(
    el("p", "board-scores", `Placar: ${names[0]} ${record.scores[0]} × ${record.scores[1]} ${names[1]}`),
  );
  if (record.games) board.append(sheetEl(record.games, names));
  return board;
}

/** Hollywood's three columns (R9.11): a game per column, a seat per row; a closed game says who
 * won it and each seat's total with its bonuses. */
export function sheetEl(games, names) {
  const columns = gameColumns(games, names);
  const table = el("table", "sheet");
  table.dataset.games = String(columns.length);
  const head = el("tr");
  head.append(el("th", "", ""));
  for (const column of columns) {
    const th = el("th", column.closed ? "closed" : "", column.title);
    th.dataset.game = String(column.game);
    head.append(th);
  }
  table.append(head);
  for (const seat of [0, 1]) {
    const tr = el("tr");
    tr.dataset.seat = String(seat);
    tr.append(el("th", "", names[seat]));
    for (const column of columns) {
      const cell = column.seats[seat];
      const td = el("td", column.closed ? "closed" : "", cell.text);
      td.dataset.game = String(column.game);
      if (cell.total !== null) td.append(el("span", "sheet-total", `total ${cell.total}`));
      tr.append(td);
    }
    table.append(tr);
  }
  const status = el("tr", "sheet-status");
  status.append(el("th", "", ""));
  for (const column of columns) status.append(el("td", column.closed ? "closed" : "", column.status));
  table.append(status);
  return table;
}

/** A Hollywood match's tally (``hollywoodTally``'s sheet): games 1, 2, 3 and their sum, for
 * each seat (R9.11). */
function hollywoodTallyEl(sheet, names) {
  const table = el("table", "tally hollywood-tally");
  const head = el("tr");
  head.append(el("th", "", ""));
  for (const title of sheet.head) head.append(el("th", "", title));
  table.append(head);
  for (const { seat, rows } of sheet.seats) {
    const name = el("tr", "tally-seat");
    const th = el("th", "", names[seat]);
    th.colSpan = sheet.head.length + 1;
    name.append(th);
    table.append(name);
    for (const { title, key, cells } of rows) {
      const tr = el("tr", key === "total" ? "total" : "");
      tr.dataset.seat = String(seat);
      tr.append(el("th", "", title));
      for (const value of cells) tr.append(el("td", "", String(value)));
      table.append(tr);
    }
  }
  return table;
}

const ENDING = {
  target: (w) => `${w} chegou à meta e venceu a partida!`,
  resigned: (w, by) => `${by} desistiu: ${w} venceu a partida.`,
  left: (w, by) => `${by} saiu da mesa: ${w} venceu a partida.`,
  absence: (w, by) => `${w} encerrou por ausência de ${by} e venceu a partida.`,
  expired: () => "A mesa expirou: a partida terminou sem vencedor.",
};

/** The match-end board of ``result`` (a match_ended event's data), with the full tally. */
export function matchBoard(result, names) {
  const board = el("div", "board match-board");
  board.append(el("h2", "board-title", "Fim da partida"));
  const winner = result.winner === null ? "" : names[result.winner];
  // ``by`` is the seat that resigned, left or was absent; else the loser.
  const loserSeat = result.by !== null && result.by !== undefined ? result.by : result.winner === 0 ? 1 : 0;
  const text =
    hollywoodEnding(result, names) ||
    (ENDING[result.reason] ? ENDING[result.reason](winner, names[loserSeat]) : result.reason);
  board.append(el("p", "board-how", text));
  const sheet = hollywoodTally(result);
  if (sheet) {
    board.append(sheetEl(result.games, names), hollywoodTallyEl(sheet, names));
    return board;
  }
  const table = el("table", "tally");
  const head = el("tr");
  head.append(el("th", "", ""), el("th", "", names[0]), el("th", "", names[1]));
  table.append(head);
  const rows = [
    ["Pontos", "points"],
    ["Mãos ganhas", "hands_won"],
    ["Bônus da partida", "game_bonus"],
    ["Bônus de mão", "box_bonus"],
    ["Total", "total"],
  ];
  for (const [title, key] of rows) {
    const tr = el("tr", key === "total" ? "total" : "");
    tr.append(el("th", "", title));
    for (const seat of [0, 1]) tr.append(el("td", "", String(result.tally[seat][key])));
    table.append(tr);
  }
  board.append(table);
  return board;
}
