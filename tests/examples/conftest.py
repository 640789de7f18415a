"""The example subscriber runs against the real table service (tests/table's fixtures)."""

from tests.table.conftest import api, clock, db, table_client

__all__ = ["api", "clock", "db", "table_client"]
