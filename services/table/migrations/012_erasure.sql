-- migrate: no-transaction
-- Erasure on request (issue 32, services/table/erasure.py) finds the tables a person sits at
-- by these indexes instead of reading every table row: seat 0 is always the creator
-- (`creator_id`), seat 1 the one who joined (a bot's has no id). Neither column changes with
-- a move, so the moves' updates stay HOT (migration 008). Built without blocking the moves
-- meanwhile; a build that failed half-way leaves an invalid index, dropped first so a rerun
-- builds it again.
DROP INDEX CONCURRENTLY IF EXISTS tables_creator;
CREATE INDEX CONCURRENTLY tables_creator ON tables (creator_id);
DROP INDEX CONCURRENTLY IF EXISTS tables_joiner;
CREATE INDEX CONCURRENTLY tables_joiner ON tables ((seats #>> '{1,id}'));
