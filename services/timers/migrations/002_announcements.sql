-- The timer stream of each table (issue 15): what this service announces about a table on
-- gin.events (absence_claimable) is numbered 1, 2, ... per table, without gaps and never
-- reused, as the envelope's (stream "timer", table_id, seq). The number is taken in the
-- transaction that fires the deadline and writes the announcement to the outbox. A table of
-- its own, so firing never waits on the row lock the event consumer takes on `tables`.
CREATE TABLE announcements (
    table_id text PRIMARY KEY,
    last_seq bigint NOT NULL
);
