// The reference client of the Selminha Gin backend: one page, the public v1 API only.
//
// The server is the only judge: the page shows what the view says (the hand as ORGANIZAR
// arranges it, SOBRA, the buttons that `legal` offers) and sends what the person asks for;
// every refusal shows the server's own message.
//
// This file is the shell around state.js: it turns what arrives (socket frames, HTTP answers)
// and what the person does (taps, drops, buttons) into frames for ``reduce``, draws each new
// state once (render.js), and does the effects the new state asks for (HTTP calls, a notice's
// timer). ``state`` is the page's only state.

import { api, commandId, eventsAfter, messagesAfter, PlayerSocket, Refusal, TableSocket } from "./api.js";
import { addPage, reduceTables } from "./mytables.js";
import { renderMyTables } from "./mytables_view.js";
import { render } from "./render.js";
import { initialState, reduce } from "./state.js";

const $ = (id) => document.getElementById(id);

let state = initialState({ me: loadMe() });
let socket = null; // the table's WebSocket: a connection the shell holds, not state
let myTables = []; // "Minhas mesas", kept by the player socket (mytables.js)
let playerSocket = null;

function dispatch(frame) {
  const next = reduce(state, frame);
  if (next === state) return;
  state = next;
  render(state);
  for (const effect of next.effects) run(effect);
}

const token = () => (state.me ? state.me.token : null);

// --- effects -----------------------------------------------------------------------------------

function run(effect) {
  const table = state.table;
  switch (effect.type) {
    case "command":
      api
        .command(token(), table, { ...effect.body, command_id: commandId() })
        .then((result) => dispatch({ type: "command_answered", events: result.events, view: result.view }))
        .catch((err) => {
          dispatch({ type: "command_refused", ...why(err) });
          signedOutBy(err);
        });
      break;
    case "read_view":
      api.view(token(), table).then((view) => dispatch({ type: "view_read", view }), refused);
      break;
    case "catch_up":
      eventsAfter(table, effect.after).then(
        (events) => dispatch({ type: "events_read", events }),
        (err) => dispatch({ type: "catch_up_failed", message: err.message || String(err) }),
      );
      break;
    case "chat_after":
      messagesAfter(table, effect.after).then(
        (messages) => dispatch({ type: "messages_read", messages }),
        (err) => {
          // A new table: the chat learns of it from the table's events, and its first
          // messages come on the socket. Nothing to say to the person.
          if (!(err instanceof Refusal && err.code === "no_such_table")) refused(err);
        },
      );
      break;
    case "notice_timer":
      setTimeout(() => dispatch({ type: "notice_expired", id: effect.id }), effect.ms);
      break;
    default:
      break;
  }
}

const why = (err) => ({ refusal: err instanceof Refusal, status: err.status || 0, message: err.message || String(err) });

function refused(err) {
  dispatch({ type: "refused", ...why(err) });
  signedOutBy(err);
}

/** A token this server no longer takes (its secret changed, say): ask the name again. */
function signedOutBy(err) {
  if (!(err instanceof Refusal && err.status === 401 && state.me)) return;
  sessionStorage.removeItem("gin.me");
  dispatch({ type: "signed_out", why: "Sua sessão não vale mais neste servidor: diga seu nome de novo." });
}

// --- who the person is ------------------------------------------------------------------------

function loadMe() {
  try {
    return JSON.parse(sessionStorage.getItem("gin.me"));
  } catch {
    return null;
  }
}

function saveMe(me) {
  sessionStorage.setItem("gin.me", JSON.stringify(me));
  dispatch({ type: "signed_in", me });
}

async function signIn(name) {
  const minted = await api.mintToken(name);
  saveMe({ token: minted.token, sub: minted.sub, name: minted.name });
}

/** After a 4001 close: a new development token for the same person. */
async function refreshToken() {
  if (!state.me) return;
  const minted = await api.mintToken(state.me.name, state.me.sub);
  saveMe({ ...state.me, token: minted.token });
}

function askName(why, then) {
  dispatch({ type: "ask_name", why, then });
  $("name-form").elements.name.focus();
}

async function loadPreferences() {
  try {
    const prefs = await api.preferences(token());
    dispatch({ type: "design", design: prefs.deck_design });
  } catch {
    // no preference yet: the default design
  }
}

// --- the lobby: my tables ------------------------------------------------------------------------

/** The lobby, with "Minhas mesas" kept current by the player socket: no polling. */
function openLobby() {
  dispatch({ type: "screen", screen: "lobby" });
  renderMyTables(myTables, Date.now());
  if (playerSocket || !state.me) return;
  const show = (next) => {
    if (next === myTables) return;
    myTables = next;
    renderMyTables(myTables, Date.now());
  };
  // A ``tables`` frame holds the list's first page: the later pages are read after it, and a
  // newer ``tables`` frame (a reconnect, or the list sent again) stops that read.
  let paging = 0;
  let told = new Set(); // tables a ``table`` frame told of since the last ``tables`` frame
  const readLaterPages = async (generation, after) => {
    while (after && generation === paging) {
      let page;
      try {
        page = await api.myTables(token(), after);
      } catch {
        return; // the next ``tables`` frame (a reconnect) reads them again
      }
      if (generation !== paging) return;
      show(addPage(myTables, page.tables || [], told));
      after = page.next;
    }
  };
  const onFrame = (frame) => {
    if (frame && frame.kind === "tables") {
      paging += 1;
      told = new Set();
      if (frame.next) readLaterPages(paging, frame.next);
    } else if (frame && frame.kind === "table" && frame.table) {
      told.add(frame.table.table_id);
    }
    show(reduceTables(myTables, frame));
  };
  playerSocket = new PlayerSocket(token, {
    onSnapshot: onFrame,
    onMessage: onFrame,
    onState: () => {},
    tokenExpired: refreshToken,
  });
  playerSocket.start();
  // The times a row says ("há 3 h") move on with the clock.
  setInterval(() => renderMyTables(myTables, Date.now()), 60000);
}

// --- a table -------------------------------------------------------------------------------------

async function createTable(options) {
  const created = await api.createTable(token(), options);
  sessionStorage.setItem(`gin.invite.${created.table_id}`, created.invite_url);
  history.pushState(null, "", `/tables/${created.table_id}`);
  await openTable(created.table_id, created.view);
}

async function openTable(table, view = null) {
  const invite = new URLSearchParams(location.search).get("invite");
  if (invite && !state.me) {
    askName("Você foi convidado para uma mesa de Gin Rummy. Diga seu nome para sentar.", "table");
    return;
  }
  dispatch({ type: "table_opened", table });
  let shown = view;
  try {
    shown = shown || (await api.view(token(), table));
  } catch (err) {
    refused(err);
    return;
  }
  dispatch({ type: "view_read", view: shown });
  if (invite && shown.you === null) {
    try {
      const joined = await api.join(token(), table, invite);
      dispatch({ type: "view_read", view: joined.view });
    } catch (err) {
      refused(err); // seat_taken: a late arrival watches
    }
  }
  if (invite) history.replaceState(null, "", `/tables/${table}`);
  try {
    dispatch({ type: "messages_read", messages: await messagesAfter(table, 0) });
  } catch {
    // the chat may not know the table yet (it learns of it from the table's events)
  }
  socket = new TableSocket(table, token, {
    onSnapshot: (snapshot) => dispatch({ type: "snapshot", view: snapshot }),
    onMessage: (frame) => dispatch({ type: "socket_frame", frame }),
    onState: (connection) => dispatch({ type: "socket_state", state: connection }),
    tokenExpired: refreshToken,
  });
  socket.start();
}

const tableInPath = () => {
  const match = location.pathname.match(/^\/tables\/([A-Za-z0-9_-]+)$/);
  return match ? match[1] : null;
};

async function seatBot(level) {
  try {
    const result = await api.seatBot(token(), state.table, level);
    dispatch({ type: "answer", events: result.events, view: result.view });
  } catch (err) {
    refused(err);
  }
}

async function copyInvite() {
  const input = $("invite-link");
  try {
    await navigator.clipboard.writeText(input.value);
    dispatch({ type: "notice", text: "Link copiado.", kind: "info" });
  } catch {
    input.select();
  }
}

// --- the lobby's form ----------------------------------------------------------------------------

function optionsFromForm(form) {
  const f = form.elements;
  const num = (name) => Number.parseInt(f[name].value, 10);
  return {
    target: num("target"),
    gin_bonus: num("gin_bonus"),
    big_gin: f.big_gin.checked,
    big_gin_bonus: num("big_gin_bonus"),
    undercut_bonus: num("undercut_bonus"),
    box_bonus: num("box_bonus"),
    game_bonus: num("game_bonus"),
    shutout_bonus: num("shutout_bonus"),
    dealer: f.dealer.value,
    straight_gin: f.straight_gin.checked,
    oklahoma: f.oklahoma.checked,
    hollywood: f.hollywood.checked,
  };
}

// --- the person's hands --------------------------------------------------------------------------
//
// Listened to once, on the document and the page's fixed elements: whatever render.js draws,
// a tap reaches ``reduce`` as a frame; what it asks for is read from the state at that moment.

/** The frame of a tap (or Enter, or Space) on ``target``, or null. */
function tapOn(target) {
  const card = target.closest("#hand .card[data-card]");
  if (card) return { type: "tap_card", card: card.dataset.card };
  if (target.closest("#stock")) return { type: "action", action: "stock" };
  if (target.closest("#discard")) return { type: "action", action: "discard-pile" };
  return null;
}

function bindInputs() {
  document.addEventListener("click", (e) => {
    if (!(e.target instanceof Element)) return;
    const tap = tapOn(e.target);
    if (tap) {
      dispatch(tap);
      return;
    }
    const button = e.target.closest("button[data-action]");
    if (!button || button.closest("form")) return;
    const action = button.dataset.action;
    if (action === "copy-invite") copyInvite();
    else if (action === "bot") seatBot(button.dataset.level);
    else dispatch({ type: "action", action, fromBoard: !!button.closest("#board-actions") });
  });
  document.addEventListener("keydown", (e) => {
    if ((e.key !== "Enter" && e.key !== " ") || !(e.target instanceof Element)) return;
    if (e.target.closest("button, input, select, textarea")) return; // they click by themselves
    const tap = tapOn(e.target);
    if (!tap) return;
    e.preventDefault();
    dispatch(tap);
  });
  document.addEventListener("dragstart", (e) => {
    const card = e.target instanceof Element && e.target.closest("#hand .card[data-card]");
    if (!card) return;
    e.dataTransfer.setData("text/plain", card.dataset.card);
    e.dataTransfer.effectAllowed = "move";
  });
  const pile = $("discard");
  pile.addEventListener("dragover", (e) => {
    e.preventDefault();
    pile.classList.add("drop");
  });
  pile.addEventListener("dragleave", () => pile.classList.remove("drop"));
  pile.addEventListener("drop", (e) => {
    e.preventDefault();
    pile.classList.remove("drop");
    const card = e.dataTransfer.getData("text/plain");
    if (card) dispatch({ type: "drop_card", card });
  });
}

function bindForms() {
  $("name-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const name = e.target.elements.name.value.trim();
    if (!name) return;
    const then = state.asking ? state.asking.then : "lobby";
    try {
      await signIn(name);
    } catch (err) {
      refused(err);
      return;
    }
    loadPreferences();
    if (then === "reload") location.reload();
    else if (then === "table") await openTable(tableInPath());
    else openLobby();
  });
  $("create-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      await createTable(optionsFromForm(e.target));
    } catch (err) {
      refused(err);
    }
  });
  $("chat-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const input = e.target.elements.text;
    const text = input.value.trim();
    if (!text) return;
    try {
      const envelope = await api.postMessage(token(), state.table, text, state.view ? state.view.version : undefined);
      input.value = "";
      dispatch({ type: "message_posted", envelope });
    } catch (err) {
      refused(err);
    }
  });
  $("deck-design").addEventListener("change", async (e) => {
    const design = e.target.value;
    dispatch({ type: "design", design });
    if (!state.me) return;
    try {
      await api.setPreferences(token(), design);
    } catch (err) {
      refused(err);
    }
  });
}

async function start() {
  bindInputs();
  bindForms();
  window.addEventListener("popstate", () => location.reload());
  // Back online, or back on the screen (a phone asleep): reconnect now, not at the next try.
  window.addEventListener("online", () => {
    if (socket) socket.retryNow();
    if (playerSocket) playerSocket.retryNow();
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && socket) socket.retryNow();
    if (document.visibilityState === "visible" && playerSocket) playerSocket.retryNow();
  });
  render(state);
  if (state.me) loadPreferences();
  const table = tableInPath();
  if (table) await openTable(table);
  else if (!state.me) askName("Diga seu nome para entrar.", "lobby");
  else openLobby();
}

start();
