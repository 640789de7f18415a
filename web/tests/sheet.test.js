// Hollywood's score sheet (web/sheet.js): `node --test web/tests/`. Rules R9.7, R9.9, R9.11.

import assert from "node:assert/strict";
import { test } from "node:test";

import { gameColumns, hollywoodEnding, hollywoodTally, scoredInText } from "../sheet.js";

const NAMES = ["Ana", "Bia"];
const tally = (points, boxes, game, total) => ({ points, hands_won: boxes, game_bonus: game, box_bonus: boxes * 25, total });

const GAMES = [
  { game: 1, scores: [121, 3], boxes: [1, 1], closed: true, winner: 0, tally: [tally(121, 1, 100, 246), tally(3, 1, 0, 28)] },
  { game: 2, scores: [40, 0], boxes: [1, 0], closed: false, winner: null, tally: null },
  { game: 3, scores: [0, 0], boxes: [0, 0], closed: false, winner: null, tally: null },
];

test("R9.11: a column per game, each seat's points and hands, who won a closed game", () => {
  const columns = gameColumns(GAMES, NAMES);
  assert.deepEqual(
    columns.map((c) => [c.title, c.closed, c.status]),
    [
      ["Jogo 1", true, "Ana venceu"],
      ["Jogo 2", false, "em jogo"],
      ["Jogo 3", false, "em jogo"],
    ],
  );
  assert.deepEqual(columns[0].seats.map((s) => s.text), ["121 pts · 1 mão", "3 pts · 1 mão"]);
  assert.deepEqual(columns[0].seats.map((s) => s.total), [246, 28]);
  assert.deepEqual(columns[2].seats.map((s) => [s.text, s.total]), [["0 pts · 0 mãos", null], ["0 pts · 0 mãos", null]]);
});

test("R9.11: no games, no columns (a plain table)", () => {
  assert.deepEqual(gameColumns(undefined, NAMES), []);
  assert.deepEqual(gameColumns(null, NAMES), []);
});

test("R9.7: the sentence says which games a hand's points went into", () => {
  assert.equal(scoredInText({ winner: 0, scored_in: [1] }), "Os pontos entraram no jogo 1.");
  assert.equal(scoredInText({ winner: 1, scored_in: [1, 2] }), "Os pontos entraram nos jogos 1 e 2.");
  assert.equal(scoredInText({ winner: 1, scored_in: [1, 2, 3] }), "Os pontos entraram nos jogos 1, 2 e 3.");
  assert.match(scoredInText({ winner: 1, scored_in: [] }), /não entraram em nenhum jogo/);
  assert.equal(scoredInText({ winner: null, scored_in: [] }), null); // a dead hand
  assert.equal(scoredInText({ winner: 0, scored_in: null }), null); // not Hollywood
  assert.equal(scoredInText({ winner: 0 }), null);
});

test("R9.11: the final tally, games 1 to 3 and their sum, per seat", () => {
  const closed = GAMES.map((g, i) => ({
    ...g,
    closed: true,
    winner: i === 0 ? 0 : 1,
    tally: g.tally || [tally(g.scores[0], g.boxes[0], 0, g.scores[0] + g.boxes[0] * 25), tally(100, 2, 100, 250)],
  }));
  const sum = [0, 1].map((seat) => {
    const keys = ["points", "hands_won", "game_bonus", "box_bonus", "total"];
    return Object.fromEntries(keys.map((k) => [k, closed.reduce((acc, g) => acc + g.tally[seat][k], 0)]));
  });
  const sheet = hollywoodTally({ winner: 1, games: closed, tally: sum });
  assert.deepEqual(sheet.head, ["Jogo 1", "Jogo 2", "Jogo 3", "Soma"]);
  const totals = sheet.seats.map((s) => s.rows.find((r) => r.key === "total").cells);
  assert.deepEqual(totals[0], [246, 65, 0, 311]);
  assert.deepEqual(totals[1], [28, 250, 250, 528]);
  for (const { rows } of sheet.seats) {
    for (const { cells } of rows) assert.equal(cells[3], cells[0] + cells[1] + cells[2]);
  }
  assert.equal(hollywoodTally({ winner: 0, tally: sum }), null); // a plain match
});

test("R9.11: the winner won two or three of the games", () => {
  const games = (winners) => winners.map((winner, i) => ({ game: i + 1, winner, closed: true, tally: [] }));
  const result = (winners, reason = "target") => ({ winner: 1, reason, games: games(winners), tally: [] });
  assert.equal(hollywoodEnding(result([0, 1, 1]), NAMES), "Bia venceu 2 dos três jogos e a partida!");
  assert.equal(hollywoodEnding(result([1, 1, 1]), NAMES), "Bia venceu os três jogos e a partida!");
  assert.equal(hollywoodEnding(result([0, 1, 1], "resigned"), NAMES), null); // R9.12: R9.3's words
  assert.equal(hollywoodEnding({ winner: 1, reason: "target", tally: [] }, NAMES), null);
});
