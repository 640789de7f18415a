// The public v1 API of the table service (this page's origin) and the chat service, and the
// table WebSocket that reconnects by itself and resumes from the last seq it saw.

const CHAT_PORT = 8081;

/** Where the chat service answers: window.GIN_CONFIG.chatUrl, ?chat=, else this host's :8081. */
export function chatBase() {
  const configured = window.GIN_CONFIG && window.GIN_CONFIG.chatUrl;
  const asked = new URLSearchParams(location.search).get("chat");
  return (configured || asked || `${location.protocol}//${location.hostname}:${CHAT_PORT}`)
    .replace(/\/$/, "");
}

/** A refusal of the server: its code, its message (shown as is) and the rule it names. */
export class Refusal extends Error {
  constructor(status, detail) {
    super(detail.message || `HTTP ${status}`);
    this.status = status;
    this.code = detail.code || "error";
    this.rule = detail.rule || null;
  }
}

async function call(method, url, { token, body } = {}) {
  // Refusals' messages in Portuguese (a WebSocket sends the browser's own Accept-Language).
  const headers = { "Accept-Language": "pt-BR" };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    throw new Refusal(0, { code: "network", message: `sem conexão com o servidor (${err.message})` });
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const detail = (data && data.error) || { code: `http_${response.status}`, message: text };
    throw new Refusal(response.status, detail);
  }
  return data;
}

let counter = 0;
/** A command id unique to this page: a retried command is applied once. */
export function commandId() {
  counter += 1;
  const random = crypto.getRandomValues(new Uint32Array(2));
  return `web-${Date.now().toString(36)}-${random[0].toString(36)}${random[1].toString(36)}-${counter}`;
}

export const api = {
  mintToken: (name, sub) => call("POST", "/v1/dev/tokens", { body: sub ? { name, sub } : { name } }),
  createTable: (token, options) => call("POST", "/v1/tables", { token, body: { options } }),
  join: (token, table, inviteCode) =>
    call("POST", `/v1/tables/${table}/join`, { token, body: { invite_code: inviteCode } }),
  seatBot: (token, table, level) => call("POST", `/v1/tables/${table}/bot`, { token, body: { level } }),
  view: (token, table) => call("GET", `/v1/tables/${table}`, { token }),
  command: (token, table, command) =>
    call("POST", `/v1/tables/${table}/commands`, { token, body: command }),
  events: (table, after) => call("GET", `/v1/tables/${table}/events?after=${after}`),
  myTables: (token, after) =>
    call("GET", `/v1/players/me/tables?limit=100&after=${encodeURIComponent(after)}`, { token }),
  preferences: (token) => call("GET", "/v1/players/me/preferences", { token }),
  setPreferences: (token, deckDesign) =>
    call("PUT", "/v1/players/me/preferences", { token, body: { deck_design: deckDesign } }),
  messages: (table, after) => call("GET", `${chatBase()}/v1/tables/${table}/messages?after=${after}&limit=100`),
  // ``after_version``: the table version this page has seen, so that a person who has just sat
  // down is not taken for a spectator by a chat still catching up (read-your-writes).
  postMessage: (token, table, text, afterVersion) =>
    call("POST", `${chatBase()}/v1/tables/${table}/messages`, {
      token,
      body: afterVersion === undefined ? { text } : { text, after_version: afterVersion },
    }),
};

/** Every table event after ``after``, page by page (the route gives at most 1000 at once). */
export async function eventsAfter(table, after) {
  const all = [];
  for (;;) {
    const page = await api.events(table, after);
    all.push(...page);
    if (page.length < 1000) return all;
    after = page[page.length - 1].seq;
  }
}

/** Every chat message after ``after``. */
export async function messagesAfter(table, after) {
  const all = [];
  for (;;) {
    const page = await api.messages(table, after);
    all.push(...page);
    if (page.length < 100) return all;
    after = page[page.length - 1].seq;
  }
}

const CLOSE_TRY_AGAIN_LATER = 1013; // the replica is full: "reconnect in a few seconds"
const CLOSE_TOKEN_EXPIRED = 4001;
const CLOSE_ARCHIVED = 4410; // the table was archived: GET /v1/tables/{id} answers 410
const BACKOFF_MS = [250, 500, 1000, 2000, 4000];
const FULL_BACKOFF_MS = [3000, 6000, 12000, 24000, 30000];

/**
 * How long to wait before reconnection ``attempt`` (0, 1, ...) after a close with ``code``:
 * doubling up to a cap, each wait drawn between half and all of it, so that the sockets of a
 * replica that went away (1001) or is full (1013) do not all come back at the same instant.
 * A full replica gets longer waits: the balancer's affinity may send the socket to it again.
 * ``null``: do not reconnect (the table was archived).
 */
export function reconnectDelay(attempt, code, random = Math.random) {
  if (code === CLOSE_ARCHIVED) return null;
  const steps = code === CLOSE_TRY_AGAIN_LATER ? FULL_BACKOFF_MS : BACKOFF_MS;
  const cap = steps[Math.min(attempt, steps.length - 1)];
  return Math.round(cap * (0.5 + random() / 2));
}

/**
 * The table's WebSocket. ``onSnapshot(view)`` after every (re)connection (it is open then),
 * ``onMessage(frame)`` for events, results and errors, ``onState("reconnecting", code)``;
 * ``tokenExpired()`` gives a fresh token after a 4001 close. Whatever closes it (the server going away, 4008,
 * a network cut), it reconnects with backoff (``reconnectDelay``) until ``stop()``; after a
 * 4410 (the table was archived) it stops, with ``onState("archived", code)``.
 */
export class TableSocket {
  constructor(table, getToken, handlers) {
    this.table = table;
    this.getToken = getToken;
    this.handlers = handlers;
    this.ws = null;
    this.attempt = 0;
    this.stopped = false;
    this.timer = null;
    this.waiting = false; // closed, and a reconnection is scheduled
  }

  /** The socket's route. */
  path() {
    return `/v1/tables/${this.table}/ws`;
  }

  /** The kind of the first message after every (re)connection, and what of it the page gets. */
  get firstKind() {
    return "snapshot";
  }

  first(frame) {
    return frame.view;
  }

  start() {
    this.stopped = false;
    this.connect();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000, "page left the table");
    this.ws = null;
  }

  connect() {
    const token = this.getToken();
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = token ? `?token=${encodeURIComponent(token)}` : "";
    const ws = new WebSocket(`${scheme}://${location.host}${this.path()}${query}`);
    this.ws = ws;
    ws.onmessage = (msg) => {
      let frame;
      try {
        frame = JSON.parse(msg.data);
      } catch {
        return;
      }
      if (frame.kind === this.firstKind) {
        this.attempt = 0;
        this.handlers.onSnapshot(this.first(frame)); // open again (one call: the page draws once)
      } else {
        this.handlers.onMessage(frame);
      }
    };
    ws.onclose = async (ev) => {
      if (this.ws !== ws || this.stopped) return;
      this.ws = null;
      const delay = reconnectDelay(this.attempt, ev.code);
      if (delay === null) {
        this.stopped = true;
        this.handlers.onState("archived", ev.code);
        return;
      }
      this.handlers.onState("reconnecting", ev.code);
      if (ev.code === CLOSE_TOKEN_EXPIRED && this.handlers.tokenExpired) {
        try {
          await this.handlers.tokenExpired();
        } catch {
          // the next attempt goes without a fresh token; the server says why
        }
      }
      this.attempt += 1;
      this.waiting = true;
      this.timer = setTimeout(() => {
        this.waiting = false;
        if (!this.stopped) this.connect();
      }, delay);
    };
  }

  /** Reconnect at once if the socket is down and waiting for its next try. */
  retryNow() {
    if (this.stopped || !this.waiting) return;
    clearTimeout(this.timer);
    this.waiting = false;
    this.connect();
  }

  get open() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }
}

/**
 * The player's socket (``GET /v1/players/me/ws``): ``onSnapshot(frame)`` with the list of the
 * person's tables after every (re)connection, ``onMessage(frame)`` for each table that changed;
 * it reconnects as the table's socket does.
 */
export class PlayerSocket extends TableSocket {
  constructor(getToken, handlers) {
    super(null, getToken, handlers);
  }

  path() {
    return "/v1/players/me/ws";
  }

  get firstKind() {
    return "tables";
  }

  first(frame) {
    return frame;
  }
}
