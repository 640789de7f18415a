"""``python -m bench``: every benchmark, one JSON object per line.

``python -m bench engine``, ``python -m bench table``, ``python -m bench spectators``,
``python -m bench backend`` (every service as a process: bench/backend.py) or
``python -m bench bots`` runs one group. The bots group (whole tournaments, minutes long)
runs by default only when ``BENCH_BOTS_MATCHES`` is set, and after the others, so it never
shares their timing.
"""

import os
import signal
import sys

from bench import backend, bots, engine, spectators, table_load

# A stopped bench (SIGTERM, as ``kill`` sends) cleans up as Ctrl-C does: its service stopped,
# its database and broker objects dropped. Python's default would leave the service running.
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

groups = sys.argv[1:] or ["engine", "table", "spectators", "backend"] + (
    ["bots"] if os.environ.get("BENCH_BOTS_MATCHES") else []
)
if "engine" in groups:
    engine.main()
if "table" in groups:
    table_load.main()
if "spectators" in groups:
    spectators.main()
if "backend" in groups:
    backend.main()
if "bots" in groups:
    bots.main()
