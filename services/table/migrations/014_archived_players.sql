-- migrate: no-transaction
-- Erasure reaches the archive (issue 32): each tombstone names the people who sat at its
-- table, so an erasure finds the archived tables of its subject (by this index) and restores
-- them first: their rows are then erased as every other table's, and the old records, which
-- still name the person, are deleted from the archive. A tombstone made before this has none
-- (there were none in production).
ALTER TABLE archived ADD COLUMN IF NOT EXISTS players text[] NOT NULL DEFAULT '{}';
DROP INDEX CONCURRENTLY IF EXISTS archived_players;
CREATE INDEX CONCURRENTLY archived_players ON archived USING gin (players);
