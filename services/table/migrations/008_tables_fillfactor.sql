-- Every move rewrites its table's row (some 1.7 KB: the state, the seats, the options). With
-- full pages a quarter of those updates found no room on the row's page and wrote the new
-- version elsewhere, with new index entries, leaving bloat for autovacuum. Half-full pages
-- keep each new version beside the old (a HOT update: no index entry, pruned in place).
-- Applies to pages written from now on; SHARE UPDATE EXCLUSIVE: moves go on meanwhile.
ALTER TABLE tables SET (fillfactor = 50);
