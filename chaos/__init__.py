"""``make chaos``: the whole backend as processes on throwaway servers, played while faults hit.

See ``chaos/run.py``; ``python -m chaos`` runs it and prints its report (one JSON object).
"""
