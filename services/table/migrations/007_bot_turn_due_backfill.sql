-- Matches against a bot that were playing when 005 added bot_turn_due_at have none: each is
-- looked at once by the resend loop (services/table/bot_turns.py), which sends the bot's turn
-- again if the bot is to act (the bot's command id makes a repeat harmless) and otherwise
-- clears it. Only playing tables with a bot seat, once.
UPDATE tables SET bot_turn_due_at = now()
WHERE status = 'playing'
    AND bot_turn_due_at IS NULL
    AND jsonb_path_exists(seats, '$[*] ? (@.bot != null)');
