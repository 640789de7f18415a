-- migrate: no-transaction
-- The resend loop looks for due bot turns by this index, built without blocking the moves
-- that write tables meanwhile. A build that failed half-way leaves an invalid index: it is
-- dropped first, so a rerun builds it again.
DROP INDEX CONCURRENTLY IF EXISTS tables_bot_turn_due;
CREATE INDEX CONCURRENTLY tables_bot_turn_due ON tables (bot_turn_due_at)
    WHERE bot_turn_due_at IS NOT NULL;
