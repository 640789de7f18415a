-- The timer service's own schema (gin_timers): per table, the last event seq applied, and
-- its deadlines. Both change in the transaction that applies an event, so a redelivered
-- event changes nothing (an idempotent consumer).
CREATE TABLE tables (
    table_id text PRIMARY KEY,
    last_seq bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- At most one deadline of each kind per table. `due_at` is the deadline itself; `next_at`
-- is when a replica should fire it (again): `due_at` at first, NULL once an absence was
-- announced, later again for an expiry the table has not reported yet. Replicas take due
-- rows with FOR UPDATE SKIP LOCKED.
CREATE TABLE deadlines (
    table_id text NOT NULL REFERENCES tables (table_id) ON DELETE CASCADE,
    kind text NOT NULL CHECK (kind IN ('absence', 'expiry')),
    seat smallint CHECK ((kind = 'absence') = (seat IS NOT NULL)),
    since timestamptz NOT NULL,
    seq bigint NOT NULL,
    due_at timestamptz NOT NULL,
    next_at timestamptz,
    fired_at timestamptz,
    attempts integer NOT NULL DEFAULT 0,
    PRIMARY KEY (table_id, kind)
);
CREATE INDEX deadlines_next ON deadlines (next_at) WHERE next_at IS NOT NULL;
CREATE INDEX deadlines_pending ON deadlines (kind) WHERE fired_at IS NULL;
