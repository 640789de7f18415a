"""``python -m bench``: every benchmark, one JSON object per line.

``python -m bench engine``, ``python -m bench table``, ``python -m bench spectators``,
``python -m bench backend`` (every service as a process: bench/backend.py),
``python -m bench my_tables`` (bench/my_tables.py: a player's list among 100,000 tables),
``python -m bench tracing`` (the cost of tracing, off and sampled: bench/tracing.py) or
``python -m bench bots`` or ``python -m bench season`` (bench/season.py) runs one group. The
bots group (whole tournaments) and the season group (a season of data filled in a database,
far longer than the others) run by default only when ``BENCH_BOTS_MATCHES`` and
``BENCH_SEASON_EVENTS`` are set, and after the others, so they never share their timing.
"""

import os
import signal
import sys

from bench import backend, bots, engine, my_tables, season, spectators, table_load, tracing

# A stopped bench (SIGTERM, as ``kill`` sends) cleans up as Ctrl-C does: its service stopped,
# its database and broker objects dropped. Python's default would leave the service running.
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

groups = sys.argv[1:] or ["engine", "table", "spectators", "backend", "my_tables", "tracing"] + (
    ["bots"] if os.environ.get("BENCH_BOTS_MATCHES") else []
) + (["season"] if os.environ.get("BENCH_SEASON_EVENTS") else [])
if "engine" in groups:
    engine.main()
if "table" in groups:
    table_load.main()
if "spectators" in groups:
    spectators.main()
if "backend" in groups:
    backend.main()
if "my_tables" in groups:
    my_tables.main()
if "tracing" in groups:
    tracing.main()
if "bots" in groups:
    bots.main()
if "season" in groups:
    season.main()
