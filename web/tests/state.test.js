// The page's reducer (web/state.js), by node's own runner: `node --test web/tests/`.

import assert from "node:assert/strict";
import { test } from "node:test";

import { initialState, reduce } from "../state.js";

const ME = { token: "t", sub: "u1", name: "Ana" };

/** A view of table "t1" at ``version``: Ana (seat 0) against Bia, in ``phase`` with ``toAct``. */
function view(version, { phase = "draw", toAct = 0, cards = ["Ah", "2c", "3d"], legal = [] } = {}) {
  return {
    table_id: "t1",
    version,
    status: "playing",
    you: 0,
    seats: [{ name: "Ana" }, { name: "Bia" }],
    options: { target: 100 },
    match: { number: 1, scores: [0, 0], rematch_offers: [] },
    hand: { phase, to_act: toAct, my_cards: cards, discard_pile: ["9s"], stock_count: 20, known: [[], []], card_counts: [10, 10] },
    legal,
  };
}

function event(seq, type = "card_drawn", data = { seat: 1, source: "stock" }) {
  return { id: `e${seq}`, type, table_id: "t1", stream: "table", seq, version: seq, data };
}

const frame = (ev, v = null) => ({ type: "socket_frame", frame: { kind: "event", event: ev, view: v } });

/** A page at table t1 that has had its snapshot (version 10) and history (events 1 to 10). */
function atTable() {
  let s = reduce(initialState({ me: ME }), { type: "table_opened", table: "t1" });
  s = reduce(s, { type: "snapshot", view: view(10) });
  const history = Array.from({ length: 10 }, (_, i) => event(i + 1, "upcard_passed", { seat: i % 2 }));
  return reduce(s, { type: "events_read", events: history });
}

const types = (s) => s.effects.map((e) => e.type);

test("a snapshot shows its view and asks for the events and messages missed", () => {
  let s = reduce(initialState({ me: ME }), { type: "table_opened", table: "t1" });
  s = reduce(s, { type: "snapshot", view: view(7) });
  assert.equal(s.view.version, 7);
  assert.equal(s.snapshots, 1);
  assert.equal(s.connection, "open");
  assert.deepEqual(s.effects, [
    { type: "catch_up", after: 0 },
    { type: "chat_after", after: 0 },
  ]);
  assert.equal(s.catchingUp, true);
});

test("the history read on arrival fills the log but shows no old board", () => {
  let s = reduce(initialState({ me: ME }), { type: "table_opened", table: "t1" });
  s = reduce(s, { type: "snapshot", view: view(3) });
  const ended = event(3, "hand_ended", { hand: 1, winner: 0, points: 12, how: "knock" });
  s = reduce(s, { type: "events_read", events: [event(1, "stock_low", { stock_count: 4 }), event(2), ended] });
  assert.equal(s.lastSeq, 3);
  assert.equal(s.catchingUp, false);
  assert.deepEqual(s.boards, []);
  assert.deepEqual(s.log, ["Atenção: restam 4 cartas no monte.", "Bia comprou do monte.", "Fim da mão 1: Ana fez 12."]);
});

test("events in order are each handled once, with their views", () => {
  let s = atTable();
  s = reduce(s, frame(event(11), view(11, { toAct: 1 })));
  s = reduce(s, frame(event(12, "card_discarded", { seat: 1, card: "Td" }), view(12)));
  assert.equal(s.lastSeq, 12);
  assert.equal(s.view.version, 12);
  assert.deepEqual(s.log.slice(-2), ["Bia comprou do monte.", "Bia descartou 10♦."]);
  assert.deepEqual(s.effects, []);
});

test("a duplicate event frame is not logged twice nor its board shown twice", () => {
  let s = atTable();
  const ended = event(11, "hand_ended", { hand: 1, winner: 1, points: 20, how: "gin" });
  s = reduce(s, frame(ended, view(11)));
  const once = s;
  s = reduce(s, frame(ended, view(11)));
  assert.equal(s.boards.length, 1);
  assert.deepEqual(s.log, once.log);
  assert.deepEqual(s.effects, []);
});

test("a view older than the one shown is ignored, from any source", () => {
  let s = atTable();
  s = reduce(s, frame(event(11), view(11, { phase: "discard" })));
  const shown = s.view;
  s = reduce(s, { type: "view_read", view: view(10) });
  assert.equal(s.view, shown);
  s = reduce(s, { type: "snapshot", view: view(9) });
  assert.equal(s.view, shown);
  s = reduce(s, { type: "command_answered", events: [], view: view(10) });
  assert.equal(s.view, shown);
});

test("a view at the same version is shown: it can carry new offers", () => {
  let s = atTable();
  const later = view(10, { legal: [{ type: "claim_absence" }] });
  s = reduce(s, { type: "view_read", view: later });
  assert.equal(s.view, later);
  assert.deepEqual(s.view.legal, [{ type: "claim_absence" }]);
});

test("a gap asks once for the events missed, and they are handled in order", () => {
  let s = atTable();
  s = reduce(s, frame(event(13, "card_discarded", { seat: 1, card: "Td" }), view(13)));
  assert.deepEqual(s.effects, [{ type: "catch_up", after: 10 }]);
  assert.equal(s.view.version, 13); // the view is whole: shown at once
  assert.equal(s.lastSeq, 10); // the event waits for the ones before it
  s = reduce(s, frame(event(14, "stock_low", { stock_count: 4 }), view(14)));
  assert.deepEqual(s.effects, []); // one catch-up at a time
  s = reduce(s, { type: "events_read", events: [event(11), event(12, "card_drawn", { seat: 1, source: "stock" }), event(13, "card_discarded", { seat: 1, card: "Td" })] });
  assert.equal(s.lastSeq, 14);
  assert.deepEqual(s.ahead, []);
  assert.equal(s.catchingUp, false);
  assert.deepEqual(s.log.slice(-4), ["Bia comprou do monte.", "Bia comprou do monte.", "Bia descartou 10♦.", "Atenção: restam 4 cartas no monte."]);
});

test("an event held past a gap shows its board even when the read is the quiet history", () => {
  let s = reduce(initialState({ me: ME }), { type: "table_opened", table: "t1" });
  s = reduce(s, { type: "snapshot", view: view(1) });
  const ended = event(2, "hand_ended", { hand: 1, winner: 1, points: 20, how: "gin" });
  s = reduce(s, frame(ended, view(2))); // live, before the history's answer
  s = reduce(s, { type: "events_read", events: [event(1, "table_created", {}), ended] });
  assert.equal(s.boards.length, 1);
});

test("the answer to the person's own command shows its events and view, and frees the page", () => {
  let s = atTable();
  s = reduce(s, { type: "action", action: "stock" });
  assert.deepEqual(s.effects, [{ type: "command", body: { type: "draw", source: "stock", expected_version: 10 } }]);
  assert.ok(s.inFlight);
  s = reduce(s, { type: "command_answered", events: [event(11, "card_drawn", { seat: 0, source: "stock" })], view: view(11, { phase: "discard" }) });
  assert.equal(s.inFlight, null);
  assert.equal(s.view.version, 11);
  assert.equal(s.log.at(-1), "Ana comprou do monte.");
  assert.deepEqual(s.effects, []);
});

test("a 409 shows the server's message and reads the view again", () => {
  let s = atTable();
  s = reduce(s, { type: "action", action: "stock" });
  s = reduce(s, { type: "command_refused", refusal: true, status: 409, message: "Compre uma carta primeiro." });
  assert.equal(s.inFlight, null);
  assert.equal(s.notice.text, "Recusado: Compre uma carta primeiro.");
  assert.deepEqual(types(s), ["notice_timer", "read_view"]);
  s = reduce(s, { type: "notice_expired", id: s.notice.id });
  assert.equal(s.notice, null);
});

test("a tap while a command is in flight is sent once the answer is in, at the new version", () => {
  // The socket's event can show the person's next turn before the HTTP answer of the draw:
  // the discard tapped then must not be lost.
  let s = atTable();
  s = reduce(s, { type: "action", action: "stock" });
  s = reduce(s, frame(event(11, "card_drawn", { seat: 0, source: "stock" }), view(11, { phase: "discard", cards: ["Ah", "2c", "3d", "Kd"] })));
  s = reduce(s, { type: "tap_card", card: "Kd" });
  assert.equal(s.selected, "Kd");
  s = reduce(s, { type: "tap_card", card: "Kd" });
  assert.deepEqual(s.effects, []);
  assert.deepEqual(s.queued, { command: { type: "discard", card: "Kd" }, from: 11 });
  s = reduce(s, { type: "command_answered", events: [event(11, "card_drawn", { seat: 0, source: "stock" })], view: view(11, { phase: "discard" }) });
  assert.deepEqual(s.effects, [{ type: "command", body: { type: "discard", card: "Kd", expected_version: 11 } }]);
  assert.equal(s.queued, null);
  assert.deepEqual(s.inFlight, { command: { type: "discard", card: "Kd" }, expected: 11 });
});

test("a drop while a command is in flight waits too; a refusal of the first sends it still", () => {
  let s = atTable();
  s = reduce(s, { type: "action", action: "stock" });
  s = reduce(s, { type: "drop_card", card: "2c" });
  assert.deepEqual(s.effects, []);
  s = reduce(s, { type: "command_refused", refusal: true, status: 409, message: "Não é a sua vez." });
  assert.deepEqual(s.effects.find((e) => e.type === "command"), { type: "command", body: { type: "discard", card: "2c", expected_version: 10 } });
});

test("the same command asked again from the same view is one input (a double tap)", () => {
  let s = atTable();
  s = reduce(s, { type: "action", action: "stock" });
  s = reduce(s, { type: "action", action: "stock" });
  assert.equal(s.queued, null);
  s = reduce(s, { type: "command_answered", events: [], view: view(11, { phase: "discard" }) });
  assert.deepEqual(s.effects, []);
});

test("a knock without a chosen card is sent without card; with one, with it", () => {
  const knocks = [{ type: "knock", card: "Ah", deadwood: 5 }, { type: "knock", card: "3d", deadwood: 3 }];
  let s = atTable();
  s = reduce(s, { type: "view_read", view: view(11, { phase: "discard", legal: knocks }) });
  const bare = reduce(s, { type: "action", action: "knock" });
  assert.deepEqual(bare.effects, [{ type: "command", body: { type: "knock", expected_version: 11 } }]);
  s = reduce(s, { type: "tap_card", card: "Ah" });
  const chosen = reduce(s, { type: "action", action: "knock" });
  assert.deepEqual(chosen.effects, [{ type: "command", body: { type: "knock", card: "Ah", expected_version: 11 } }]);
  assert.equal(chosen.selected, null);
});

test("absence_claimable says so and reads the view again; chat messages are kept once", () => {
  let s = atTable();
  s = reduce(s, frame({ type: "absence_claimable", stream: "timer", seq: 1, data: { seat: 1 } }));
  assert.deepEqual(types(s), ["read_view"]);
  assert.equal(s.log.at(-1), "Bia está ausente: você pode ENCERRAR POR AUSÊNCIA.");
  const message = { type: "message_posted", stream: "chat", seq: 1, data: { name: "Bia", text: "oi" } };
  s = reduce(s, frame(message));
  s = reduce(s, { type: "messages_read", messages: [message] });
  assert.deepEqual(s.chat, [{ seq: 1, name: "Bia", text: "oi" }]);
  assert.equal(s.lastSeq, 10); // neither is a table event
});

const chat = (seq, text = `m${seq}`) => ({ type: "message_posted", stream: "chat", seq, data: { name: "Bia", text } });

test("a chat message past a gap reads back those missed, and the chat stays in seq order", () => {
  let s = reduce(atTable(), frame(chat(1)));
  assert.deepEqual(types(s), []);
  s = reduce(s, frame(chat(4)));
  assert.deepEqual(s.effects.at(-1), { type: "chat_after", after: 1 });
  assert.equal(s.lastChatSeq, 4);
  s = reduce(s, { type: "messages_read", messages: [chat(2), chat(3), chat(4)] });
  assert.deepEqual(s.chat.map((line) => line.seq), [1, 2, 3, 4]);
  const mine = reduce(s, { type: "message_posted", envelope: chat(5) }); // one's own: no gap
  assert.deepEqual(types(mine), types(s));
  const past = reduce(s, { type: "message_posted", envelope: chat(7) }); // one's own, past one
  assert.deepEqual(past.effects.at(-1), { type: "chat_after", after: 4 });
});

test("a snapshot again on an open socket reads back the chat after the newest kept", () => {
  let s = reduce(atTable(), frame(chat(1)));
  s = reduce(s, frame(chat(2)));
  s = reduce(s, { type: "snapshot", view: view(10) });
  assert.equal(s.snapshots, 2);
  assert.deepEqual(s.effects.at(-1), { type: "chat_after", after: 2 });
});

test("a turn_reminder from the socket changes nothing: the page shows the turn already", () => {
  const s = atTable();
  const reminder = { type: "turn_reminder", stream: "timer", seq: 2, data: { seat: 0, reminder: "waiting" } };
  const next = reduce(s, frame(reminder));
  assert.deepEqual(types(next), []);
  assert.deepEqual(next.log, s.log);
  assert.equal(next.lastSeq, s.lastSeq); // not a table event
});

test("the reducer changes no state it is given", () => {
  const s = atTable();
  const frozen = JSON.stringify(s);
  reduce(s, frame(event(11), view(11)));
  reduce(s, { type: "action", action: "stock" });
  reduce(s, { type: "events_read", events: [event(11)] });
  assert.equal(JSON.stringify(s), frozen);
});

test("a match's end queues its board after the hand's; closing shows the next", () => {
  let s = atTable();
  s = reduce(s, frame(event(11, "hand_ended", { hand: 2, winner: 0, points: 30, how: "knock" }), view(11)));
  s = reduce(s, frame(event(12, "match_ended", { winner: 0, reason: "target" }), view(12)));
  assert.deepEqual(s.boards.map((b) => b.kind), ["hand", "match"]);
  s = reduce(s, { type: "action", action: "close-board" });
  assert.deepEqual(s.boards.map((b) => b.kind), ["match"]);
});

test("a history whose oldest events are no longer kept is taken from its first event", () => {
  let s = reduce(initialState({ me: ME }), { type: "table_opened", table: "t1" });
  s = reduce(s, { type: "snapshot", view: view(501) });
  s = reduce(s, frame(event(502), view(502))); // live, past the gap
  s = reduce(s, { type: "events_read", events: [event(500), event(501, "stock_low", { stock_count: 4 }), event(502)] });
  assert.equal(s.lastSeq, 502);
  assert.deepEqual(s.ahead, []);
  assert.equal(s.catchingUp, false);
  assert.deepEqual(s.effects, []); // no read asked again: nothing is missing any more
});
