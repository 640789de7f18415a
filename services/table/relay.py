"""``python -m services.table.relay``: the table's outbox relay as a process of its own, for
replicas run with ``GIN_RELAY_APART`` (``create_relay_app``)."""

from services.table.app import create_relay_app
from shared.infra.service import main

if __name__ == "__main__":
    main(create_relay_app)
