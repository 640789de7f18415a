-- migrate: no-transaction
-- The chat kept a season (issue 32, services/chat/retention.py): when the chat's retention
-- first saw a table closed or expired, by its own clock, so that the table's messages and
-- seats go GIN_ARCHIVE_AFTER_S later, as the table service archives the table itself. A
-- nullable column without a default changes no row; the tables closed before it count from
-- this migration. Each statement is safe to run again (a rerun after a failure half-way).
ALTER TABLE tables ADD COLUMN IF NOT EXISTS ended_at timestamptz;
UPDATE tables SET ended_at = now() WHERE status <> 'open' AND ended_at IS NULL;
-- Each run marks those newly ended, then deletes those ended long enough ago: both small.
-- Built without blocking the messages meanwhile (an invalid index of a failed build first
-- dropped); neither changes with a message, so a message's update stays HOT.
DROP INDEX CONCURRENTLY IF EXISTS tables_ended_unmarked;
CREATE INDEX CONCURRENTLY tables_ended_unmarked ON tables (table_id)
    WHERE status <> 'open' AND ended_at IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS tables_ended_at;
CREATE INDEX CONCURRENTLY tables_ended_at ON tables (ended_at) WHERE ended_at IS NOT NULL;
