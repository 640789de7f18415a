"""Every refusal's message in English and Brazilian Portuguese (shared/contracts/messages.py).

The codes are found twice: by walking the catalogue, and by reading the services' source for
the code and message of every refusal they raise, so a new code, or a new text of an old one,
without its translation fails here.
"""

from __future__ import annotations

import ast
import string
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.table.http import REJECTED_STATUS
from shared.contracts.messages import (
    CATALOGUE,
    ENGLISH,
    PORTUGUESE,
    language_of,
    translated,
    variant_of,
)
from shared.infra.web import AIOHTTP_CODES

ROOT = Path(__file__).resolve().parents[2]
# The calls that raise or answer a refusal: where the code and the message are among the
# arguments (``None`` for a code fixed by the kind of exception).
REFUSALS: dict[str, tuple[int | str | None, int | str]] = {
    "Refused": (1, 2),
    "Rejected": (0, 1),
    "IllegalAction": (0, 1),
    "ErrorDetail": ("code", "message"),
    "_unavailable": (0, 1),
    "_in_phase": (2, 3),
    "AuthError": (None, 0),
    "InvalidText": (None, 0),
}
FIXED_CODE = {"AuthError": "unauthorized", "InvalidText": "invalid_text"}


def _argument(call: ast.Call, where: int | str) -> ast.expr | None:
    if isinstance(where, int):
        return call.args[where] if len(call.args) > where else None
    return next((k.value for k in call.keywords if k.arg == where), None)


def _sample(node: ast.expr) -> str | None:
    """A message the expression can make: a literal as it is, an f-string with each of its
    values replaced by a stand-in; None for any other expression."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("X1")
        return "".join(parts)
    return None


def raised() -> Iterator[tuple[str, str, str | None]]:
    """(where, code, a message it can carry or None) for every refusal in the source."""
    for path in sorted([*ROOT.glob("shared/**/*.py"), *ROOT.glob("services/**/*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name not in REFUSALS:
                continue
            code_at, message_at = REFUSALS[name]
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if code_at is None:
                code: str | None = FIXED_CODE[name]
            else:
                code_node = _argument(node, code_at)
                code = (
                    code_node.value
                    if isinstance(code_node, ast.Constant) and isinstance(code_node.value, str)
                    else None
                )
            message_node = _argument(node, message_at)
            if code is not None:
                yield where, code, _sample(message_node) if message_node else None


def test_the_source_is_read() -> None:
    codes = {code for _, code, _ in raised()}
    assert {"stale_version", "not_your_turn", "invalid_text", "unauthorized"} <= codes


def test_every_code_the_services_raise_has_both_languages() -> None:
    codes = {code for _, code, _ in raised()}
    codes |= set(AIOHTTP_CODES.values()) | {"bad_request", "rate_limited"}
    codes |= set(REJECTED_STATUS)
    missing = sorted(code for code in codes if code not in CATALOGUE)
    assert not missing, f"codes without a message in shared/contracts/messages.py: {missing}"


@pytest.mark.parametrize(("where", "code", "message"), list(raised()))
def test_every_message_raised_is_read_by_a_template_of_its_code(
    where: str, code: str, message: str | None
) -> None:
    if message is None:  # passed on from elsewhere (str(exc)): read where it is made
        return
    assert variant_of(code, message) is not None, (
        f"{where}: {code} {message!r} has no template in shared/contracts/messages.py"
    )


@pytest.mark.parametrize("code", sorted(CATALOGUE))
def test_every_variant_has_both_languages_and_the_same_placeholders(code: str) -> None:
    assert CATALOGUE[code], code
    for text in CATALOGUE[code]:
        assert text.en.strip(), (code, text)
        assert text.pt.strip(), (code, text)
        names = [
            {field for _, field, _, _ in string.Formatter().parse(template) if field}
            for template in (text.en, text.pt)
        ]
        assert names[0] == names[1], (code, text)


@pytest.mark.parametrize(
    ("header", "language"),
    [
        (None, ENGLISH),
        ("", ENGLISH),
        ("pt-BR,pt;q=0.9,en;q=0.8", PORTUGUESE),
        ("pt", PORTUGUESE),
        ("pt-PT", PORTUGUESE),
        ("PT-br", PORTUGUESE),
        ("en-US,en;q=0.9", ENGLISH),
        ("fr-FR, de;q=0.8", ENGLISH),
        ("fr, pt;q=0.5", PORTUGUESE),
        ("en;q=0.4, pt-BR;q=0.6", PORTUGUESE),
        ("pt-BR;q=0.5, en", ENGLISH),
        ("pt;q=0, fr", ENGLISH),
        ("pt;q=nan", ENGLISH),
        ("pt;q=x", ENGLISH),
        ("*", ENGLISH),
        ("portuguese", ENGLISH),
    ],
)
def test_the_language_follows_accept_language_by_quality(header: str | None, language: str) -> None:
    assert language_of(header) == language


def test_placeholders_are_filled_in_portuguese() -> None:
    message = "the table is at version 12, not 11"
    assert translated("stale_version", message, ENGLISH) == message
    assert translated("stale_version", message, PORTUGUESE) == "a mesa está na versão 12, não na 11"
    assert (
        translated("invalid_request", "after is a whole number from 0 to 9", PORTUGUESE)
        == "after é um número inteiro de 0 a 9"
    )


def test_each_rate_limit_is_named_in_portuguese() -> None:
    for action in ("tables", "joins", "commands", "refusals", "preferences", "sockets"):
        message = f"too many {action}: try again in a moment"
        assert action not in translated("rate_limited", message, PORTUGUESE)
    assert (
        translated("rate_limited", "too many hops: try again in a moment", PORTUGUESE)
        == "pedidos demais (hops): tente de novo daqui a pouco"
    )


@pytest.mark.parametrize(
    ("code", "message", "portuguese"),
    [
        (
            "invalid_request",
            "Expected `int`, got `str` - at `$.expected_version`",
            "esperava `int`, veio `str` - em `$.expected_version`",
        ),
        (
            "invalid_request",
            "Object missing required field `invite_code`",
            "falta o campo obrigatório `invite_code`",
        ),
        (
            "invalid_request",
            "Expected `str` of length <= 500 - at `$.text`",
            "esperava `str` de comprimento <= 500 - em `$.text`",
        ),
        ("invalid_request", "Expected `int` >= 0", "esperava `int` >= 0"),
        (
            "invalid_request",
            "straight_gin and oklahoma set the knock limit two ways: choose one - at `$.options`",
            "straight_gin e oklahoma dão o limite para bater de dois jeitos: escolha um"
            " - em `$.options`",
        ),
        (
            "unknown_command",
            "Invalid value 'fold' - at `$.type`",
            "esse comando não existe: 'fold' não é um valor aceito - em `$.type`",
        ),
    ],
)
def test_msgspec_refusals_are_read_in_portuguese(code: str, message: str, portuguese: str) -> None:
    assert translated(code, message, PORTUGUESE) == portuguese


def test_a_message_no_template_reads_stays_in_english() -> None:
    assert translated("stale_version", "something new", PORTUGUESE) == "something new"
    assert translated("no_such_code", "something new", PORTUGUESE) == "something new"
