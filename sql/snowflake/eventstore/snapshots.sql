-- Named queries of runstate/eventstore/snowflake.py: the state snapshots on Snowflake.
-- Not a migration (the file name has no NNN_ version): loaded by name with runstate.sqlfiles.named.
-- Table names are unqualified: the store's connections run in its schema (USE SCHEMA).

-- name: insert_snapshot
-- Snowflake enforces no PRIMARY KEY: NOT EXISTS keeps one snapshot per (RUN_ID, SEQ). The payload is
-- bound as base64 text.
INSERT INTO RUN_STATE_SNAPSHOTS (RUN_ID, SEQ, KIND, ENCODING, PAYLOAD, CHECKSUM, RAW_BYTES, STORED_BYTES, REASON)
SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s
WHERE NOT EXISTS (SELECT 1 FROM RUN_STATE_SNAPSHOTS WHERE RUN_ID = %s AND SEQ = %s);

-- name: snapshot_seqs
-- Newest first: the writer keeps the newest `keep` and prunes the rest (prune_snapshots).
SELECT SEQ FROM RUN_STATE_SNAPSHOTS WHERE RUN_ID = %s ORDER BY SEQ DESC;

-- name: prune_snapshots
DELETE FROM RUN_STATE_SNAPSHOTS WHERE RUN_ID = %s AND SEQ < %s;

-- name: snapshots
-- Newest first: the newest one that decodes wins (choose_valid skips corrupt ones).
SELECT RUN_ID, SEQ, KIND, ENCODING, PAYLOAD, CHECKSUM FROM RUN_STATE_SNAPSHOTS
 WHERE RUN_ID = %s ORDER BY SEQ DESC;

-- name: snapshots_upto
SELECT RUN_ID, SEQ, KIND, ENCODING, PAYLOAD, CHECKSUM FROM RUN_STATE_SNAPSHOTS
 WHERE RUN_ID = %s AND SEQ <= %s ORDER BY SEQ DESC;

-- name: snapshots_of_kind
SELECT RUN_ID, SEQ, KIND, ENCODING, PAYLOAD, CHECKSUM FROM RUN_STATE_SNAPSHOTS
 WHERE RUN_ID = %s AND KIND = %s ORDER BY SEQ DESC;

-- name: snapshots_upto_of_kind
-- The projection snapshots a fold up to that seq can start from.
SELECT RUN_ID, SEQ, KIND, ENCODING, PAYLOAD, CHECKSUM FROM RUN_STATE_SNAPSHOTS
 WHERE RUN_ID = %s AND SEQ <= %s AND KIND = %s ORDER BY SEQ DESC;
