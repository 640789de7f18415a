"""``python -m chaos``: exit 0 when every count of the report is 0, else 1."""

import asyncio
import sys

from chaos.run import main

sys.exit(asyncio.run(main()))
