"""``python -m services.chat``: run the chat service (``migrate`` to only migrate).

It answers on ``GIN_HTTP_PORT``, or on 8081 when that is not set (docs/DESIGN.md section 6: the
table service has 8080).
"""

from services.chat.app import create_app, migrate
from shared.infra.service import main

if __name__ == "__main__":
    main(create_app, migrate, default_port=8081, verifies_tokens=True)
