-- The chat service's own schema (gin_chat). What it knows of a table it learned from the table
-- service's events (seat_taken, table_closed, table_expired); it reads no other schema.

-- A table the chat has heard of: open until closed or expired, and its last message number.
CREATE TABLE tables (
    table_id text PRIMARY KEY,
    status text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed', 'expired')),
    last_message bigint NOT NULL DEFAULT 0
);

-- Who sits where: a person (player_id, name) or a bot (player_id null, bot level).
CREATE TABLE seats (
    table_id text NOT NULL REFERENCES tables (table_id),
    seat smallint NOT NULL CHECK (seat IN (0, 1)),
    player_id text,
    name text NOT NULL,
    bot text,
    PRIMARY KEY (table_id, seat),
    CHECK ((player_id IS NULL) <> (bot IS NULL))
);

-- The table events applied (the idempotent consumer's tracking records): each row is written
-- in the same transaction as the change its event caused.
CREATE TABLE applied_events (
    table_id text NOT NULL,
    seq bigint NOT NULL,
    type text NOT NULL,
    PRIMARY KEY (table_id, seq)
);

-- The messages, numbered 1, 2, ... per table without gaps (the envelope's seq and message_id);
-- event_id is the published envelope's id, so the history repeats it exactly.
CREATE TABLE messages (
    table_id text NOT NULL REFERENCES tables (table_id),
    seq bigint NOT NULL,
    event_id uuid NOT NULL,
    seat smallint NOT NULL,
    player_id text NOT NULL,
    name text NOT NULL,
    text text NOT NULL,
    posted_at timestamptz NOT NULL,
    PRIMARY KEY (table_id, seq)
);

-- The rate limit counts a player's recent messages at every table.
CREATE INDEX messages_by_player ON messages (player_id, posted_at);
