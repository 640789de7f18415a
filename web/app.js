// The reference client of the Selminha Gin backend: one page, the public v1 API only.
//
// The server is the only judge: the page shows what the view says (the hand as ORGANIZAR
// arranges it, SOBRA, the buttons that `legal` offers) and sends what the person asks for;
// every refusal shows the server's own message.

import { api, commandId, eventsAfter, messagesAfter, Refusal, TableSocket } from "./api.js";
import { handBoard, matchBoard } from "./boards.js";
import { backEl, bySuit, cardEl, groupEl, label } from "./cards.js";

const $ = (id) => document.getElementById(id);
const LOG_LINES = 6;
const DESIGNS = ["classico", "quatro-cores", "noite"];

const S = {
  me: loadMe(),
  table: null,
  view: null,
  lastSeq: 0,
  seen: new Set(), // table event seqs handled (log, boards)
  lastChatSeq: 0,
  selected: null,
  arranged: true, // ORGANIZAR
  boards: [], // end-of-hand and match-end boards still to show, in order
  revealed: null, // the hand a match ended in the middle of (R9.3)
  log: [],
  socket: null,
  snapshots: 0, // one per (re)connection of the table socket
  busy: false,
  confirmResign: false,
  design: "classico",
};

// --- who the person is ------------------------------------------------------------------

function loadMe() {
  try {
    return JSON.parse(sessionStorage.getItem("gin.me"));
  } catch {
    return null;
  }
}

function saveMe(me) {
  S.me = me;
  sessionStorage.setItem("gin.me", JSON.stringify(me));
}

async function signIn(name) {
  const minted = await api.mintToken(name);
  saveMe({ token: minted.token, sub: minted.sub, name: minted.name });
}

/** After a 4001 close: a new development token for the same person. */
async function refreshToken() {
  if (!S.me) return;
  const minted = await api.mintToken(S.me.name, S.me.sub);
  saveMe({ ...S.me, token: minted.token });
}

const token = () => (S.me ? S.me.token : null);

// --- notices --------------------------------------------------------------------------------

let noticeTimer = null;

function notice(text, kind = "error") {
  // Shown at the top of the page, and inside a board when one covers the page.
  for (const box of [$("notice"), $("board-notice")]) {
    box.textContent = text;
    box.className = kind;
    box.hidden = false;
  }
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => {
    $("notice").hidden = true;
    $("board-notice").hidden = true;
  }, kind === "error" ? 8000 : 4000);
}

function refused(err) {
  if (err instanceof Refusal) notice(`Recusado: ${err.message}`);
  else notice(`Erro: ${err.message || err}`);
  if (err instanceof Refusal && err.status === 401 && S.me) {
    // A token this server no longer takes (its secret changed, say): ask the name again.
    sessionStorage.removeItem("gin.me");
    S.me = null;
    renderWho();
    askName("Sua sessão não vale mais neste servidor: diga seu nome de novo.", () => location.reload());
  }
}

// --- screens --------------------------------------------------------------------------------

function show(screen) {
  for (const id of ["screen-name", "screen-lobby", "screen-table"]) $(id).hidden = id !== screen;
}

function renderWho() {
  const who = $("who");
  who.hidden = !S.me;
  who.textContent = S.me ? S.me.name : "";
}

async function start() {
  bindStatic();
  renderWho();
  const match = location.pathname.match(/^\/tables\/([A-Za-z0-9_-]+)$/);
  if (S.me) loadPreferences();
  if (match) {
    await openTable(match[1]);
  } else if (!S.me) {
    askName("Diga seu nome para entrar.", () => show("screen-lobby"));
  } else {
    show("screen-lobby");
  }
}

let afterName = null;

function askName(why, then) {
  $("name-why").textContent = why;
  afterName = then;
  show("screen-name");
  $("name-form").elements.name.focus();
}

// --- deck design (R10.7) ----------------------------------------------------------------------

function applyDesign(design) {
  S.design = DESIGNS.includes(design) ? design : "classico";
  for (const d of DESIGNS) document.body.classList.toggle(`deck-${d}`, d === S.design);
  $("deck-design").value = S.design;
}

async function loadPreferences() {
  try {
    const prefs = await api.preferences(token());
    applyDesign(prefs.deck_design);
  } catch {
    // no preference yet: the default design
  }
}

// --- the lobby: create a table ------------------------------------------------------------------

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
  };
}

async function createTable(options) {
  const created = await api.createTable(token(), options);
  sessionStorage.setItem(`gin.invite.${created.table_id}`, created.invite_url);
  history.pushState(null, "", `/tables/${created.table_id}`);
  await openTable(created.table_id, created.view);
}

// --- a table -------------------------------------------------------------------------------------

async function openTable(table, view = null) {
  const invite = new URLSearchParams(location.search).get("invite");
  if (invite && !S.me) {
    askName("Você foi convidado para uma mesa de Gin Rummy. Diga seu nome para sentar.", () =>
      openTable(table),
    );
    return;
  }
  S.table = table;
  show("screen-table");
  try {
    S.view = view || (await api.view(token(), table));
  } catch (err) {
    refused(err);
    return;
  }
  if (invite && S.view.you === null) {
    try {
      const joined = await api.join(token(), table, invite);
      S.view = joined.view;
    } catch (err) {
      refused(err); // seat_taken: a late arrival watches
    }
  }
  if (invite) history.replaceState(null, "", `/tables/${table}`);
  if (S.view.deck_design) applyDesign(S.view.deck_design);
  render();
  await loadChat();
  S.socket = new TableSocket(table, token, {
    onSnapshot,
    onMessage,
    onState: connectionState,
    tokenExpired: refreshToken,
  });
  S.socket.start();
}

let firstSnapshot = true;

async function onSnapshot(view) {
  S.snapshots += 1;
  const missedAfter = S.lastSeq;
  applyView(view);
  try {
    const missed = await eventsAfter(S.table, missedAfter);
    for (const envelope of missed) handleEvent(envelope, null, firstSnapshot);
    firstSnapshot = false;
    const chat = await messagesAfter(S.table, S.lastChatSeq);
    for (const envelope of chat) addChat(envelope);
  } catch (err) {
    refused(err);
  }
  render();
}

function onMessage(frame) {
  if (frame.kind === "event") handleEvent(frame.event, frame.view || null, false);
  else if (frame.kind === "error") notice(`Recusado: ${frame.error.message}`);
}

function connectionState(state) {
  const conn = $("conn");
  conn.hidden = false;
  conn.dataset.state = state;
  conn.textContent = state === "open" ? "conectado" : "reconectando…";
}

/** Show ``view`` unless it is older than the one shown. A snapshot or a view read again was
 * read when it was asked for: a move answered meanwhile (the person's own, on another request)
 * is newer, and showing the older view over it would offer the person a turn already played,
 * and send the next command from it (a discard dragged from it once the other seat had played
 * on: "draw a card first"). An equal version is shown: its offers may have changed with time. */
function applyView(view) {
  if (!view) return;
  if (S.view && view.table_id === S.view.table_id && view.version < S.view.version) return;
  S.view = view;
  if (view.deck_design && view.deck_design !== S.design) applyDesign(view.deck_design);
  const cards = (view.hand && view.hand.my_cards) || [];
  if (S.selected && !cards.includes(S.selected)) S.selected = null;
  render();
}

// --- events ------------------------------------------------------------------------------------

function names() {
  const seats = (S.view && S.view.seats) || [];
  return [0, 1].map((i) => (seats[i] ? seats[i].name : `Lugar ${i + 1}`));
}

const DEAL_REASON = {
  lot: "por sorteio",
  won_previous_hand: "ganhou a mão anterior",
  lost_previous_hand: "perdeu a mão anterior",
  alternate: "alternando",
  dead_hand_redeal: "a mão anterior empatou",
};

function describe(envelope) {
  const d = envelope.data;
  const n = names();
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

/** One event: the log, the boards, then the view that came with it. ``quiet`` (the history
 * read on arrival) updates the log only: old boards are not shown again. */
function handleEvent(envelope, view, quiet) {
  if (envelope.type === "message_posted") {
    addChat(envelope);
    return;
  }
  if (envelope.type === "absence_claimable") {
    const n = names();
    if (S.view && S.view.you !== null && envelope.data.seat !== S.view.you) {
      log(`${n[envelope.data.seat]} está ausente: você pode ENCERRAR POR AUSÊNCIA.`);
    }
    refreshView();
    return;
  }
  if (!S.seen.has(envelope.seq)) {
    S.seen.add(envelope.seq);
    S.lastSeq = Math.max(S.lastSeq, envelope.seq);
    // The names come from the view: a seat taken shows its new name at once.
    if (view) applyView(view);
    const line = describe(envelope);
    if (line) log(line);
    if (!quiet && envelope.type === "hand_ended") {
      // A match that ends mid-hand reveals that hand (R9.3): its board goes with the match's.
      if (envelope.data.how === "abandoned") S.revealed = envelope.data;
      else queueBoard({ kind: "hand", record: envelope.data });
    }
    if (!quiet && envelope.type === "match_ended") {
      queueBoard({ kind: "match", record: envelope.data });
    }
  }
  if (view) applyView(view);
  else render();
}

async function refreshView() {
  try {
    applyView(await api.view(token(), S.table));
  } catch (err) {
    refused(err);
  }
}

function log(line) {
  S.log.push(line);
  if (S.log.length > 50) S.log.shift();
}

function queueBoard(board) {
  S.boards.push(board);
  renderBoard();
}

// --- commands ------------------------------------------------------------------------------

async function send(command) {
  if (S.busy || !S.view) return;
  S.busy = true;
  const body = { ...command, command_id: commandId(), expected_version: S.view.version };
  delete body.deadwood; // informative in `legal`: the server ignores it
  try {
    const result = await api.command(token(), S.table, body);
    for (const envelope of result.events) handleEvent(envelope, null, false);
    applyView(result.view);
  } catch (err) {
    refused(err);
    // Refused as "not now": the page may have missed something; the server's view decides.
    if (err instanceof Refusal && err.status === 409) refreshView();
  } finally {
    S.busy = false;
    S.confirmResign = false;
    render();
  }
}

const legal = () => (S.view && S.view.legal) || [];
const offered = (type) => legal().find((c) => c.type === type);
const myTurn = () => S.view && S.view.hand && S.view.you !== null && S.view.hand.to_act === S.view.you;

function discard(card) {
  S.selected = null;
  send({ type: "discard", card });
}

function onCard(card) {
  if (S.selected === card) discard(card);
  else {
    S.selected = card;
    render();
  }
}

function onStock() {
  send({ type: "draw", source: "stock" });
}

function onDiscardPile() {
  const hand = S.view && S.view.hand;
  if (hand && hand.phase === "upcard") send({ type: "take_upcard" });
  else if (S.selected && hand && hand.phase === "discard") discard(S.selected);
  else send({ type: "draw", source: "discard" });
}

/** The knock button: with the chosen card if that card may knock, else without a card (the
 * server discards the card that leaves the lowest deadwood, R6.5). */
function knockChoice() {
  const knocks = legal().filter((c) => c.type === "knock");
  if (!knocks.length) return null;
  const chosen = S.selected && knocks.find((k) => k.card === S.selected);
  if (chosen) return { command: { type: "knock", card: chosen.card }, deadwood: chosen.deadwood, card: chosen.card };
  const best = Math.min(...knocks.map((k) => k.deadwood));
  return { command: { type: "knock" }, deadwood: best, card: null };
}

// --- rendering -----------------------------------------------------------------------------------

function button(text, action, onClick, className = "") {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.dataset.action = action;
  if (className) b.className = className;
  b.addEventListener("click", onClick);
  return b;
}

function render() {
  renderWho();
  if (!S.view || $("screen-table").hidden) return;
  const v = S.view;
  const n = names();
  const o = v.options;
  $("options-line").textContent =
    `Partida até ${o.target} · gin ${o.gin_bonus} · ${o.big_gin ? `big gin ${o.big_gin_bonus}` : "sem big gin"} · undercut ${o.undercut_bonus} · mão ${o.box_bonus} · partida ${o.game_bonus}/${o.shutout_bonus}` +
    `${o.straight_gin ? " · straight gin" : ""}${o.oklahoma ? " · Oklahoma" : ""}`;
  renderWaiting(v);
  const bottom = v.you === null ? 0 : v.you;
  renderSeat($("seat-top"), v, 1 - bottom, n);
  renderSeat($("seat-bottom"), v, bottom, n);
  renderCenter(v);
  $("status").textContent = statusText(v, n);
  renderActions(v);
  renderLog();
  renderChatBox(v);
  renderBoard();
}

function statusText(v, n) {
  if (v.status === "waiting") return "Esperando o outro jogador.";
  if (v.status === "match_over") return "Partida encerrada.";
  if (v.status === "closed") return "Mesa fechada.";
  if (v.status === "expired") return "A mesa expirou.";
  const h = v.hand;
  if (!h) return "";
  const mine = v.you !== null && h.to_act === v.you;
  if (h.phase === "upcard") {
    return mine ? "Sua vez: PEGAR A ABERTA ou PASSAR." : `Vez de ${n[h.to_act]}: pegar a aberta ou passar.`;
  }
  if (h.phase === "draw") {
    if (!mine) return `Vez de ${n[h.to_act]}: comprar.`;
    return h.stock_only ? "Os dois passaram: compre do monte." : "Sua vez: compre do monte ou do descarte.";
  }
  if (!mine) return `Vez de ${n[h.to_act]}: descartar.`;
  return "Descarte uma carta: toque nela e toque de novo, ou arraste-a até o descarte.";
}

function renderWaiting(v) {
  const box = $("waiting");
  box.replaceChildren();
  box.hidden = v.status !== "waiting";
  if (box.hidden) return;
  if (v.you !== 0) {
    box.append(Object.assign(document.createElement("p"), { textContent: "A mesa espera o segundo jogador." }));
    return;
  }
  const link = sessionStorage.getItem(`gin.invite.${v.table_id}`);
  const p = document.createElement("p");
  p.textContent = "Mande o link do convite para quem vai jogar com você:";
  box.append(p);
  if (link) {
    const row = document.createElement("div");
    row.className = "invite";
    const input = Object.assign(document.createElement("input"), { id: "invite-link", value: link, readOnly: true });
    const copy = button("COPIAR", "copy-invite", async () => {
      try {
        await navigator.clipboard.writeText(link);
        notice("Link copiado.", "info");
      } catch {
        input.select();
      }
    });
    const open = Object.assign(document.createElement("a"), {
      href: link,
      target: "_blank",
      rel: "noopener",
      textContent: "abrir em outra janela",
      className: "open-invite",
    });
    row.append(input, copy, open);
    box.append(row);
  }
  const bots = document.createElement("p");
  bots.textContent = "Ou preencha o lugar com um robô:";
  box.append(bots);
  const row = document.createElement("div");
  row.className = "bots";
  for (const [level, name, how] of [
    ["tito", "TITO", "fácil"],
    ["carmen", "CARMEN", "médio"],
    ["luna", "LUNA", "difícil"],
  ]) {
    const b = button(`${name} (${how})`, `bot-${level}`, async () => {
      try {
        const result = await api.seatBot(token(), S.table, level);
        for (const envelope of result.events) handleEvent(envelope, null, false);
        applyView(result.view);
      } catch (err) {
        refused(err);
      }
    }, "bot");
    b.dataset.level = level;
    row.append(b);
  }
  box.append(row);
}

function renderSeat(box, v, seat, n) {
  box.replaceChildren();
  box.dataset.seat = String(seat);
  const h = v.hand;
  const head = document.createElement("div");
  head.className = "seat-head";
  const name = document.createElement("span");
  name.className = "seat-name";
  const player = v.seats[seat];
  name.textContent = player ? n[seat] + (v.you === seat ? " (você)" : "") : "lugar livre";
  head.append(name);
  if (v.match) {
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = `${v.match.scores[seat]} pts`;
    head.append(score);
  }
  if (h && h.dealer === seat) head.append(Object.assign(document.createElement("span"), { className: "dealer", textContent: "dá as cartas" }));
  if (h && h.to_act === seat && v.status === "playing") {
    box.classList.add("to-act");
    head.append(Object.assign(document.createElement("span"), { className: "turn", textContent: "vez" }));
  } else {
    box.classList.remove("to-act");
  }
  box.append(head);
  if (!h) return;
  if (v.you !== null && seat === v.you) {
    renderMyHand(box, h);
    return;
  }
  // Another seat: card backs, and the cards it took from the discard pile (R11.1).
  const known = h.known[seat] || [];
  const count = h.card_counts[seat];
  const row = document.createElement("div");
  row.className = "other-hand";
  for (const card of known) row.append(cardEl(card, { className: "known mini", tag: "pegou" }));
  for (let i = known.length; i < count; i += 1) row.append(backEl("small"));
  box.append(row);
  const caption = document.createElement("div");
  caption.className = "caption";
  caption.textContent = `${count} cartas${known.length ? `, ${known.length} conhecida${known.length > 1 ? "s" : ""}` : ""}`;
  box.append(caption);
}

function renderMyHand(box, h) {
  const arrangement = h.my_arrangement;
  const tools = document.createElement("div");
  tools.className = "hand-tools";
  const sobra = document.createElement("span");
  sobra.id = "sobra";
  sobra.className = "sobra";
  sobra.textContent = `SOBRA ${arrangement ? arrangement.points : "–"}`;
  const organize = button("ORGANIZAR", "organize", () => {
    S.arranged = !S.arranged;
    render();
  }, S.arranged ? "toggle on" : "toggle");
  organize.setAttribute("aria-pressed", String(S.arranged));
  tools.append(sobra, organize);
  box.append(tools);
  const hand = document.createElement("div");
  hand.id = "hand";
  hand.className = "hand";
  const cards = h.my_cards || [];
  const make = (card) => {
    const el = cardEl(card, { button: true, className: card === S.selected ? "selected" : "" });
    el.tabIndex = 0;
    el.draggable = true;
    el.addEventListener("click", () => onCard(card));
    el.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") onCard(card);
    });
    el.addEventListener("dragstart", (e) => {
      e.dataTransfer.setData("text/plain", card);
      e.dataTransfer.effectAllowed = "move";
    });
    return el;
  };
  if (S.arranged && arrangement) {
    const placed = new Set();
    for (const meld of arrangement.melds) {
      hand.append(groupEl(meld, { className: "meld", title: "jogo", make }));
      meld.forEach((c) => placed.add(c));
    }
    if (arrangement.discard) placed.add(arrangement.discard);
    arrangement.deadwood.forEach((c) => placed.add(c));
    const rest = [...arrangement.deadwood, ...cards.filter((c) => !placed.has(c))].sort(bySuit);
    if (rest.length) hand.append(groupEl(rest, { className: "deadwood", title: "soltas", make }));
    if (arrangement.discard) {
      hand.append(groupEl([arrangement.discard], { className: "suggested", title: "descarte", make }));
    }
  } else {
    hand.append(groupEl([...cards].sort(bySuit), { className: "plain", make }));
  }
  box.append(hand);
}

function renderCenter(v) {
  const h = v.hand;
  $("center").hidden = !h;
  if (!h) return;
  const count = $("stock-count");
  count.textContent = String(h.stock_count);
  count.classList.toggle("low", h.stock_count <= 4);
  const top = $("discard-top");
  top.replaceChildren();
  const pile = h.discard_pile;
  if (pile.length) top.append(cardEl(pile[pile.length - 1]));
  else top.append(Object.assign(document.createElement("div"), { className: "card empty" }));
  const historyBox = $("discard-history");
  historyBox.replaceChildren();
  for (const card of pile.slice(-9, -1).reverse()) historyBox.append(cardEl(card, { className: "mini" }));
  const mine = myTurn();
  $("stock").classList.toggle("can", mine && legal().some((c) => c.type === "draw" && c.source === "stock"));
  $("discard").classList.toggle(
    "can",
    mine && legal().some((c) => c.type === "take_upcard" || (c.type === "draw" && c.source === "discard") || c.type === "discard"),
  );
}

function renderActions(v) {
  const box = $("actions");
  box.replaceChildren();
  if (v.you === null) return;
  if (offered("take_upcard")) box.append(button("PEGAR A ABERTA", "take_upcard", () => send({ type: "take_upcard" })));
  if (offered("pass_upcard")) box.append(button("PASSAR", "pass_upcard", () => send({ type: "pass_upcard" })));
  if (legal().some((c) => c.type === "draw" && c.source === "stock")) {
    box.append(button("COMPRAR DO MONTE", "draw-stock", onStock));
  }
  if (legal().some((c) => c.type === "draw" && c.source === "discard")) {
    box.append(button("COMPRAR DO DESCARTE", "draw-discard", () => send({ type: "draw", source: "discard" })));
  }
  const knock = knockChoice();
  if (knock) {
    const gin = knock.deadwood === 0;
    const text = gin ? "GIN" : "BATER";
    const which = knock.card ? ` com ${label(knock.card)}` : "";
    const b = button(`${text}${which}`, gin ? "gin" : "knock", () => send(knock.command), "strong");
    b.title = gin ? "sem sobra" : `sobra ${knock.deadwood}`;
    box.append(b);
  }
  if (offered("big_gin")) box.append(button("BIG GIN", "big_gin", () => send({ type: "big_gin" }), "strong"));
  if (offered("claim_absence")) {
    box.append(button("ENCERRAR POR AUSÊNCIA", "claim_absence", () => send({ type: "claim_absence" }), "warn"));
  }
  if (offered("rematch")) box.append(button(rematchText(v), "rematch", () => send({ type: "rematch" }), "strong"));
  if (offered("decline_rematch")) box.append(button("RECUSAR REVANCHE", "decline_rematch", () => send({ type: "decline_rematch" })));
  if (v.status === "match_over" && offered("leave")) box.append(button("SAIR DA MESA", "leave", () => send({ type: "leave" })));
  if (offered("resign")) {
    if (S.confirmResign) {
      box.append(
        button("SIM, DESISTIR", "resign-confirm", () => send({ type: "resign" }), "warn"),
        button("NÃO", "resign-cancel", () => {
          S.confirmResign = false;
          render();
        }),
      );
    } else {
      box.append(button("DESISTIR", "resign", () => {
        S.confirmResign = true;
        render();
      }, "quiet"));
    }
  }
}

function rematchText(v) {
  const other = v.you === null ? null : 1 - v.you;
  return v.match && other !== null && v.match.rematch_offers.includes(other) ? "ACEITAR REVANCHE" : "REVANCHE";
}

function renderLog() {
  const box = $("log");
  box.replaceChildren();
  for (const line of S.log.slice(-LOG_LINES)) box.append(Object.assign(document.createElement("li"), { textContent: line }));
}

function renderBoard() {
  const overlay = $("board");
  const board = S.boards[0];
  overlay.hidden = !board;
  if (!board) return;
  const content = $("board-content");
  const actions = $("board-actions");
  const n = names();
  content.replaceChildren(board.kind === "hand" ? handBoard(board.record, n) : matchBoard(board.record, n));
  const revealed = S.revealed;
  if (board.kind === "match" && revealed && revealed.match === board.record.match) {
    content.append(handBoard(revealed, n));
  }
  actions.replaceChildren();
  const close = () => {
    S.boards.shift();
    renderBoard();
  };
  if (board.kind === "match" && S.view && S.view.status === "match_over" && S.view.you !== null) {
    if (offered("rematch")) {
      actions.append(button(rematchText(S.view), "rematch", () => {
        close();
        send({ type: "rematch" });
      }, "strong"));
    }
    if (offered("decline_rematch")) {
      actions.append(button("RECUSAR REVANCHE", "decline_rematch", () => {
        close();
        send({ type: "decline_rematch" });
      }));
    }
  }
  actions.append(button(board.kind === "hand" ? "CONTINUAR" : "VER A MESA", "close-board", close));
}

// --- chat (R10.5) --------------------------------------------------------------------------------

async function loadChat() {
  $("chat-log").replaceChildren();
  S.lastChatSeq = 0;
  try {
    for (const envelope of await messagesAfter(S.table, 0)) addChat(envelope);
  } catch {
    // the chat may not know the table yet (it learns of it from the table's events)
  }
}

function addChat(envelope) {
  if (envelope.seq <= S.lastChatSeq) return;
  S.lastChatSeq = envelope.seq;
  const item = document.createElement("li");
  const who = document.createElement("b");
  who.textContent = `${envelope.data.name}: `;
  item.append(who, document.createTextNode(envelope.data.text));
  const list = $("chat-log");
  list.append(item);
  list.scrollTop = list.scrollHeight;
}

function renderChatBox(v) {
  const form = $("chat-form");
  const why = $("chat-why");
  let reason = null;
  if (v.you === null) reason = "Você está assistindo: quem assiste lê a conversa, mas não escreve. Só quem está sentado à mesa conversa.";
  else if (v.status === "closed" || v.status === "expired") reason = "A mesa está fechada: a conversa fica para leitura.";
  why.hidden = reason === null;
  why.textContent = reason || "";
  for (const el of form.elements) el.disabled = reason !== null;
}

// --- wiring ------------------------------------------------------------------------------------

function bindStatic() {
  $("name-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const name = e.target.elements.name.value.trim();
    if (!name) return;
    try {
      await signIn(name);
      renderWho();
      loadPreferences();
      const then = afterName;
      afterName = null;
      if (then) await then();
    } catch (err) {
      refused(err);
    }
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
      const envelope = await api.postMessage(token(), S.table, text, S.view ? S.view.version : undefined);
      input.value = "";
      addChat(envelope);
    } catch (err) {
      refused(err);
    }
  });
  $("deck-design").addEventListener("change", async (e) => {
    const design = e.target.value;
    applyDesign(design);
    if (!S.me) return;
    try {
      await api.setPreferences(token(), design);
    } catch (err) {
      refused(err);
    }
  });
  const stock = $("stock");
  stock.addEventListener("click", onStock);
  stock.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") onStock();
  });
  const pile = $("discard");
  pile.addEventListener("click", onDiscardPile);
  pile.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") onDiscardPile();
  });
  pile.addEventListener("dragover", (e) => {
    e.preventDefault();
    pile.classList.add("drop");
  });
  pile.addEventListener("dragleave", () => pile.classList.remove("drop"));
  pile.addEventListener("drop", (e) => {
    e.preventDefault();
    pile.classList.remove("drop");
    const card = e.dataTransfer.getData("text/plain");
    if (card) discard(card);
  });
  window.addEventListener("popstate", () => location.reload());
  // Back online, or back on the screen (a phone asleep): reconnect now, not at the next try.
  window.addEventListener("online", () => S.socket && S.socket.retryNow());
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && S.socket) S.socket.retryNow();
  });
}

// For the browser tests and the curious: the page's state, read-only by convention.
window.gin = { state: S, render };

start();
