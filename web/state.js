// The page's state and the one function that changes it: ``reduce(state, frame)``.
//
// Pure: no DOM, no fetch, no timers, no clock, no randomness. Everything the page learns (the
// socket's snapshot and event frames, the HTTP answers, a 409's view read again) and everything
// the person does (a tap, a drop, a button) is a frame; the new state says what to show and,
// in ``effects``, what the shell (app.js) must do next: send a command, read the view again,
// read the events missed, set a notice's timer. The shell renders once per new state.
//
// Runs as it is in the browser (<script type="module">) and in node (web/tests/).

const LOG_KEPT = 50;
const NOTICE_MS = { error: 8000, info: 4000 };
export const DESIGNS = ["classico", "quatro-cores", "noite"];

/** The state of a page that has not opened a table yet. */
export function initialState({ me = null, design = "classico" } = {}) {
  return {
    me, // {token, sub, name} or null
    design: DESIGNS.includes(design) ? design : "classico",
    screen: null, // "name" | "lobby" | "table"
    asking: null, // the name form: {why, then: "lobby" | "reload" | "table"}
    table: null,
    view: null,
    lastSeq: 0, // the table stream's last event handled (it is numbered from 1 without gaps)
    ahead: [], // table events past a gap, held until the events before them are read
    catchingUp: false, // a read of the events missed is under way
    quietHistory: true, // the first read of the history: its boards are not shown again
    chat: [], // {seq, name, text}
    lastChatSeq: 0,
    selected: null, // the card chosen by a first tap
    arranged: true, // ORGANIZAR
    boards: [], // end-of-hand and match-end boards still to show, in order
    revealed: null, // the hand a match ended in the middle of (R9.3)
    log: [],
    connection: null, // "open" | "reconnecting" | "archived" (the socket stopped)
    snapshots: 0, // one per (re)connection of the table socket
    inFlight: null, // the command sent and not yet answered: {command, expected}
    queued: null, // a command asked for while another was in flight: {command, from}
    confirmResign: false,
    notice: null, // {id, text, kind}
    noticeCount: 0,
    effects: [], // what the shell must do after this change (set anew by every reduce)
  };
}

// --- reading the state ----------------------------------------------------------------------

export const legal = (s) => (s.view && s.view.legal) || [];
export const offered = (s, type) => legal(s).find((c) => c.type === type);
export const myTurn = (s) =>
  !!(s.view && s.view.hand && s.view.you !== null && s.view.hand.to_act === s.view.you);
export const busy = (s) => s.inFlight !== null;

export function names(s) {
  const seats = (s.view && s.view.seats) || [];
  return [0, 1].map((i) => (seats[i] ? seats[i].name : `Lugar ${i + 1}`));
}

/** The knock button: with the chosen card if that card may knock, else without a card (the
 * server discards the card that leaves the lowest deadwood, R6.5). */
export function knockChoice(s) {
  const knocks = legal(s).filter((c) => c.type === "knock");
  if (!knocks.length) return null;
  const chosen = s.selected && knocks.find((k) => k.card === s.selected);
  if (chosen) return { command: { type: "knock", card: chosen.card }, deadwood: chosen.deadwood, card: chosen.card };
  const best = Math.min(...knocks.map((k) => k.deadwood));
  return { command: { type: "knock" }, deadwood: best, card: null };
}

export function rematchText(s) {
  const v = s.view;
  const other = !v || v.you === null ? null : 1 - v.you;
  return v && v.match && other !== null && v.match.rematch_offers.includes(other) ? "ACEITAR REVANCHE" : "REVANCHE";
}

// --- the log's sentences ------------------------------------------------------------------------

const SUIT_SYMBOL = { c: "♣", d: "♦", h: "♥", s: "♠" };
const label = (card) => `${card[0].toUpperCase() === "T" ? "10" : card[0].toUpperCase()}${SUIT_SYMBOL[card[1].toLowerCase()]}`;

const DEAL_REASON = {
  lot: "por sorteio",
  won_previous_hand: "ganhou a mão anterior",
  lost_previous_hand: "perdeu a mão anterior",
  alternate: "alternando",
  dead_hand_redeal: "a mão anterior empatou",
};

/** The log's line for ``envelope`` (``n``: the seats' names), or null. */
export function describe(envelope, n) {
  const d = envelope.data;
  const who = d.seat !== undefined ? n[d.seat] : "";
  switch (envelope.type) {
    case "seat_taken":
      return `${d.player.name} sentou-se à mesa.`;
    case "match_started":
      return `Começa a partida ${d.match}, até ${d.options.target} pontos.`;
    case "hand_started":
      return `Mão ${d.hand}: ${n[d.dealer]} dá as cartas (${DEAL_REASON[d.reason] || d.reason}); aberta ${label(d.upcard)}, limite ${d.knock_limit}.`;
    case "upcard_taken":
      return `${who} pegou a aberta (${label(d.card)}).`;
    case "upcard_passed":
      return d.reason === "both_passed_upcard"
        ? `${who} passou. Os dois passaram: o primeiro compra só do monte.`
        : `${who} passou.`;
    case "card_drawn":
      return d.source === "stock" ? `${who} comprou do monte.` : `${who} pegou ${label(d.card)} do descarte.`;
    case "card_discarded":
      return `${who} descartou ${label(d.card)}.`;
    case "stock_low":
      return `Atenção: restam ${d.stock_count} cartas no monte.`;
    case "hand_ended":
      return d.winner === null ? `Fim da mão ${d.hand}: ninguém pontuou.` : `Fim da mão ${d.hand}: ${n[d.winner]} fez ${d.points}.`;
    case "match_ended":
      return d.winner === null ? "Fim da partida, sem vencedor." : `Fim da partida: ${n[d.winner]} venceu.`;
    case "rematch_offered":
      return `${who} quer revanche.`;
    case "rematch_accepted":
      return `Revanche! Começa a partida ${d.match}.`;
    case "table_closed":
      return "A mesa foi fechada.";
    case "table_expired":
      return "A mesa expirou.";
    default:
      return null;
  }
}

// --- small pure steps -------------------------------------------------------------------------

const withEffect = (s, effect) => ({ ...s, effects: [...s.effects, effect] });

function notice(s, text, kind = "error") {
  const id = s.noticeCount + 1;
  return withEffect({ ...s, notice: { id, text, kind }, noticeCount: id }, { type: "notice_timer", id, ms: NOTICE_MS[kind] || NOTICE_MS.error });
}

function log(s, line) {
  const lines = [...s.log, line];
  return { ...s, log: lines.length > LOG_KEPT ? lines.slice(-LOG_KEPT) : lines };
}

/** Show ``view`` unless it is older than the one shown. A snapshot or a view read again was
 * read when it was asked for: a move answered meanwhile (the person's own, on another request)
 * is newer, and showing the older view over it would offer the person a turn already played,
 * and send the next command from it. An equal version is shown: its offers may have changed
 * with time (ENCERRAR POR AUSÊNCIA). */
export function applyView(s, view) {
  if (!view) return s;
  if (s.view && view.table_id === s.view.table_id && view.version < s.view.version) return s;
  let next = { ...s, view };
  if (view.deck_design && DESIGNS.includes(view.deck_design)) next.design = view.deck_design;
  const cards = (view.hand && view.hand.my_cards) || [];
  if (next.selected && !cards.includes(next.selected)) next.selected = null;
  return next;
}

/** A chat message kept once, in seq order (a message read back may be older than the newest
 * kept); ``lastChatSeq`` is the newest. */
function addChat(s, envelope) {
  const seq = envelope.seq;
  if (s.chat.some((line) => line.seq === seq)) return s;
  const line = { seq, name: envelope.data.name, text: envelope.data.text };
  const chat = seq > s.lastChatSeq ? [...s.chat, line] : [...s.chat, line].sort((a, b) => a.seq - b.seq);
  return { ...s, lastChatSeq: Math.max(s.lastChatSeq, seq), chat };
}

/** A chat message that came live (the socket, the answer to one's own). One past a gap says
 * the page missed messages (its socket's replica did not hear them): those after the newest
 * kept are read back, as a gap in the table's events is. */
function liveChat(s, envelope) {
  const next = addChat(s, envelope);
  if (envelope.seq <= s.lastChatSeq + 1) return next;
  return withEffect(next, { type: "chat_after", after: s.lastChatSeq });
}

const isTableEvent = (e) => e.type !== "message_posted" && e.type !== "absence_claimable" && (e.stream || "table") === "table";

/** One table event, the next of the stream: the log, the boards. ``quiet`` (the history read
 * on arrival) updates the log only: old boards are not shown again. */
function tableEvent(s, envelope, quiet) {
  let next = { ...s, lastSeq: envelope.seq };
  const line = describe(envelope, names(next));
  if (line) next = log(next, line);
  if (quiet) return next;
  if (envelope.type === "hand_ended") {
    // A match that ends mid-hand reveals that hand (R9.3): its board goes with the match's.
    if (envelope.data.how === "abandoned") next = { ...next, revealed: envelope.data };
    else next = { ...next, boards: [...next.boards, { kind: "hand", record: envelope.data }] };
  }
  if (envelope.type === "match_ended") next = { ...next, boards: [...next.boards, { kind: "match", record: envelope.data }] };
  return next;
}

/** The events held past a gap that now follow the last one handled, in order. */
function drainAhead(s) {
  let next = s;
  while (next.ahead.length && next.ahead[0].seq <= next.lastSeq + 1) {
    const [first, ...rest] = next.ahead;
    next = { ...next, ahead: rest };
    if (first.seq === next.lastSeq + 1) next = tableEvent(next, first, false);
  }
  return next;
}

function catchUp(s) {
  if (s.catchingUp) return s;
  return withEffect({ ...s, catchingUp: true }, { type: "catch_up", after: s.lastSeq });
}

/** An event that came live (the socket, a command's answer), with the view after it (or none). */
function liveEvent(s, envelope, view) {
  let next = applyView(s, view); // the names of a seat just taken come with the view
  if (envelope.type === "message_posted") return liveChat(next, envelope);
  if (envelope.type === "absence_claimable") {
    const v = next.view;
    if (v && v.you !== null && envelope.data.seat !== v.you) {
      next = log(next, `${names(next)[envelope.data.seat]} está ausente: você pode ENCERRAR POR AUSÊNCIA.`);
    }
    return withEffect(next, { type: "read_view" });
  }
  if (!isTableEvent(envelope)) return next;
  const seq = envelope.seq;
  if (seq <= next.lastSeq || next.ahead.some((e) => e.seq === seq)) return next; // a duplicate
  if (seq === next.lastSeq + 1) return drainAhead(tableEvent(next, envelope, false));
  // A gap: the events before it were missed (a frame lost, an answer ahead of the socket).
  const ahead = [...next.ahead, envelope].sort((a, b) => a.seq - b.seq);
  return catchUp({ ...next, ahead });
}

// --- commands ----------------------------------------------------------------------------------

const sameCommand = (a, b) => JSON.stringify(a) === JSON.stringify(b);

function sendNow(s, command) {
  const body = { ...command, expected_version: s.view.version };
  delete body.deadwood; // informative in `legal`: the server ignores it
  return withEffect({ ...s, inFlight: { command, expected: s.view.version } }, { type: "command", body });
}

/** The person asks for ``command``. With another command in flight it waits its turn (the
 * view may already show the person's next turn: the socket's event can come before the HTTP
 * answer), unless it is that very command asked again from the same view (a double tap). */
function ask(s, command) {
  let next = { ...s, confirmResign: false };
  if (command.type === "discard" || command.type === "knock") next.selected = null;
  if (!next.view) return next;
  if (next.inFlight) {
    const repeat = sameCommand(next.inFlight.command, command) && next.inFlight.expected === next.view.version;
    return repeat ? next : { ...next, queued: { command, from: next.view.version } };
  }
  return sendNow(next, command);
}

/** The in-flight command is over (answered or refused): the one that waited goes now. */
function settle(s) {
  let next = { ...s, inFlight: null, confirmResign: false };
  if (next.queued && next.view) {
    const { command } = next.queued;
    next = sendNow({ ...next, queued: null }, command);
  }
  return next;
}

function commandOf(s, action) {
  const hand = s.view && s.view.hand;
  switch (action) {
    case "take_upcard":
    case "pass_upcard":
    case "big_gin":
    case "claim_absence":
    case "rematch":
    case "decline_rematch":
    case "leave":
      return { type: action };
    case "resign-confirm":
      return { type: "resign" };
    case "draw-stock":
    case "stock":
      return { type: "draw", source: "stock" };
    case "draw-discard":
      return { type: "draw", source: "discard" };
    case "knock":
    case "gin": {
      const knock = knockChoice(s);
      return knock ? knock.command : null;
    }
    case "discard-pile":
      if (hand && hand.phase === "upcard") return { type: "take_upcard" };
      if (s.selected && hand && hand.phase === "discard") return { type: "discard", card: s.selected };
      return { type: "draw", source: "discard" };
    default:
      return null;
  }
}

// --- the reducer -------------------------------------------------------------------------------

/** The state after ``frame``: what the page learnt or what the person did. */
export function reduce(state, frame) {
  const s = state.effects.length ? { ...state, effects: [] } : state;
  switch (frame.type) {
    // who the person is, which screen
    case "signed_in":
      return { ...s, me: frame.me };
    case "signed_out": // a token this server no longer takes (its secret changed, say)
      return { ...s, me: null, screen: "name", asking: { why: frame.why, then: "reload" } };
    case "ask_name":
      return { ...s, screen: "name", asking: { why: frame.why, then: frame.then } };
    case "screen":
      return { ...s, screen: frame.screen, asking: frame.screen === "name" ? s.asking : null };
    case "design":
      return DESIGNS.includes(frame.design) ? { ...s, design: frame.design } : s;

    // the table and what the server says of it
    case "table_opened":
      return {
        ...initialState({ me: s.me, design: s.design }),
        screen: "table",
        table: frame.table,
        noticeCount: s.noticeCount,
        notice: s.notice,
      };
    case "view_read": // GET view, a join's, a creation's answer, a view read again after a 409
      return applyView(s, frame.view);
    case "snapshot": {
      // The socket's first frame after every (re)connection: the view when it was read, then
      // the events and the messages missed while it was closed.
      const next = applyView({ ...s, snapshots: s.snapshots + 1, connection: "open" }, frame.view);
      return withEffect(catchUp({ ...next, catchingUp: false }), { type: "chat_after", after: s.lastChatSeq });
    }
    case "socket_state":
      return { ...s, connection: frame.state };
    case "socket_frame": {
      const f = frame.frame;
      if (f.kind === "event") return liveEvent(s, f.event, f.view || null);
      if (f.kind === "error") return notice(s, `Recusado: ${f.error.message}`);
      return s;
    }
    case "events_read": {
      // The events after ``lastSeq``, in order: the history on arrival is quiet, except the
      // events that came live meanwhile (held in ``ahead``). They are all the server keeps: a
      // log that starts past ``lastSeq + 1`` (its oldest events dropped) is taken from there.
      const live = new Set(s.ahead.map((e) => e.seq));
      let next = s;
      for (const envelope of frame.events) {
        if (!isTableEvent(envelope) || envelope.seq <= next.lastSeq) continue;
        next = tableEvent(next, envelope, s.quietHistory && !live.has(envelope.seq));
      }
      next = drainAhead({ ...next, ahead: next.ahead.filter((e) => e.seq > next.lastSeq), catchingUp: false, quietHistory: false });
      return next.ahead.length ? catchUp(next) : next;
    }
    case "catch_up_failed":
      return notice({ ...s, catchingUp: false }, `Erro: ${frame.message}`);
    case "messages_read":
      return frame.messages.reduce(addChat, s);
    case "message_posted":
      return liveChat(s, frame.envelope);
    case "answer": // seating a bot: events and the view after them
      return applyView(frame.events.reduce((acc, e) => liveEvent(acc, e, null), s), frame.view);

    // commands
    case "command_answered": {
      const next = frame.events.reduce((acc, e) => liveEvent(acc, e, null), s);
      return settle(applyView(next, frame.view));
    }
    case "command_refused": {
      // Refused as "not now" (409): the page may have missed something; the server's view decides.
      let next = notice(settle(s), frame.refusal ? `Recusado: ${frame.message}` : `Erro: ${frame.message}`);
      if (frame.status === 409) next = withEffect(next, { type: "read_view" });
      return next;
    }
    case "refused": // any other call refused or failed
      return notice(s, frame.refusal ? `Recusado: ${frame.message}` : `Erro: ${frame.message}`);
    case "notice":
      return notice(s, frame.text, frame.kind);
    case "notice_expired":
      return s.notice && s.notice.id === frame.id ? { ...s, notice: null } : s;

    // the person's hands
    case "tap_card":
      if (s.selected === frame.card) return ask(s, { type: "discard", card: frame.card });
      return { ...s, selected: frame.card };
    case "drop_card":
      return ask(s, { type: "discard", card: frame.card });
    case "action": {
      switch (frame.action) {
        case "organize":
          return { ...s, arranged: !s.arranged };
        case "resign":
          return { ...s, confirmResign: true };
        case "resign-cancel":
          return { ...s, confirmResign: false };
        case "close-board":
          return { ...s, boards: s.boards.slice(1) };
        default: {
          const command = commandOf(s, frame.action);
          const next = frame.fromBoard ? { ...s, boards: s.boards.slice(1) } : s;
          return command ? ask(next, command) : next;
        }
      }
    }
    default:
      return s;
  }
}
