"""``python -m services.table``: run the table service (``migrate`` to only migrate)."""

from services.table.app import create_app, migrate
from shared.infra.service import main

if __name__ == "__main__":
    main(create_app, migrate, verifies_tokens=True)
