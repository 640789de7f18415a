"""Every refusal's message in English and in Brazilian Portuguese, keyed by its ``code``.

The code is the contract (clients and bots branch on it); the message is for the person who
reads it, in the language their ``Accept-Language`` asks for, English when none matches.

Each code has one or more variants, each an English template and its Portuguese. A template's
English is the very text the service raises today, with a named placeholder (``{name}``)
where the text varies; the English message a refusal carries is read back against its code's
templates to find the variant and the values of its placeholders, and the Portuguese template
is filled with them. A message no template reads is answered as it is, in English.
"""

from __future__ import annotations

import re
from functools import cache
from typing import NamedTuple

ENGLISH = "en"
PORTUGUESE = "pt-BR"
LANGUAGES = (ENGLISH, PORTUGUESE)


class Text(NamedTuple):
    """One variant of a code's message: the English template and the Portuguese one."""

    en: str
    pt: str


def _at_path(*texts: Text, prefix: str = "") -> tuple[Text, ...]:
    """msgspec's own messages of a body it refuses, each also with the JSON path it names."""
    at = (" - at `{path}`", " - em `{path}`")
    with_path = [Text(t.en + at[0], prefix + t.pt + at[1]) for t in texts]
    return (*with_path, *(Text(t.en, prefix + t.pt) for t in texts))


# How msgspec says a body does not fit its contract (``msgspec.ValidationError``).
_DECODING = (
    Text("Expected `{expected}`, got `{got}`", "esperava `{expected}`, veio `{got}`"),
    Text("Object missing required field `{field}`", "falta o campo obrigatório `{field}`"),
    Text("Object contains unknown field `{field}`", "o campo `{field}` não existe"),
    Text("Invalid enum value {value}", "{value} não é um dos valores aceitos"),
    Text("Invalid value {value}", "{value} não é um valor aceito"),
    Text(
        "Expected `{expected}` of length {bound}",
        "esperava `{expected}` de comprimento {bound}",
    ),
    Text(
        "Expected `{expected}` matching regex {pattern}",
        "esperava `{expected}` que siga a expressão regular {pattern}",
    ),
    Text("Expected `{expected}` {bound}", "esperava `{expected}` {bound}"),
)

# Most specific variants first: a template that is only a placeholder reads any message.
CATALOGUE: dict[str, tuple[Text, ...]] = {
    # --- the edge every service shares (shared/infra/web.py, auth.py, serving.py) --------
    "invalid_table_id": (
        Text(
            "a table id is 1 to 64 of the characters A-Z a-z 0-9 _ -",
            "o id de uma mesa tem de 1 a 64 dos caracteres A-Z a-z 0-9 _ -",
        ),
    ),
    "invalid_request": (
        Text(
            "{name} is a whole number from {low} to {high}",
            "{name} é um número inteiro de {low} a {high}",
        ),
        Text("a value is not valid", "um valor não é válido"),
        Text(
            "the player socket takes no messages: it only sends",
            "a conexão do jogador não recebe mensagens: só envia",
        ),
        Text(
            "send each message as a text frame of JSON, not a binary frame",
            "mande cada mensagem como um quadro de texto com JSON, não um quadro binário",
        ),
        *_at_path(
            Text(
                "straight_gin and oklahoma set the knock limit two ways: choose one",
                "straight_gin e oklahoma dão o limite para bater de dois jeitos: escolha um",
            ),
            *_DECODING,
        ),
        Text("{detail}", "o pedido não é válido: {detail}"),
    ),
    "invalid_cursor": (
        Text(
            "cursor is not one this list gave you",
            "o cursor não é um que esta lista tenha dado a você",
        ),
    ),
    "invalid_list_status": (
        Text(
            "status is one of open, finished, all",
            "o status é um destes: open, finished, all",
        ),
    ),
    "malformed_json": (
        Text("the JSON is nested too deeply", "o JSON tem aninhamento profundo demais"),
        Text("the body is not JSON: {detail}", "o corpo do pedido não é JSON: {detail}"),
    ),
    "rate_limited": (
        Text(
            "too many tables: try again in a moment",
            "mesas criadas demais: tente de novo daqui a pouco",
        ),
        Text(
            "too many joins: try again in a moment",
            "entradas em mesas demais: tente de novo daqui a pouco",
        ),
        Text(
            "too many commands: try again in a moment",
            "comandos demais: tente de novo daqui a pouco",
        ),
        Text(
            "too many refusals: try again in a moment",
            "comandos recusados demais: tente de novo daqui a pouco",
        ),
        Text(
            "too many preferences: try again in a moment",
            "mudanças de preferência demais: tente de novo daqui a pouco",
        ),
        Text(
            "too many sockets: try again in a moment",
            "conexões demais: tente de novo daqui a pouco",
        ),
        Text(
            "too many lists: try again in a moment",
            "listas de mesas demais: tente de novo daqui a pouco",
        ),
        Text(
            "too many {action}: try again in a moment",
            "pedidos demais ({action}): tente de novo daqui a pouco",
        ),
    ),
    "unauthorized": (
        Text(
            "this route needs 'Authorization: Bearer <token>'",
            "esta rota pede 'Authorization: Bearer <token>'",
        ),
        Text(
            "connect with ?token=... to send commands",
            "conecte com ?token=... para mandar comandos",
        ),
        Text(
            "the Authorization header has characters a token never has (only printable ASCII)",
            "o cabeçalho Authorization tem caracteres que um token nunca tem (só ASCII imprimível)",
        ),
        Text(
            "use the header 'Authorization: Bearer <token>'",
            "use o cabeçalho 'Authorization: Bearer <token>'",
        ),
        Text(
            "the Authorization header has spaces inside its token",
            "o cabeçalho Authorization tem espaços dentro do token",
        ),
        Text("the token has expired", "o token expirou"),
        Text(
            "the token is not valid: longer than {limit} characters",
            "o token não é válido: tem mais de {limit} caracteres",
        ),
        Text(
            "the token is not valid: a token is three unpadded base64url parts joined by '.'"
            " (letters, digits, '-', '_')",
            "o token não é válido: um token são três partes em base64url sem preenchimento,"
            " unidas por '.' (letras, dígitos, '-', '_')",
        ),
        Text(
            "the token is not valid: it has no '{claim}' claim",
            "o token não é válido: falta a declaração '{claim}'",
        ),
        Text(
            "the token is not valid: it is not from this site's issuer",
            "o token não é válido: não foi emitido por este site",
        ),
        Text(
            "the token is not valid: it is not meant for this site",
            "o token não é válido: não é destinado a este site",
        ),
        Text(
            "the token is not valid: its algorithm is not {algorithm}",
            "o token não é válido: o algoritmo dele não é {algorithm}",
        ),
        Text(
            "the token is not valid: 'exp' is not a number of seconds",
            "o token não é válido: 'exp' não é um número de segundos",
        ),
        Text(
            "the token is not valid: its subject is not a short printable text",
            "o token não é válido: o sujeito dele não é um texto curto e imprimível",
        ),
        Text(
            "the token is not valid: its name is not a short printable text",
            "o token não é válido: o nome dele não é um texto curto e imprimível",
        ),
        Text(
            "the token is not valid: a claim has the wrong type",
            "o token não é válido: uma declaração tem o tipo errado",
        ),
        Text("the token is not valid: {detail}", "o token não é válido: {detail}"),
    ),
    "request_timeout": (
        Text(
            "the request's body did not arrive whole within {seconds} s",
            "o corpo do pedido não chegou inteiro em {seconds} s",
        ),
        Text(
            "the request's headers did not arrive whole within {seconds} s",
            "os cabeçalhos do pedido não chegaram inteiros em {seconds} s",
        ),
    ),
    "busy": (
        Text(
            "the service is busy: try again shortly",
            "o serviço está ocupado: tente de novo em instantes",
        ),
    ),
    "database_unavailable": (
        Text("the database is unavailable", "o banco de dados está fora do ar"),
    ),
    # aiohttp's own refusals (``AIOHTTP_CODES``): the reason phrase of the status.
    "no_such_route": (Text("Not Found", "não existe essa rota"),),
    "method_not_allowed": (Text("Method Not Allowed", "essa rota não aceita esse método"),),
    "body_too_large": (
        Text("Request Entity Too Large", "o corpo do pedido é grande demais"),
        Text("Payload Too Large", "o corpo do pedido é grande demais"),
        Text("Content Too Large", "o corpo do pedido é grande demais"),
    ),
    "bad_request": (Text("{detail}", "o pedido não é válido: {detail}"),),
    # --- the table (services/table) --------------------------------------------------------
    "no_such_table": (
        Text("there is no such table", "essa mesa não existe"),
        Text("there is no table {table}", "não existe a mesa {table}"),
        Text("the chat knows no such table", "o chat não conhece essa mesa"),
    ),
    "no_such_hand": (
        Text("no such hand has ended at this table", "nenhuma mão assim terminou nesta mesa"),
    ),
    "archived": (
        Text(
            "this table ended long ago and was archived to {location}; it can be restored",
            "esta mesa terminou há muito tempo e foi arquivada em {location};"
            " ela pode ser restaurada",
        ),
    ),
    "archive_unavailable": (
        Text(
            "the archive of ended tables cannot be read now, so nothing was erased:"
            " try again in a while",
            "o arquivo das mesas encerradas não pode ser lido agora, então nada foi apagado:"
            " tente de novo daqui a pouco",
        ),
    ),
    "unknown_command": (
        Text("{command} is not a seat's command", "{command} não é um comando de jogador"),
        *_at_path(*_DECODING, prefix="esse comando não existe: "),
        Text("{detail}", "esse comando não existe: {detail}"),
    ),
    "timer_expires_only": (
        Text(
            "the timer service only expires tables",
            "o serviço de prazos só encerra mesas paradas",
        ),
    ),
    "not_timer": (
        Text(
            "only the timer service expires a table",
            "só o serviço de prazos encerra uma mesa parada",
        ),
    ),
    "not_a_bot_seat": (Text("that seat is not a bot's", "esse lugar não é de um robô"),),
    "not_seated": (
        Text("spectators watch and do not play", "quem assiste não joga"),
        Text(
            "only a seated player sends commands",
            "só quem está sentado à mesa manda comandos",
        ),
    ),
    "stale_version": (
        Text(
            "the table is at version {version}, not {expected}",
            "a mesa está na versão {version}, não na {expected}",
        ),
    ),
    "table_closed": (
        Text("this table is closed", "esta mesa está encerrada"),
        Text(
            "this table is {status}: its chat is read-only",
            "esta mesa está encerrada ({status}): o chat dela é só para leitura",
        ),
    ),
    "seat_taken": (
        Text(
            "both seats are taken: you can watch this table",
            "os dois lugares estão ocupados: você pode assistir a esta mesa",
        ),
        Text("both seats are taken", "os dois lugares estão ocupados"),
    ),
    "waiting_for_opponent": (
        Text(
            "the match starts when both seats are taken",
            "a partida começa quando os dois lugares estiverem ocupados",
        ),
    ),
    "not_creator": (
        Text(
            "only the table's creator seats a bot",
            "só quem criou a mesa põe um robô para jogar",
        ),
    ),
    "bad_invite_code": (
        Text(
            "this invitation code is not this table's",
            "este código de convite não é desta mesa",
        ),
    ),
    "already_seated": (
        Text("you are seated at this table already", "você já está sentado a esta mesa"),
    ),
    "not_expired": (
        Text("the table is not idle long enough", "a mesa não está parada há tempo suficiente"),
        Text(
            "the last accepted command was {seconds} s ago",
            "o último comando aceito foi há {seconds} s",
        ),
    ),
    # --- the game's rules (shared/engine) --------------------------------------------------
    "unknown_card": (
        Text(
            "{text} is not a card: write rank then suit, like Ah, 7c, Td or 10d",
            "{text} não é uma carta: escreva o valor e depois o naipe, como Ah, 7c, Td ou 10d",
        ),
    ),
    "no_upcard_offer": (
        Text("the upcard is no longer offered", "a carta aberta não está mais em oferta"),
    ),
    "already_drawn": (
        Text(
            "you have drawn already: now discard",
            "você já comprou: agora descarte",
        ),
    ),
    "must_draw_first": (Text("draw a card first", "compre uma carta primeiro"),),
    "no_deal_due": (
        Text("no hand is waiting to be dealt", "nenhuma mão está esperando para ser dada"),
    ),
    "bad_deck": (
        Text("a deck is the 52 cards once each", "um baralho são as 52 cartas, uma de cada"),
    ),
    "bad_lot": (Text("the lot names seat 0 or seat 1", "o sorteio indica o lugar 0 ou o lugar 1"),),
    "match_over": (Text("the match is over", "a partida acabou"),),
    "no_hand": (Text("no hand is in progress", "nenhuma mão está em andamento"),),
    "not_your_turn": (Text("it is not your turn", "não é a sua vez"),),
    "card_not_in_hand": (Text("{card} is not in your hand", "{card} não está na sua mão"),),
    "card_just_taken": (
        Text(
            "{card} was just taken from the discard pile and cannot go back this turn",
            "{card} acabou de sair do descarte e não pode voltar para lá nesta vez",
        ),
    ),
    "upcard_pending": (
        Text(
            "take or pass the upcard first",
            "primeiro pegue a carta aberta ou passe",
        ),
    ),
    "stock_only": (
        Text(
            "both passed the upcard: the first draw is from the stock",
            "os dois passaram a carta aberta: a primeira compra é do monte",
        ),
    ),
    "discard_pile_empty": (Text("the discard pile is empty", "o descarte está vazio"),),
    "no_knock_discard": (
        Text(
            "every card is in the melds sent",
            "todas as cartas estão nos jogos mandados",
        ),
    ),
    "invalid_meld": (
        Text(
            "{cards} is neither a set nor a run",
            "{cards} não é nem trinca nem sequência",
        ),
    ),
    "overlapping_melds": (Text("a card is in two melds", "uma carta está em dois jogos"),),
    "discard_in_meld": (
        Text(
            "the knock discard is in a meld sent",
            "a carta descartada ao bater está num dos jogos mandados",
        ),
    ),
    "knock_over_limit": (
        Text(
            "discarding {card} leaves {deadwood} points of deadwood;"
            " the limit in this hand is {limit}",
            "descartando {card} sobram {deadwood} pontos; o limite para bater nesta mão é {limit}",
        ),
    ),
    "big_gin_off": (
        Text(
            "big gin is off at this table: discard and go gin",
            "nesta mesa não tem big gin: descarte e bata com gin",
        ),
    ),
    "not_big_gin": (
        Text(
            "big gin needs all 11 cards in melds",
            "o big gin pede as 11 cartas em jogos",
        ),
    ),
    "not_absent": (
        Text(
            "the decision is yours, not your opponent's",
            "a decisão é sua, não do seu adversário",
        ),
    ),
    "absence_too_early": (
        Text(
            "your opponent has had the decision for {waited} s; a claim needs more than {after} s",
            "seu adversário está com a decisão há {waited} s;"
            " para encerrar por ausência é preciso mais de {after} s",
        ),
    ),
    "match_not_over": (
        Text(
            "a rematch follows a finished match",
            "a revanche vem depois de uma partida terminada",
        ),
    ),
    "rematch_already_offered": (
        Text("you have offered a rematch", "você já ofereceu uma revanche"),
    ),
    "no_discard": (
        Text(
            "there is no card that may be discarded",
            "não há carta que possa ser descartada",
        ),
    ),
    # --- the chat (services/chat) ----------------------------------------------------------
    "spectators_cannot_chat": (
        Text(
            "only the players seated here write",
            "só os jogadores sentados a esta mesa escrevem",
        ),
    ),
    "too_many_messages": (
        Text(
            "at most {count} messages per {window} s: wait {wait} s",
            "no máximo {count} mensagens a cada {window} s: espere {wait} s",
        ),
    ),
    "chat_catching_up": (
        Text(
            "the chat has not caught up with table version {version} yet: try again",
            "o chat ainda não chegou à versão {version} da mesa: tente de novo",
        ),
    ),
    "invalid_text": (
        Text(
            "a message has at least one character besides spaces",
            "uma mensagem tem pelo menos um caractere além de espaços",
        ),
        Text(
            "a message has at most {limit} characters, not {length}",
            "uma mensagem tem no máximo {limit} caracteres, não {length}",
        ),
        Text(
            "a message has no control character ({character} at {position})",
            "uma mensagem não tem caractere de controle ({character} na posição {position})",
        ),
        Text("a message is valid Unicode text", "uma mensagem é texto Unicode válido"),
    ),
}

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


@cache
def _reader(template: str) -> re.Pattern[str]:
    """A template read backwards: each placeholder a named group of at least one character."""
    parts: list[str] = []
    at = 0
    for found in _PLACEHOLDER.finditer(template):
        parts.append(re.escape(template[at : found.start()]))
        parts.append(f"(?P<{found.group(1)}>.+?)")
        at = found.end()
    parts.append(re.escape(template[at:]))
    return re.compile("".join(parts), re.DOTALL)


def variant_of(code: str, message: str) -> tuple[Text, dict[str, str]] | None:
    """The variant of ``code`` whose English template reads ``message``, and the values of its
    placeholders; None when the code or the message is not in the catalogue."""
    for text in CATALOGUE.get(code, ()):
        found = _reader(text.en).fullmatch(message)
        if found is not None:
            return text, found.groupdict()
    return None


def translated(code: str, message: str, language: str) -> str:
    """``message`` (the English a refusal of ``code`` carries) in ``language``."""
    if language == ENGLISH:
        return message
    found = variant_of(code, message)
    if found is None:
        return message
    text, values = found
    return text.pt.format(**values)


def language_of(accept_language: str | None) -> str:
    """The language an ``Accept-Language`` header asks for among ours, by its q-values:
    Portuguese for any ``pt`` tag, English for any ``en`` tag or ``*``; English when none."""
    if not accept_language:
        return ENGLISH
    ranked: list[tuple[float, int, str]] = []
    for index, item in enumerate(accept_language.split(",")):
        tag, _, rest = item.partition(";")
        quality = 1.0
        for parameter in rest.split(";"):
            name, _, value = parameter.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value.strip())
                except ValueError:
                    quality = 0.0
                if not 0.0 <= quality <= 1.0:  # nan and out of range: as if refused
                    quality = 0.0
        ranked.append((-quality, index, tag.strip().lower()))
    for negative_quality, _, tag in sorted(ranked):
        if negative_quality >= 0:  # q=0 is "not this one"
            break
        if tag == "pt" or tag.startswith("pt-"):
            return PORTUGUESE
        if tag in ("en", "*") or tag.startswith("en-"):
            return ENGLISH
    return ENGLISH
