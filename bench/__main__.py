"""``python -m bench``: every benchmark, one JSON object per line.

``python -m bench engine`` or ``python -m bench table`` runs one group.
"""

import sys

from bench import engine, table_load

groups = sys.argv[1:] or ["engine", "table"]
if "engine" in groups:
    engine.main()
if "table" in groups:
    table_load.main()
