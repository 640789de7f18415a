-- When a bot's pending turn is sent again if no move came (services/table/bot_turns.py):
-- set with every change that gives a bot the turn, NULL otherwise. Adding a nullable column
-- without a default changes no row. Rows written before it wait for their next move.
ALTER TABLE tables ADD COLUMN bot_turn_due_at timestamptz;
