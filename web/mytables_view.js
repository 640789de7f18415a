// Draws "Minhas mesas" (web/mytables.js's list) into the lobby: one link a table, my turn
// first. The row's facts are also in attributes (``data-table``, ``data-my-turn``,
// ``data-status``) for the browser tests.

import { describe } from "./mytables.js";

function cell(className, text) {
  const span = document.createElement("span");
  span.className = className;
  span.textContent = text;
  return span;
}

/** The list as it is now, drawn again whole (a lobby holds a few dozen rows at most). */
export function renderMyTables(list, nowMs) {
  const ol = document.getElementById("my-tables-list");
  const rows = list.map((entry) => {
    const said = describe(entry, nowMs);
    const li = document.createElement("li");
    li.dataset.table = entry.table_id;
    li.dataset.myTurn = String(entry.my_turn);
    li.dataset.status = entry.status;
    const a = document.createElement("a");
    a.href = `/tables/${entry.table_id}`;
    a.append(
      cell("mt-turn", said.since ? `${said.turn} · ${said.since}` : said.turn),
      cell("mt-score", said.score),
      cell("mt-who", said.opponent),
      cell("mt-deadline", said.deadline),
    );
    li.append(a);
    return li;
  });
  ol.replaceChildren(...rows);
  document.getElementById("my-tables-empty").hidden = list.length > 0;
}
