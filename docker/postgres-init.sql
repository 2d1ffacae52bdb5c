-- The official postgres image runs this once, on an empty volume: POSTGRES_DB makes `runstate`,
-- Dagster's storage gets a database of its own.
CREATE DATABASE dagster;
