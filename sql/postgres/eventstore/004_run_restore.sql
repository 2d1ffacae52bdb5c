-- `runstate events restore RUN_ID` brings an archived run back; restored_at keeps the archive job
-- from moving it out again until it is older than the archive age once more.
ALTER TABLE run_streams ADD COLUMN IF NOT EXISTS restored_at TIMESTAMPTZ;
