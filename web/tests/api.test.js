// The table socket's reconnection waits (web/api.js), by node's own runner: `node --test web/tests/`.

import assert from "node:assert/strict";
import { test } from "node:test";

import { reconnectDelay } from "../api.js";

const GOING_AWAY = 1001;
const TRY_AGAIN_LATER = 1013;
const TOO_SLOW = 4008;
const ARCHIVED = 4410;

test("waits double from a quarter second up to a cap, drawn between half and all of each", () => {
  const low = (attempt, code) => reconnectDelay(attempt, code, () => 0);
  const high = (attempt, code) => reconnectDelay(attempt, code, () => 0.999999);
  assert.deepEqual([0, 1, 2, 3, 4, 9].map((a) => high(a, GOING_AWAY)), [250, 500, 1000, 2000, 4000, 4000]);
  assert.deepEqual([0, 1, 2, 3, 4, 9].map((a) => low(a, TOO_SLOW)), [125, 250, 500, 1000, 2000, 2000]);
});

test("the sockets of a replica that went away do not come back at the same instant", () => {
  let state = 7;
  const random = () => ((state = (state * 48271) % 2147483647) / 2147483647);
  const waits = new Set(Array.from({ length: 200 }, () => reconnectDelay(0, GOING_AWAY, random)));
  assert.ok(waits.size > 50, `only ${waits.size} distinct first waits of 200`);
  for (const wait of waits) assert.ok(wait >= 125 && wait <= 250, `a first wait of ${wait} ms`);
});

test("a full replica (1013) is tried again after seconds, not a quarter second", () => {
  const first = reconnectDelay(0, TRY_AGAIN_LATER, () => 0);
  assert.ok(first >= 1500, `the first wait after 1013 is ${first} ms`);
  const later = reconnectDelay(10, TRY_AGAIN_LATER, () => 0.999999);
  assert.ok(later > reconnectDelay(10, GOING_AWAY, () => 0.999999));
  assert.ok(later <= 30000);
});

test("an archived table's socket is not reconnected", () => {
  assert.equal(reconnectDelay(0, ARCHIVED), null);
  assert.equal(reconnectDelay(3, ARCHIVED), null);
});
