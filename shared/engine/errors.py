"""The one error every refused action raises."""

from __future__ import annotations


class IllegalAction(Exception):
    """An action the rules refuse: a stable ``code``, a message and the rule it breaks.

    Raised before anything changes, so the state the caller holds is still valid.
    """

    def __init__(self, code: str, message: str, rule: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.rule = rule

    def __repr__(self) -> str:
        return f"IllegalAction({self.code!r}, {self.message!r}, {self.rule!r})"
