-- The transactional outbox: rows written in the same transaction as the change they report,
-- published by the relay (shared/infra/outbox.py) and marked once the broker confirmed them.
CREATE TABLE outbox (
    id bigserial PRIMARY KEY,
    exchange text NOT NULL,
    routing_key text NOT NULL,
    body bytea NOT NULL,
    message_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;
