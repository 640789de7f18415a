// Hollywood gin's score sheet (docs/RULES.md R9.6 to R9.12): the three games as columns, read
// from the view's ``match.games``, a hand_ended record's ``games`` and ``scored_in``, or a
// match_ended record's ``games`` and summed ``tally``. Pure: what to write, not the DOM.

const TALLY_ROWS = [
  ["Pontos", "points"],
  ["Mãos (caixas)", "hands_won"],
  ["Bônus da partida", "game_bonus"],
  ["Bônus de mão", "box_bonus"],
  ["Total", "total"],
];

function hands(count) {
  return `${count} ${count === 1 ? "mão" : "mãos"}`;
}

/** The columns of ``games`` (each: title, closed, its status line, per seat the points and
 * boxes, and each seat's total once the game closed); [] when there are none. */
export function gameColumns(games, names) {
  return (games || []).map((g) => ({
    game: g.game,
    title: `Jogo ${g.game}`,
    closed: !!g.closed,
    status: g.closed && g.winner !== null && g.winner !== undefined ? `${names[g.winner]} venceu` : "em jogo",
    seats: [0, 1].map((seat) => ({
      points: g.scores[seat],
      boxes: g.boxes[seat],
      text: `${g.scores[seat]} pts · ${hands(g.boxes[seat])}`,
      total: g.tally ? g.tally[seat].total : null,
    })),
  }));
}

/** The sentence of which games a hand's points went into (R9.7), or null when the record is
 * not a Hollywood one or nobody won the hand. */
export function scoredInText(record) {
  const games = record.scored_in;
  if (!Array.isArray(games) || record.winner === null || record.winner === undefined) return null;
  if (!games.length) return "Os pontos desta mão não entraram em nenhum jogo: os jogos dela já fecharam.";
  if (games.length === 1) return `Os pontos entraram no jogo ${games[0]}.`;
  const list = `${games.slice(0, -1).join(", ")} e ${games[games.length - 1]}`;
  return `Os pontos entraram nos jogos ${list}.`;
}

/** Whether ``result`` (a match_ended record) is a Hollywood one, with its games. */
function hasGames(result) {
  return !!result && Array.isArray(result.games) && result.games.length > 0;
}

/** The final tally of a Hollywood match (R9.11): per seat, each row's value in games 1, 2, 3
 * and the sum (the match's own tally); null for a match without games. */
export function hollywoodTally(result) {
  if (!hasGames(result)) return null;
  const head = [...result.games.map((g) => `Jogo ${g.game}`), "Soma"];
  const seats = [0, 1].map((seat) => ({
    seat,
    rows: TALLY_ROWS.map(([title, key]) => ({
      title,
      key,
      cells: [...result.games.map((g) => (g.tally ? g.tally[seat][key] : 0)), result.tally[seat][key]],
    })),
  }));
  return { head, seats };
}

/** The match-end sentence of a Hollywood match won at the target (R9.11), or null. */
export function hollywoodEnding(result, names) {
  if (!hasGames(result)) return null;
  if (result.reason !== "target" || result.winner === null || result.winner === undefined) return null;
  const won = result.games.filter((g) => g.winner === result.winner).length;
  const how = won === result.games.length ? "os três jogos" : `${won} dos três jogos`;
  return `${names[result.winner]} venceu ${how} e a partida!`;
}
