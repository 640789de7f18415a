-- Events, command results and hand records are only ever written by the statement that
-- updates their table row (store.save_change), so their foreign keys never caught anything;
-- each one cost a trigger and a lookup of the table row per inserted row on every move.
ALTER TABLE events DROP CONSTRAINT events_table_id_fkey;
ALTER TABLE commands DROP CONSTRAINT commands_table_id_fkey;
ALTER TABLE hands DROP CONSTRAINT hands_table_id_fkey;
