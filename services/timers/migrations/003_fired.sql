-- Issue 29: the table service keeps each table's deadlines in the statement that saves its
-- change (gin_table.timer_deadlines, a view this service may read), so this service no longer
-- consumes table events to keep a copy. It keeps only what it fired, and how far it has
-- looked for due deadlines.

-- The last deadline of each kind fired per table: the table event that set it (`seq`), its
-- moment, and, for an expiry the table has not reported yet, when to send it again.
CREATE TABLE fired (
    table_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('absence', 'expiry')),
    seq bigint NOT NULL,
    since timestamptz NOT NULL,
    fired_at timestamptz NOT NULL,
    attempts integer NOT NULL,
    next_at timestamptz,
    PRIMARY KEY (table_id, kind)
);
CREATE INDEX fired_next ON fired (next_at) WHERE next_at IS NOT NULL;
CREATE INDEX fired_since ON fired (kind, since) WHERE next_at IS NULL;

-- Per kind, the moment up to which deadlines were looked for: the next look starts a margin
-- before it (services/timers/firing.py). A replica scanning a kind holds its row's lock.
CREATE TABLE scans (
    kind text PRIMARY KEY CHECK (kind IN ('absence', 'expiry')),
    scanned_to timestamptz NOT NULL
);
INSERT INTO scans (kind, scanned_to) VALUES ('absence', 'epoch'), ('expiry', 'epoch');

-- What the event consumer fired before this release is fired already: not again.
INSERT INTO fired (table_id, kind, seq, since, fired_at, attempts, next_at)
SELECT table_id, kind, seq, since, fired_at, attempts, next_at
FROM deadlines WHERE fired_at IS NOT NULL;

-- `deadlines` and `tables` stay, unused, for replicas of the previous release still running
-- during the rollout; a later release drops them.
