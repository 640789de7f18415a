// "Minhas mesas" (web/mytables.js): the list the player socket keeps, by node's own runner.

import assert from "node:assert/strict";
import { test } from "node:test";

import { addPage, ago, describe, reduceTables, until } from "../mytables.js";

const NOW = Date.parse("2027-01-15T12:00:00Z");

function entry(id, { myTurn = false, since = null, status = "playing", you = 0, toAct = null } = {}) {
  return {
    table_id: id,
    status,
    seats: [{ name: "Ana" }, status === "waiting" ? null : { name: "Bia" }],
    you,
    to_act: toAct ?? (since ? (myTurn ? you : 1 - you) : null),
    my_turn: myTurn,
    turn_since: since,
    absence_claimable_at: since ? new Date(Date.parse(since) + 48 * 3600e3).toISOString() : null,
    expires_at: "2027-01-20T12:00:00Z",
    scores: [30, 12],
    options: { target: 100 },
  };
}

const ids = (list) => list.map((e) => e.table_id);

test("the first frame is the list: my turn first, then the longest waiting", () => {
  const list = reduceTables([], {
    kind: "tables",
    next: null,
    tables: [
      entry("c", { since: "2027-01-15T10:00:00Z" }),
      entry("w", { status: "waiting" }),
      entry("a", { myTurn: true, since: "2027-01-15T11:00:00Z" }),
      entry("b", { myTurn: true, since: "2027-01-14T11:00:00Z" }),
      entry("d", { since: "2027-01-13T10:00:00Z" }),
    ],
  });
  assert.deepEqual(ids(list), ["b", "a", "d", "c", "w"]);
});

test("a table's frame moves it: the opponent moved, it is my turn now", () => {
  let list = reduceTables([], {
    kind: "tables",
    tables: [entry("a", { myTurn: true, since: "2027-01-15T11:00:00Z" }), entry("b", { since: "2027-01-15T09:00:00Z" })],
  });
  list = reduceTables(list, { kind: "table", table: entry("b", { myTurn: true, since: "2027-01-15T11:30:00Z" }) });
  assert.deepEqual(ids(list), ["a", "b"]);
  assert.equal(list[1].my_turn, true);
  list = reduceTables(list, { kind: "table", table: entry("a", { since: "2027-01-15T11:59:00Z" }) });
  assert.deepEqual(ids(list), ["b", "a"]);
});

test("a new table joins the list; a finished one leaves it; anything else changes nothing", () => {
  let list = reduceTables([], { kind: "tables", tables: [entry("a", { since: "2027-01-15T11:00:00Z" })] });
  list = reduceTables(list, { kind: "table", table: entry("n", { status: "waiting" }) });
  assert.deepEqual(ids(list), ["a", "n"]);
  list = reduceTables(list, { kind: "table", table: entry("a", { status: "closed" }) });
  assert.deepEqual(ids(list), ["n"]);
  assert.equal(reduceTables(list, { kind: "error", error: {} }), list);
  assert.equal(reduceTables(list, null), list);
});

test("a row says whose turn, since when, the score and the deadline, in Portuguese", () => {
  const mine = describe(entry("a", { myTurn: true, since: "2027-01-15T09:00:00Z" }), NOW);
  assert.deepEqual(mine, { opponent: "contra Bia", turn: "Sua vez", since: "há 3 h", score: "30 × 12", deadline: "jogue em 45 h" });
  const theirs = describe(entry("b", { since: "2027-01-15T11:55:00Z", you: 1 }), NOW);
  assert.equal(theirs.turn, "Vez de Ana");
  assert.equal(theirs.opponent, "contra Ana");
  assert.equal(theirs.score, "12 × 30");
  assert.equal(theirs.deadline, "ausência em 47 h");
  const waiting = describe(entry("w", { status: "waiting" }), NOW);
  assert.equal(waiting.turn, "Esperando adversário");
  assert.equal(waiting.opponent, "contra ninguém ainda");
  assert.equal(waiting.deadline, "expira em 5 dias");
});

test("times in words", () => {
  assert.equal(ago("2027-01-15T11:59:30Z", NOW), "agora");
  assert.equal(ago("2027-01-15T11:00:00Z", NOW), "há 1 h");
  assert.equal(ago("2027-01-12T12:00:00Z", NOW), "há 3 dias");
  assert.equal(until("2027-01-15T11:00:00Z", NOW), "já");
  assert.equal(until("2027-01-15T12:10:00Z", NOW), "em 10 min");
});

test("a later page adds its tables, but not one a table frame told of since the paging began", () => {
  const first = reduceTables([], { kind: "tables", tables: [entry("a"), entry("b")], next: "cursor" });
  const live = entry("c", { myTurn: true, since: "2026-12-01T10:00:00Z" });
  const told = new Set(["c"]);
  const withLive = reduceTables(first, { kind: "table", table: live });
  const older = entry("c"); // the page's entry of c, read before the frame: not taken
  const paged = addPage(withLive, [entry("d"), older, entry("e", { status: "closed" })], told);
  assert.deepEqual(paged.map((e) => e.table_id).sort(), ["a", "b", "c", "d"]);
  assert.equal(paged.find((e) => e.table_id === "c").my_turn, true);
  assert.equal(addPage(paged, [], told), paged); // nothing new: the same list
});
