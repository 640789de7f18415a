"""``python -m services.bots``: run a bot worker (TITO, CARMEN and LUNA) until SIGTERM."""

from services.bots.app import create_app
from shared.infra.service import main

if __name__ == "__main__":
    main(create_app)
