-- The event log by month (issue 32): each event's 0.47 KB kept for ever came to 12 GB a day at
-- 300 moves/s. `events` becomes a table partitioned by RANGE on `at`, the event's
-- occurred_at (the service's clock, which the move path writes with each event), one
-- partition a month named events_YYYY_MM (UTC months), so that a season's events can be
-- archived and dropped a month at a time instead of deleted row by row.
-- * The maintenance task (services/table/maintenance.py) makes each month's partition ahead
--   by the service's clock, with ATTACH PARTITION (SHARE UPDATE EXCLUSIVE on `events`:
--   moves go on meanwhile; CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE).
-- * events_default holds an event whose month has no partition yet, so a move never fails
--   for one; the task moves a month's rows out of it when it makes that month.
-- * The primary key must hold the partition key: (table_id, seq, at). A (table_id, seq) is
--   still written once: only by the statement that moves its table's row from the version
--   before (services/table/store.py), as before.
-- * No pg_partman: the production image (CloudNativePG's standard) does not ship it, the
--   service's role could not create it (not a trusted extension), and its maintenance needs
--   a background worker or a scheduler; making three months ahead is a few statements.
-- There is no production data yet: the rows of the old table are copied in this transaction,
-- each month of them into a partition of its own, the current month and the next two made
-- too (by the database's clock here; the task makes them by the service's clock after).
ALTER TABLE events RENAME TO events_before_011;
ALTER TABLE events_before_011 RENAME CONSTRAINT events_pkey TO events_before_011_pkey;

CREATE TABLE events (
    table_id text NOT NULL,
    seq bigint NOT NULL,
    type text NOT NULL,
    envelope jsonb NOT NULL,
    at timestamptz NOT NULL,
    PRIMARY KEY (table_id, seq, at)
) PARTITION BY RANGE (at);
CREATE TABLE events_default PARTITION OF events DEFAULT;

DO $$
DECLARE
    month timestamp;  -- the first moment of a month, in UTC
BEGIN
    FOR month IN
        SELECT DISTINCT date_trunc('month', (envelope->>'occurred_at')::timestamptz AT TIME ZONE 'UTC')
        FROM events_before_011
        UNION
        SELECT date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => n)
        FROM generate_series(0, 2) AS n
    LOOP
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF events FOR VALUES FROM (%L) TO (%L)',
            'events_' || to_char(month, 'YYYY_MM'),
            (month AT TIME ZONE 'UTC')::text,
            ((month + interval '1 month') AT TIME ZONE 'UTC')::text
        );
    END LOOP;
END
$$;

INSERT INTO events (table_id, seq, type, envelope, at)
SELECT table_id, seq, type, envelope, (envelope->>'occurred_at')::timestamptz
FROM events_before_011;
DROP TABLE events_before_011;
