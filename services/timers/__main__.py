"""``python -m services.timers``: run the timer service (``migrate`` to only migrate)."""

from aiohttp import web

from services.timers.app import create_app, migrate
from services.timers.deadlines import BadReminders
from shared.infra.service import main, refuse
from shared.infra.settings import Settings


def create_checked_app(settings: Settings) -> web.Application:
    """The service, or an exit with one line naming the setting it cannot keep."""
    try:
        return create_app(settings)
    except BadReminders as exc:
        refuse(str(exc), settings)


if __name__ == "__main__":
    main(create_checked_app, migrate)
