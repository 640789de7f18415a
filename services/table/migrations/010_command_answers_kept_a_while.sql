-- migrate: no-transaction
-- Stored command answers are kept GIN_COMMAND_RETENTION_S, then deleted in small batches by
-- the maintenance task (services/table/maintenance.py; issue 32): a retry is seconds old, and
-- each move's answer (some 1.6 KB) kept for ever filled the volume within a day at 300 moves/s.
-- When the answer was given, by the service's clock: the move path writes its move's time
-- (the table's last_move_at); the default is for rows written before, which are kept a
-- retention from now. A non-volatile default on an existing table changes no row (PG >= 11).
ALTER TABLE commands ADD COLUMN IF NOT EXISTS answered_at timestamptz NOT NULL DEFAULT now();
-- The oldest answers, found by this index, built without blocking the moves that insert
-- answers meanwhile; a build that failed half-way leaves an invalid index: dropped first.
DROP INDEX CONCURRENTLY IF EXISTS commands_answered_at;
CREATE INDEX CONCURRENTLY commands_answered_at ON commands (answered_at);
