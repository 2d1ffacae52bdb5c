-- Seed 001 §6.2: a BTREE on event_type (all types, replacing the terminal-types-only partial
-- index it covers) and a GIN on event_data with jsonb_path_ops, for containment queries such as
-- `event_data @> '{"error": ...}'`. The benchmark reports the batched append rate with and without.
DROP INDEX IF EXISTS idx_run_events_eventtype;
CREATE INDEX IF NOT EXISTS idx_run_events_event_type ON run_events (event_type);
CREATE INDEX IF NOT EXISTS idx_run_events_event_data ON run_events USING GIN (event_data jsonb_path_ops);
