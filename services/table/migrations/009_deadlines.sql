-- Each open table's deadlines as facts of its own (issue 29): whose decision it is and since
-- when (R10.2), and when the last move was (R10.3), written by the statement that saves every
-- change, so they are exactly as current as the table. The timer service reads them through
-- the view below, with an indexed query for those due, instead of consuming every table
-- event to keep a copy: no message and no transaction of its own per move.
-- A narrow table of its own, not columns of `tables`: an indexed column that changes makes
-- an update non-HOT, and every move moves these; here that costs a 60-byte row's index
-- entries, not the 1.7 KB table row's.
CREATE TABLE deadlines (
    table_id text PRIMARY KEY,
    -- absence: the seat to act, when it got the decision, and the table event that gave it
    -- (absence_claimable's data.table_seq); NULL when no decision is running (no hand on).
    absence_seat smallint,
    absence_since timestamptz,
    absence_seq bigint,
    -- expiry: the last accepted command's time and the table's seq then; NULL once closed.
    expiry_since timestamptz,
    expiry_seq bigint,
    -- Written by this migration for a playing table, whose decision is in its engine state
    -- (not readable in SQL): the service fills it in at start (services/table/deadlines.py).
    backfill boolean NOT NULL DEFAULT false,
    CHECK ((absence_seat IS NULL) = (absence_since IS NULL)),
    CHECK ((expiry_since IS NULL) = (expiry_seq IS NULL))
);
CREATE INDEX deadlines_absence ON deadlines (absence_since) WHERE absence_since IS NOT NULL;
CREATE INDEX deadlines_expiry ON deadlines (expiry_since) WHERE expiry_since IS NOT NULL;
CREATE INDEX deadlines_backfill ON deadlines (table_id) WHERE backfill;

INSERT INTO deadlines (table_id, expiry_since, expiry_seq, backfill)
SELECT table_id, last_move_at, seq, status = 'playing'
FROM tables WHERE status IN ('waiting', 'playing', 'match_over');

-- The timer service's one way in: it may read this view and nothing else of this schema (a
-- view runs with its owner's rights). Production's roles are made before any migration runs;
-- a database without them (development, tests: one role for every service) grants nothing.
CREATE VIEW timer_deadlines AS
SELECT table_id, absence_seat, absence_since, absence_seq, expiry_since, expiry_seq
FROM deadlines;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'gin_timers') THEN
        GRANT USAGE ON SCHEMA gin_table TO gin_timers;
        GRANT SELECT ON timer_deadlines TO gin_timers;
    END IF;
END
$$;
