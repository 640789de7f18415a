"""``python -m services.timers``: run the timer service (``migrate`` to only migrate)."""

from services.timers.app import create_checked_app, migrate
from shared.infra.service import main

if __name__ == "__main__":
    main(create_checked_app, migrate)
