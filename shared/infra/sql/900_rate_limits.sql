-- Per-identity rate limits shared by a service's replicas (shared/infra/ratelimit.py): how
-- many of an action an identity was allowed in one fixed window, summed over the replicas.
-- Each replica counts locally and adds its counts here every sync (a fraction of a second).
-- Unlogged: the counts are worth less than the WAL they would write, and a crash that empties
-- the table only lets the current windows start again.
CREATE UNLOGGED TABLE rate_limits (
    action text NOT NULL,
    identity text NOT NULL,
    window_no bigint NOT NULL,  -- floor(seconds since the epoch / the action's window)
    ends_at double precision NOT NULL,  -- the window's end, in seconds since the epoch
    count bigint NOT NULL,
    -- From this count on, every replica learns the key's total at each of its syncs, even one
    -- that has not counted the identity yet (half the limit).
    shared_from bigint NOT NULL,
    PRIMARY KEY (action, identity, window_no)
);
-- The keys every sync sends every replica: few (each took half a limit's requests).
CREATE INDEX rate_limits_shared ON rate_limits (ends_at) WHERE count >= shared_from;
