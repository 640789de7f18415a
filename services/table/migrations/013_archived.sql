-- migrate: no-transaction
-- Finished tables' archive (issue 32, services/table/archive.py). A table archived is gone
-- from every other table of this schema; its tombstone says where its record went, so its
-- routes answer 410 with that place, and a restore knows what to read back.
CREATE TABLE IF NOT EXISTS archived (
    table_id text PRIMARY KEY,
    key text NOT NULL,  -- the record's key in the archive (tables/<yyyy>/<mm>/<id>.jsonl.gz)
    location text NOT NULL,  -- where that is: file:///dir/key or s3://bucket/prefix/key
    sha256 text NOT NULL,  -- of the record's bytes, as written and read back
    archived_at timestamptz NOT NULL
);
-- The archive's look for ended tables past the delay, without reading every table. By
-- created_at (never changes, and no later than last_move_at): an index on last_move_at would
-- make every move's update non-HOT (migration 008); this one changes only when a table's
-- status enters or leaves these three. Built without blocking the moves meanwhile; a build
-- that failed half-way leaves an invalid index, dropped first so a rerun builds it again.
DROP INDEX CONCURRENTLY IF EXISTS tables_ended;
CREATE INDEX CONCURRENTLY tables_ended ON tables (created_at)
    WHERE status IN ('match_over', 'closed', 'expired');
