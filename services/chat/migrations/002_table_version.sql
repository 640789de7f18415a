-- Read-your-writes (issue 15): the highest table version among the table events the chat has
-- applied (the envelope's `version`), so a message that says which version its sender has
-- seen (`after_version`) can wait for the chat to catch up instead of being refused.
ALTER TABLE tables ADD COLUMN version bigint NOT NULL DEFAULT 0;
