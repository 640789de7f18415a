"""The bot tests use the real table service fixtures of tests/table."""

from tests.table.conftest import api, clock, table_client

__all__ = ["api", "clock", "table_client"]
