-- The W3C traceparent of the work that wrote the row (shared/infra/tracing.py): the relay's
-- publish continues that trace, and the message carries it on. NULL when tracing is off.
-- Nullable and without a default: adding it rewrites nothing.
ALTER TABLE outbox ADD COLUMN traceparent text;
