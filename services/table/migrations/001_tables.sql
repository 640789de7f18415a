-- The table service's own schema: tables and their engine state, the per-table event log,
-- finished hands, processed command ids, and players' deck designs.
CREATE TABLE tables (
    table_id text PRIMARY KEY,
    invite_code text NOT NULL,
    creator_id text NOT NULL,
    options jsonb NOT NULL,
    seats jsonb NOT NULL,
    status text NOT NULL,
    state bytea,
    version integer NOT NULL DEFAULT 0,
    seq bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    last_move_at timestamptz NOT NULL
);

CREATE TABLE events (
    table_id text NOT NULL REFERENCES tables (table_id),
    seq bigint NOT NULL,
    type text NOT NULL,
    envelope jsonb NOT NULL,
    PRIMARY KEY (table_id, seq)
);

CREATE TABLE hands (
    table_id text NOT NULL REFERENCES tables (table_id),
    hand integer NOT NULL,
    record jsonb NOT NULL,
    PRIMARY KEY (table_id, hand)
);

CREATE TABLE commands (
    table_id text NOT NULL REFERENCES tables (table_id),
    command_id text NOT NULL,
    actor text NOT NULL,
    result jsonb NOT NULL,
    PRIMARY KEY (table_id, command_id)
);

CREATE TABLE preferences (
    player_id text PRIMARY KEY,
    deck_design text NOT NULL
);
