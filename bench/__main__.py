"""``python -m bench``: every benchmark, one JSON object per line."""

from bench import engine

engine.main()
