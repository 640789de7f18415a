-- Issue 33: turn reminders are deadlines of the absence moment, one kind per offset of
-- GIN_TURN_REMINDERS_S ("reminder:<seconds>"), kept in `fired` and `scans` like the others.
-- A replica adds the `scans` row of an offset new to it at start (services/timers/store.py).
ALTER TABLE fired DROP CONSTRAINT IF EXISTS fired_kind_check;
ALTER TABLE fired ADD CONSTRAINT fired_kind_check
    CHECK (kind IN ('absence', 'expiry') OR kind ~ '^reminder:[1-9][0-9]*$');
ALTER TABLE scans DROP CONSTRAINT IF EXISTS scans_kind_check;
ALTER TABLE scans ADD CONSTRAINT scans_kind_check
    CHECK (kind IN ('absence', 'expiry') OR kind ~ '^reminder:[1-9][0-9]*$');
