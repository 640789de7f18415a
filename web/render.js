// Draws the page from the state (state.js): ``render(state)``, called once per new state.
//
// Each part of the page is drawn again only when what it shows has changed (each element keeps
// what it was drawn from), and a card or a button that stays on the page stays the same element:
// a tap or a drag that has begun on it (pointer down, not yet up) ends on it. Drawing a new
// element under a pointer that is down loses the input: the browser sends the click to what the
// two elements have in common, and a drag never starts. No listener is bound here: app.js
// listens once on the document and reads ``data-action`` and ``data-card``.

import { handBoard, matchBoard, sheetEl } from "./boards.js";
import { backEl, bySuit, cardEl, label } from "./cards.js";
import { busy, knockChoice, legal, myTurn, names, offered, rematchText } from "./state.js";

const $ = (id) => document.getElementById(id);
const LOG_LINES = 6;

/** Whether ``el`` shows something other than ``what`` (and it is drawn from ``what`` next). */
function stale(el, ...what) {
  const key = JSON.stringify(what);
  if (el.__drawnFrom === key) return false;
  el.__drawnFrom = key;
  return true;
}

function el(tag, className = "", text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function setData(node, name, value) {
  if (value === null || value === undefined) delete node.dataset[name];
  else node.dataset[name] = String(value);
}

/** ``box``'s buttons become ``wanted`` ([action, text, className, title]), in order; a button
 * already there for an action is kept (its text and class brought up to date). */
function buttons(box, wanted) {
  const have = new Map([...box.querySelectorAll(":scope > button[data-action]")].map((b) => [b.dataset.action, b]));
  const list = wanted.map(([action, text, className = "", title = ""]) => {
    const b = have.get(action) || el("button");
    b.type = "button";
    b.dataset.action = action;
    if (b.textContent !== text) b.textContent = text;
    if (b.className !== className) b.className = className;
    if (title) b.title = title;
    else b.removeAttribute("title");
    have.delete(action);
    return b;
  });
  for (const gone of have.values()) gone.remove();
  const now = [...box.children];
  if (now.length !== list.length || now.some((node, i) => node !== list[i])) box.append(...list);
}

// --- the whole page ----------------------------------------------------------------------------

export function render(s) {
  renderTop(s);
  renderNotice(s);
  for (const id of ["screen-name", "screen-lobby", "screen-table"]) $(id).hidden = id !== `screen-${s.screen}`;
  if (s.screen === "name" && s.asking) $("name-why").textContent = s.asking.why;
  const felt = $("screen-table");
  tableData(felt, s);
  if (s.screen !== "table" || !s.view) return;
  const v = s.view;
  const n = names(s);
  const o = v.options;
  $("options-line").textContent =
    `Partida até ${o.target} · gin ${o.gin_bonus} · ${o.big_gin ? `big gin ${o.big_gin_bonus}` : "sem big gin"} · undercut ${o.undercut_bonus} · mão ${o.box_bonus} · partida ${o.game_bonus}/${o.shutout_bonus}` +
    `${o.straight_gin ? " · straight gin" : ""}${o.oklahoma ? " · Oklahoma" : ""}${o.hollywood ? " · Hollywood" : ""}`;
  renderGames(v, n);
  renderWaiting(v);
  const bottom = v.you === null ? 0 : v.you;
  renderSeat($("seat-top"), s, 1 - bottom, n);
  renderSeat($("seat-bottom"), s, bottom, n);
  renderCenter(s);
  $("status").textContent = statusText(v, n);
  renderActions(s);
  renderLog(s);
  renderChat(s);
  renderBoard(s);
}

const CONNECTION_TEXT = { open: "conectado", archived: "mesa arquivada" };

function renderTop(s) {
  const who = $("who");
  who.hidden = !s.me;
  who.textContent = s.me ? s.me.name : "";
  for (const d of ["classico", "quatro-cores", "noite"]) document.body.classList.toggle(`deck-${d}`, d === s.design);
  const select = $("deck-design");
  if (select.value !== s.design) select.value = s.design;
  const conn = $("conn");
  conn.hidden = s.connection === null;
  setData(conn, "state", s.connection);
  conn.dataset.snapshots = String(s.snapshots);
  conn.textContent = CONNECTION_TEXT[s.connection] || "reconectando…";
}

function renderNotice(s) {
  // Shown at the top of the page, and inside a board when one covers the page.
  for (const box of [$("notice"), $("board-notice")]) {
    box.hidden = !s.notice;
    if (!s.notice) continue;
    box.textContent = s.notice.text;
    box.className = s.notice.kind;
  }
}

/** What the page shows, as attributes a test (or a person's tools) can read. */
function tableData(node, s) {
  const v = s.view;
  const h = v && v.hand;
  setData(node, "table", s.table);
  setData(node, "version", v ? v.version : null);
  setData(node, "status", v ? v.status : null);
  setData(node, "you", v && v.you !== null ? v.you : null);
  setData(node, "match", v && v.match ? v.match.number : null);
  setData(node, "result", v && v.match && v.match.result ? v.match.result.reason : null);
  setData(node, "phase", h ? h.phase : null);
  setData(node, "toAct", h ? h.to_act : null);
  setData(node, "stockOnly", h ? h.stock_only : null);
  setData(node, "busy", busy(s));
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

/** Hollywood's three columns on the felt (R9.11), from the view's ``match.games``. */
function renderGames(v, n) {
  const box = $("games");
  const games = v.match && v.match.games ? v.match.games : null;
  box.hidden = !games;
  if (!stale(box, games, n)) return;
  box.replaceChildren(...(games ? [sheetEl(games, n)] : []));
}

function renderWaiting(v) {
  const box = $("waiting");
  box.hidden = v.status !== "waiting";
  const link = v.status === "waiting" && v.you === 0 ? sessionStorage.getItem(`gin.invite.${v.table_id}`) : null;
  if (!stale(box, v.status, v.you, link)) return;
  box.replaceChildren();
  if (box.hidden) return;
  if (v.you !== 0) {
    box.append(el("p", "", "A mesa espera o segundo jogador."));
    return;
  }
  box.append(el("p", "", "Mande o link do convite para quem vai jogar com você:"));
  if (link) {
    const row = el("div", "invite");
    const input = Object.assign(el("input"), { id: "invite-link", value: link, readOnly: true });
    const copy = el("button", "", "COPIAR");
    copy.type = "button";
    copy.dataset.action = "copy-invite";
    const open = Object.assign(el("a", "open-invite", "abrir em outra janela"), { href: link, target: "_blank", rel: "noopener" });
    row.append(input, copy, open);
    box.append(row);
  }
  box.append(el("p", "", "Ou preencha o lugar com um robô:"));
  const row = el("div", "bots");
  for (const [level, name, how] of [
    ["tito", "TITO", "fácil"],
    ["carmen", "CARMEN", "médio"],
    ["luna", "LUNA", "difícil"],
  ]) {
    const b = el("button", "bot", `${name} (${how})`);
    b.type = "button";
    b.dataset.action = "bot";
    b.dataset.level = level;
    row.append(b);
  }
  box.append(row);
}

// --- the seats ------------------------------------------------------------------------------------

function part(box, className) {
  return box.querySelector(`:scope > .${className}`) || box.appendChild(el("div", className));
}

function renderSeat(box, s, seat, n) {
  const v = s.view;
  const h = v.hand;
  box.dataset.seat = String(seat);
  const player = v.seats[seat];
  setData(box, "bot", player && player.bot ? player.bot : null);
  const toAct = !!(h && h.to_act === seat && v.status === "playing");
  box.classList.toggle("to-act", toAct);
  const head = part(box, "seat-head");
  const score = v.match ? v.match.scores[seat] : null;
  if (stale(head, seat, n[seat], !!player, v.you, score, h && h.dealer, toAct)) {
    head.replaceChildren(el("span", "seat-name", player ? n[seat] + (v.you === seat ? " (você)" : "") : "lugar livre"));
    if (score !== null) head.append(el("span", "score", `${score} pts`));
    if (h && h.dealer === seat) head.append(el("span", "dealer", "dá as cartas"));
    if (toAct) head.append(el("span", "turn", "vez"));
  }
  const body = part(box, "seat-body");
  if (!h) {
    if (stale(body, null)) body.replaceChildren();
    return;
  }
  if (v.you !== null && seat === v.you) {
    renderMyHand(body, s);
    return;
  }
  // Another seat: card backs, and the cards it took from the discard pile (R11.1).
  const known = h.known[seat] || [];
  const count = h.card_counts[seat];
  if (!stale(body, "other", known, count)) return;
  const row = el("div", "other-hand");
  for (const card of known) row.append(cardEl(card, { className: "known mini", tag: "pegou" }));
  for (let i = known.length; i < count; i += 1) row.append(backEl("small"));
  const caption = `${count} cartas${known.length ? `, ${known.length} conhecida${known.length > 1 ? "s" : ""}` : ""}`;
  body.replaceChildren(row, el("div", "caption", caption));
}

/** The person's hand: ORGANIZAR's groups (or suit order), each card an element kept for as long
 * as the card is in the hand; a new tap on it only moves the ``selected`` class. */
function renderMyHand(body, s) {
  const h = s.view.hand;
  const arrangement = h.my_arrangement;
  const cards = h.my_cards || [];
  let tools = body.querySelector(":scope > .hand-tools");
  let hand = body.querySelector(":scope > #hand");
  if (!tools || !hand) {
    body.replaceChildren();
    body.__drawnFrom = undefined;
    tools = body.appendChild(el("div", "hand-tools"));
    tools.append(Object.assign(el("span", "sobra"), { id: "sobra" }));
    hand = body.appendChild(Object.assign(el("div", "hand"), { id: "hand" }));
  }
  $("sobra").textContent = `SOBRA ${arrangement ? arrangement.points : "–"}`;
  buttons(tools, [["organize", "ORGANIZAR", s.arranged ? "toggle on" : "toggle"]]);
  tools.querySelector("[data-action=organize]").setAttribute("aria-pressed", String(s.arranged));
  const groups = handGroups(cards, arrangement, s.arranged);
  if (stale(hand, groups)) {
    const kept = new Map([...hand.querySelectorAll(".card[data-card]")].map((c) => [c.dataset.card, c]));
    const make = (card) => {
      const node = kept.get(card) || cardEl(card, { button: true });
      node.tabIndex = 0;
      node.draggable = true;
      return node;
    };
    const drawn = groups.map(([className, title, group]) => {
      const box = el("div", `group ${className}`);
      if (title) box.append(el("div", "group-title", title));
      const row = el("div", "group-cards");
      row.append(...group.map(make));
      box.append(row);
      return box;
    });
    hand.replaceChildren(...drawn);
  }
  for (const card of hand.querySelectorAll(".card[data-card]")) card.classList.toggle("selected", card.dataset.card === s.selected);
}

function handGroups(cards, arrangement, arranged) {
  if (!arranged || !arrangement) return [["plain", "", [...cards].sort(bySuit)]];
  const groups = [];
  const placed = new Set();
  for (const meld of arrangement.melds) {
    groups.push(["meld", "jogo", meld]);
    meld.forEach((c) => placed.add(c));
  }
  if (arrangement.discard) placed.add(arrangement.discard);
  arrangement.deadwood.forEach((c) => placed.add(c));
  const rest = [...arrangement.deadwood, ...cards.filter((c) => !placed.has(c))].sort(bySuit);
  if (rest.length) groups.push(["deadwood", "soltas", rest]);
  if (arrangement.discard) groups.push(["suggested", "descarte", [arrangement.discard]]);
  return groups;
}

// --- the piles and the buttons ----------------------------------------------------------------------

function renderCenter(s) {
  const h = s.view.hand;
  $("center").hidden = !h;
  if (!h) return;
  const count = $("stock-count");
  count.textContent = String(h.stock_count);
  count.classList.toggle("low", h.stock_count <= 4);
  const pile = h.discard_pile;
  const discard = $("discard");
  discard.dataset.count = String(pile.length);
  const top = $("discard-top");
  if (stale(top, pile.length ? pile[pile.length - 1] : null)) {
    top.replaceChildren(pile.length ? cardEl(pile[pile.length - 1]) : el("div", "card empty"));
  }
  const historyBox = $("discard-history");
  const shown = pile.slice(-9, -1).reverse();
  if (stale(historyBox, shown)) historyBox.replaceChildren(...shown.map((card) => cardEl(card, { className: "mini" })));
  const mine = myTurn(s);
  const offers = legal(s);
  $("stock").classList.toggle("can", mine && offers.some((c) => c.type === "draw" && c.source === "stock"));
  discard.classList.toggle(
    "can",
    mine && offers.some((c) => c.type === "take_upcard" || (c.type === "draw" && c.source === "discard") || c.type === "discard"),
  );
}

function renderActions(s) {
  const v = s.view;
  const wanted = [];
  if (v.you !== null) {
    const offers = legal(s);
    if (offered(s, "take_upcard")) wanted.push(["take_upcard", "PEGAR A ABERTA"]);
    if (offered(s, "pass_upcard")) wanted.push(["pass_upcard", "PASSAR"]);
    if (offers.some((c) => c.type === "draw" && c.source === "stock")) wanted.push(["draw-stock", "COMPRAR DO MONTE"]);
    if (offers.some((c) => c.type === "draw" && c.source === "discard")) wanted.push(["draw-discard", "COMPRAR DO DESCARTE"]);
    const knock = knockChoice(s);
    if (knock) {
      const gin = knock.deadwood === 0;
      const which = knock.card ? ` com ${label(knock.card)}` : "";
      wanted.push([gin ? "gin" : "knock", `${gin ? "GIN" : "BATER"}${which}`, "strong", gin ? "sem sobra" : `sobra ${knock.deadwood}`]);
    }
    if (offered(s, "big_gin")) wanted.push(["big_gin", "BIG GIN", "strong"]);
    if (offered(s, "claim_absence")) wanted.push(["claim_absence", "ENCERRAR POR AUSÊNCIA", "warn"]);
    if (offered(s, "rematch")) wanted.push(["rematch", rematchText(s), "strong"]);
    if (offered(s, "decline_rematch")) wanted.push(["decline_rematch", "RECUSAR REVANCHE"]);
    if (v.status === "match_over" && offered(s, "leave")) wanted.push(["leave", "SAIR DA MESA"]);
    if (offered(s, "resign")) {
      if (s.confirmResign) wanted.push(["resign-confirm", "SIM, DESISTIR", "warn"], ["resign-cancel", "NÃO"]);
      else wanted.push(["resign", "DESISTIR", "quiet"]);
    }
  }
  buttons($("actions"), wanted);
}

function renderLog(s) {
  const box = $("log");
  const lines = s.log.slice(-LOG_LINES);
  if (stale(box, lines)) box.replaceChildren(...lines.map((line) => el("li", "", line)));
}

// --- chat (R10.5) --------------------------------------------------------------------------------

function renderChat(s) {
  const list = $("chat-log");
  const shownUpTo = list.__shownUpTo || 0;
  // Lines are appended as messages come; a message read back older than the newest shown (a
  // gap filled) makes the ones up to it differ from the lines drawn: the list is drawn anew.
  const upToShown = s.chat.filter((m) => m.seq <= shownUpTo).length;
  if (list.__table !== s.table || upToShown !== list.childElementCount) {
    list.replaceChildren();
    list.__table = s.table;
    list.__shownUpTo = 0;
  }
  const fresh = s.chat.filter((m) => m.seq > (list.__shownUpTo || 0));
  if (fresh.length) {
    for (const m of fresh) {
      const item = el("li");
      item.append(el("b", "", `${m.name}: `), document.createTextNode(m.text));
      list.append(item);
    }
    list.__shownUpTo = fresh[fresh.length - 1].seq;
    list.scrollTop = list.scrollHeight;
  }
  const v = s.view;
  const form = $("chat-form");
  const why = $("chat-why");
  let reason = null;
  if (v.you === null) reason = "Você está assistindo: quem assiste lê a conversa, mas não escreve. Só quem está sentado à mesa conversa.";
  else if (v.status === "closed" || v.status === "expired") reason = "A mesa está fechada: a conversa fica para leitura.";
  why.hidden = reason === null;
  why.textContent = reason || "";
  for (const field of form.elements) field.disabled = reason !== null;
}

// --- the boards -----------------------------------------------------------------------------------

function renderBoard(s) {
  const overlay = $("board");
  const board = s.boards[0];
  overlay.hidden = !board;
  if (!board) return;
  const content = $("board-content");
  const n = names(s);
  const revealed = board.kind === "match" && s.revealed && s.revealed.match === board.record.match ? s.revealed : null;
  if (stale(content, board, n, revealed)) {
    content.replaceChildren(board.kind === "hand" ? handBoard(board.record, n) : matchBoard(board.record, n));
    if (revealed) content.append(handBoard(revealed, n));
  }
  const wanted = [];
  if (board.kind === "match" && s.view && s.view.status === "match_over" && s.view.you !== null) {
    if (offered(s, "rematch")) wanted.push(["rematch", rematchText(s), "strong"]);
    if (offered(s, "decline_rematch")) wanted.push(["decline_rematch", "RECUSAR REVANCHE"]);
  }
  wanted.push(["close-board", board.kind === "hand" ? "CONTINUAR" : "VER A MESA"]);
  buttons($("board-actions"), wanted);
}
