-- A command_id is its sender's own: a person's can never take a bot's or the timer service's
-- (a person who sent "bot:<table>:<version>:<seat>" first froze the bot for good). The ids
-- stored so far are unique per table, so they are unique per table and actor too.
ALTER TABLE commands DROP CONSTRAINT commands_pkey;
ALTER TABLE commands ADD PRIMARY KEY (table_id, actor, command_id);
