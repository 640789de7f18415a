"""Settings from the environment: every field ``x`` is read from ``GIN_X`` (docs/DESIGN.md 6).

One Struct for every service, so the deployment manifests can be checked against it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

import msgspec

ENV_PREFIX = "GIN_"
# The public default: a service refuses to start with it (or any secret under 32 bytes)
# unless development tokens are on.
DEFAULT_AUTH_SECRET = "dev-only-secret-change-me-before-production"


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a service reads from its environment, with local defaults."""

    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    prefix: str = ""  # put before every exchange and queue name (tests, shared brokers)
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    # Connections waiting to be accepted: aiohttp's 128 drops some of a reconnect storm (every
    # socket of a replica that stopped comes back at once); the kernel caps it at somaxconn.
    http_backlog: int = 1024
    public_url: str = "http://127.0.0.1:8080"  # where invitation links point
    auth_secret: str = DEFAULT_AUTH_SECRET  # refused at start unless dev_tokens is on
    auth_issuer: str = ""  # when set, a token's ``iss`` must be this
    auth_audience: str = ""  # when set, a token's ``aud`` must name this
    auth_leeway_s: float = 30.0  # clock skew allowed on ``exp`` (and ``nbf``, ``iat``)
    dev_tokens: bool = False  # POST /v1/dev/tokens exists only when true (never over https)
    absence_after_s: float = 48 * 3600.0
    expiry_after_s: float = 7 * 86400.0
    bot_think_s: float = 1.0
    bot_turn_resend_s: float = 30.0  # a bot turn with no move after this is sent again (doubling)
    log_format: Literal["json", "console"] = "json"
    log_level: str = "info"
    # aiohttp's line per request: the ingress logs every request already, and here it costs
    # CPU on every request, about as much as answering a /healthz.
    access_log: bool = False
    db_pool_size: int = 10
    db_acquire_timeout_s: float = 2.0  # a request waits this long for a connection, then 503
    db_statement_timeout_s: float = 5.0  # PostgreSQL cancels a statement after this (503)
    max_body_bytes: int = 64 * 1024  # a larger request body answers 413
    body_read_s: float = 10.0  # a request body not arrived whole by then answers 408
    head_read_s: float = 10.0  # a request's headers not arrived whole by then answer 408
    ws_max_frame_bytes: int = 16 * 1024  # a larger WebSocket message closes the socket (1009)
    # Accept permessage-deflate on table sockets (frames compressed once for all: deflate.py).
    ws_deflate: bool = True
    # Gzip HTTP answers of 8 KiB or more for clients that accept it (compression.py).
    http_gzip: bool = True
    # Committed table rows a table replica remembers: a person's command at one of them is
    # applied to it and saved in one statement (0: every command locks and reads its row).
    table_rows_kept: int = 20_000
    # Those commands are saved many to a statement (services/table/commits.py): at most this
    # many statements at once, each with at most this many changes (one at once when quiet).
    group_commit_statements: int = 4
    group_commit_changes: int = 64
    ws_send_queue: int = 256  # frames queued for one socket; a client past it is closed (4008)
    # Open files kept free of WebSockets (for the pool, the broker, probes, plain requests): a
    # new socket is closed with 1013 while the process has more open than its limit less this.
    files_reserve: int = 256
    # Table WebSockets one replica holds at most; the next is closed with 1013. Its memory binds
    # before its files: keep it under the replica's memory limit over a socket's measured cost
    # (deploy/README.md, "How many matches"), and over the autoscaler's socket target.
    max_sockets: int = 18_000
    # And none while the memory in use passes this share of the limit: GIN_MEMORY_LIMIT_BYTES,
    # or when 0 the container's (shared/infra/memory.py); the next is closed with 1013.
    memory_limit_bytes: int = 0
    memory_full_share: float = 0.85
    # Per-identity limits, valid across replicas: so many per window (seconds), then 429.
    rate_commands: int = 600
    rate_commands_window_s: float = 60.0
    rate_joins: int = 60
    rate_joins_window_s: float = 60.0
    rate_tables: int = 120
    rate_tables_window_s: float = 3600.0
    rate_preferences: int = 30  # deck design changes (a transaction each)
    rate_preferences_window_s: float = 60.0
    rate_sockets: int = 120
    rate_sockets_window_s: float = 60.0
    rate_lists: int = 120  # GET /v1/players/me/tables: each reads all its caller's tables
    rate_lists_window_s: float = 60.0
    rate_refusals: int = 60  # commands refused for what they are (4xx): a spectator's, say
    rate_refusals_window_s: float = 60.0
    rate_sync_s: float = 0.2  # how often a replica shares its counts with the others
    # Past its limit, an identity's refusals are answered one per interval, each held up to
    # hold_max_s, at most holds_max held at once (ratelimit.Holds); the rest are answered at once.
    rate_hold_interval_s: float = 0.2
    rate_hold_max_s: float = 5.0
    rate_holds_max: int = 2000
    # Past this many held at once for one identity, each of its holds lasts longer in
    # proportion (at most 24 times hold_max_s): more connections get it no more answers.
    rate_hold_crowd: int = 20
    # The table service's outbox relay runs in a process of its own (``python -m
    # services.table.relay``, the gin-table-relay Deployment): a replica only wakes it.
    relay_apart: bool = False
    relay_batch: int = 500
    relay_poll_s: float = 1.0
    # A busy relay lets each next batch gather this long (the first after a quiet spell goes
    # at once): long enough that at the players' pace a batch carries several rows, not one,
    # which cuts every part's CPU a move (relay, PostgreSQL, RabbitMQ, the replicas' digests);
    # an event waits this long at most for it (deploy/README.md, "Capacity").
    relay_linger_s: float = 0.02
    outbox_retention_s: float = 86400.0  # published outbox rows are kept this long (replays)
    # A season of data (issue 32): each replica's maintenance task runs every this often (one
    # at a time across replicas), in transactions of at most this many rows.
    maintenance_every_s: float = 300.0
    maintenance_batch: int = 1000
    command_retention_s: float = 86400.0  # stored command answers are kept this long (retries)
    # A finished, closed or expired table is archived this long after its last move, to
    # archive_url (file:///dir or s3://bucket/prefix; empty: nothing is archived).
    archive_after_s: float = 180 * 86400.0
    archive_url: str = ""
    timer_poll_s: float = 1.0  # the timer service looks for due deadlines at least this often
    timer_batch: int = 100  # due deadlines taken per transaction
    timer_retry_s: float = 600.0  # an expiry the table has not reported yet is sent again after
    # Turn reminders (issue 33): whole seconds into a turn, comma-separated, increasing, each
    # below absence_after_s; a reminder also goes when the absence becomes claimable. Empty: none.
    turn_reminders_s: str = "86400,158400"
    shutdown_grace_s: float = 10.0
    # What survives a full collection is frozen (the next scans only what is new); everything
    # is thawed and collected once this often (0: nothing frozen after the start).
    gc_thaw_s: float = 3600.0
    # With gc_thaw_s on, a full collection this often (0: when Python's thresholds say), so
    # that each scans only what came in that while: short pauses instead of rare long ones.
    gc_full_every_s: float = 0.25

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``GIN_*`` variables (strings converted), then ``overrides``."""
        env = os.environ if environ is None else environ
        raw: dict[str, object] = {
            name: env[env_name(name)] for name in cls.__struct_fields__ if env_name(name) in env
        }
        raw.update(overrides)
        return msgspec.convert(raw, cls, strict=False)

    def to_env(self) -> dict[str, str]:
        """The ``GIN_*`` variables that ``from_env`` reads back as these settings (for a
        service started as a process with them)."""
        env = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            env[env_name(name)] = str(value).lower() if isinstance(value, bool) else str(value)
        return env


def env_name(field: str) -> str:
    """The environment variable of a settings field."""
    return ENV_PREFIX + field.upper()


def env_names() -> list[str]:
    """Every environment variable the services read."""
    return [env_name(f) for f in Settings.__struct_fields__]
