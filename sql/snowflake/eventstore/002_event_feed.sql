-- The global feed on Snowflake: POSITION = (a RUN_EVENTS_POSITION_SEQ value << 20) + the event's
-- 1-based place in its batch, one sequence value per append. Unique and increasing along each run;
-- not a commit-ordered high-water mark (Snowflake has no transaction ids or snapshots): see
-- runstate/eventstore/snowflake.py. Events stored before this migration have no position.
ALTER TABLE RUN_EVENTS ADD COLUMN POSITION NUMBER(38,0);
ALTER TABLE RUN_EVENTS_ARCHIVE ADD COLUMN POSITION NUMBER(38,0);
CREATE SEQUENCE IF NOT EXISTS RUN_EVENTS_POSITION_SEQ;
