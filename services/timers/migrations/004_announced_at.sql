-- Issue 32: a table's timer-stream counter goes once the table is archived. When the counter
-- was last taken, so that only counters idle past GIN_ARCHIVE_AFTER_S are looked at (a row
-- made before this counts from the migration).
ALTER TABLE announcements ADD COLUMN IF NOT EXISTS announced_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX IF NOT EXISTS announcements_announced_at ON announcements (announced_at);
