-- The catalog cache's named queries (table_cache_entries, table_cache_meta; 010_maintenance.sql).
-- CatalogCache (runstate/maintenance/cache.py) is the only user; runstate.sqlfiles loads them by name.

-- name: lock_cache
-- SHARE ROW EXCLUSIVE: one replace at a time, while readers keep seeing the previous inventory.
LOCK TABLE table_cache_entries IN SHARE ROW EXCLUSIVE MODE;

-- name: clear_cache
DELETE FROM table_cache_entries;

-- name: insert_cache
INSERT INTO table_cache_entries (database_name, table_name, maintenance_enabled, payload)
SELECT * FROM unnest(%s::text[], %s::text[], %s::bool[], %s::jsonb[]);

-- name: upsert_cache
-- One table between inventories; it waits for a replace in progress (lock_cache) and lands after it.
INSERT INTO table_cache_entries (database_name, table_name, maintenance_enabled, payload)
VALUES (%s, %s, %s, %s)
ON CONFLICT (database_name, table_name) DO UPDATE
SET maintenance_enabled = EXCLUDED.maintenance_enabled, payload = EXCLUDED.payload;

-- name: mark_synced
INSERT INTO table_cache_meta (id, last_synced_at) VALUES (1, now())
ON CONFLICT (id) DO UPDATE SET last_synced_at = EXCLUDED.last_synced_at;

-- name: cached_tables
SELECT database_name, table_name, maintenance_enabled, payload FROM table_cache_entries
ORDER BY database_name, table_name;

-- name: enabled_cached_tables
SELECT database_name, table_name, maintenance_enabled, payload FROM table_cache_entries
WHERE maintenance_enabled = TRUE
ORDER BY database_name, table_name;

-- name: last_synced
SELECT last_synced_at FROM table_cache_meta WHERE id = 1;
