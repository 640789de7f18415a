// "Minhas mesas": the person's tables in the lobby, kept current by the player socket
// (GET /v1/players/me/ws). Pure: the list and the frames in, the new list out; the sentences
// a row shows, given the moment to count from. No DOM, fetch, timer or clock.
//
// Runs as it is in the browser and in node (web/tests/).

const OPEN = ["waiting", "playing", "match_over"];

/** The page's order: the tables where it is my turn first, then the turn that has waited
 * longest, then the tables with no turn running (waiting for an opponent, a match over), by
 * table id: the server's (docs/DESIGN.md, "The caller's tables") but for those last. */
export function compareTables(a, b) {
  if (a.my_turn !== b.my_turn) return a.my_turn ? -1 : 1;
  const since = (e) => (e.turn_since ? Date.parse(e.turn_since) : Number.POSITIVE_INFINITY);
  const x = since(a);
  const y = since(b);
  if (x !== y) return x < y ? -1 : 1;
  return a.table_id < b.table_id ? -1 : a.table_id > b.table_id ? 1 : 0;
}

/** The list after one frame of the player socket: ``tables`` (the first frame after every
 * (re)connection) is the whole list; ``table`` replaces or adds one entry, and takes a
 * finished table off. Anything else leaves the list as it was (the same array). */
export function reduceTables(list, frame) {
  if (!frame || typeof frame !== "object") return list;
  if (frame.kind === "tables" && Array.isArray(frame.tables)) {
    return frame.tables.filter((e) => OPEN.includes(e.status)).sort(compareTables);
  }
  if (frame.kind === "table" && frame.table && frame.table.table_id) {
    const entry = frame.table;
    const others = list.filter((e) => e.table_id !== entry.table_id);
    if (!OPEN.includes(entry.status)) return others;
    return [...others, entry].sort(compareTables);
  }
  return list;
}

/** The list after a later page of it (``GET /v1/players/me/tables?after=``, read after the
 * ``tables`` frame, which holds the first page): each entry added as a ``table`` frame's is,
 * but for the tables in ``told`` (those a ``table`` frame told of since the paging began: the
 * frame is newer than the page). */
export function addPage(list, entries, told) {
  let next = list;
  for (const entry of entries) {
    if (entry && entry.table_id && !told.has(entry.table_id)) next = reduceTables(next, { kind: "table", table: entry });
  }
  return next;
}

/** How long ago, in Portuguese: "agora", "há 5 min", "há 3 h", "há 2 dias". */
export function ago(iso, nowMs) {
  const ms = Math.max(0, nowMs - Date.parse(iso));
  const minutes = Math.floor(ms / 60000);
  if (minutes < 1) return "agora";
  if (minutes < 60) return `há ${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `há ${hours} h`;
  return `há ${Math.floor(hours / 24)} dias`;
}

/** How long until, in Portuguese: "em 5 min", "em 45 h", "em 3 dias", or "já" when past. */
export function until(iso, nowMs) {
  const ms = Date.parse(iso) - nowMs;
  if (ms <= 0) return "já";
  const minutes = Math.ceil(ms / 60000);
  if (minutes < 60) return `em ${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 72) return `em ${hours} h`;
  return `em ${Math.floor(hours / 24)} dias`;
}

const seatName = (entry, seat) => (entry.seats[seat] ? entry.seats[seat].name : null);

/** What one row says: the opponent, whose turn and since when, the score, the deadline. */
export function describe(entry, nowMs) {
  const other = 1 - entry.you;
  const opponent = seatName(entry, other) || "ninguém ainda";
  let turn;
  if (entry.status === "waiting") turn = "Esperando adversário";
  else if (entry.status === "match_over") turn = "Partida encerrada";
  else if (entry.my_turn) turn = "Sua vez";
  else if (entry.to_act !== null) turn = `Vez de ${seatName(entry, entry.to_act) || "adversário"}`;
  else turn = "Em jogo";
  const since = entry.turn_since ? ago(entry.turn_since, nowMs) : "";
  const score = `${entry.scores[entry.you]} × ${entry.scores[other]}`;
  let deadline = "";
  if (entry.absence_claimable_at && !entry.my_turn) {
    deadline = `ausência ${until(entry.absence_claimable_at, nowMs)}`;
  } else if (entry.absence_claimable_at) {
    deadline = `jogue ${until(entry.absence_claimable_at, nowMs)}`;
  } else if (entry.expires_at) {
    deadline = `expira ${until(entry.expires_at, nowMs)}`;
  }
  return { opponent: `contra ${opponent}`, turn, since, score, deadline };
}
