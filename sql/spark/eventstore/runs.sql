-- The run history's `runs` table on Spark (runstate/eventstore/lake/runs.py): the store's projection
-- (runstate/eventstore/projection.py) as aggregates that combine in any order, so a merge folds a range
-- of run_events onto the stored rows inside Spark, whatever order the events' seqs and positions come in.
--
-- What a run's row keeps beside its columns, to be combined with later events (`fold_state`):
-- - the first terminal event by seq (RunCompleted, RunFailed, RunCancelled): a finished run stays
--   finished, so it gives `status` and `completed_at`;
-- - the first of RunStarted and the terminal events by seq: it gives `started_at`;
-- - the last of RunStarted, SignalWaiting and SignalReceived by seq, and whether the run ever had a
--   RunStarted, SignalWaiting or StepStarted (`activated`): with no terminal event they give the status
--   (RunStarted: RUNNING; SignalWaiting: WAITING; SignalReceived, or none of the three: RUNNING once
--   activated, else PENDING);
-- - per step (a NULL step_id is the step ''), its last step event by seq (its status) and how many
--   times it started (`steps`).
-- Identifiers in braces are runstate's own checked names; values are bound (`:name`).

-- name: touched_runs
-- The runs with an event in the range (after, upto] of run_events at one snapshot.
SELECT DISTINCT run_id FROM {events} VERSION AS OF {snapshot_id} WHERE position > :after AND position <= :upto

-- name: merged_rows
-- The new rows of the runs in {created} (run_id, created_at): each stored row (read from the partitions
-- {days} names) combined with its run's events in the range that it does not have yet, those
-- above its last_position (a row is the fold of every event of its run up to there). One pass over the
-- events, grouped by run and step, then by run. An event's seq and its kind travel as one number,
-- seq * 4 + code, so that plain min and max pick the first or last one by seq (and Spark aggregates by
-- hash, which it cannot over structs): terminal codes COMPLETED 1, FAILED 2, CANCELLED 3; lifecycle
-- codes RunStarted 1, SignalWaiting 2, SignalReceived 3; step codes RUNNING 0, SUCCESS 1, FAILED 2,
-- RETRYING 3.
WITH stored AS (
  SELECT t.* FROM {runs} t LEFT SEMI JOIN {created} c ON t.run_id = c.run_id WHERE {days}
), fresh AS (
  SELECT e.run_id, coalesce(e.step_id, '') AS step, e.run_seq, e.emitted_at, e.position,
         CASE e.event_type WHEN 'RunCompleted' THEN 1 WHEN 'RunFailed' THEN 2 WHEN 'RunCancelled' THEN 3 END
           AS terminal,
         CASE e.event_type WHEN 'RunStarted' THEN 1 WHEN 'SignalWaiting' THEN 2 WHEN 'SignalReceived' THEN 3 END
           AS lifecycle,
         CASE e.event_type WHEN 'StepStarted' THEN 0 WHEN 'StepCompleted' THEN 1 WHEN 'StepFailed' THEN 2
           WHEN 'StepRetrying' THEN 3 END AS step_code,
         e.event_type IN ('RunStarted', 'SignalWaiting', 'StepStarted') AS activates
    FROM {events} VERSION AS OF {snapshot_id} e LEFT JOIN stored s ON e.run_id = s.run_id
   WHERE e.position > :after AND e.position <= :upto AND (s.last_position IS NULL OR e.position > s.last_position)
), fresh_steps AS (
  SELECT run_id, step,
         min(emitted_at) AS first_event_at,
         max(emitted_at) AS last_event_at,
         count(*) AS event_count,
         max(run_seq) AS last_seq,
         max(position) AS last_position,
         min(run_seq * 4 + terminal) AS terminal_key,
         min_by(emitted_at, CASE WHEN terminal IS NOT NULL THEN run_seq END) AS terminal_at,
         min(CASE WHEN terminal IS NOT NULL OR lifecycle = 1 THEN run_seq END) AS started_seq,
         min_by(emitted_at, CASE WHEN terminal IS NOT NULL OR lifecycle = 1 THEN run_seq END) AS started_at,
         max(run_seq * 4 + lifecycle) AS lifecycle_key,
         bool_or(activates) AS activated,
         max(run_seq * 4 + step_code) AS step_key,
         count_if(step_code = 0) AS starts
    FROM fresh GROUP BY run_id, step
), fresh_runs AS (
  SELECT run_id,
         min(first_event_at) AS first_event_at,
         max(last_event_at) AS last_event_at,
         sum(event_count) AS event_count,
         max(last_seq) AS last_seq,
         max(last_position) AS last_position,
         min(terminal_key) AS terminal_key,
         min_by(terminal_at, terminal_key) AS terminal_at,
         min(started_seq) AS started_seq,
         min_by(started_at, started_seq) AS started_at,
         max(lifecycle_key) AS lifecycle_key,
         bool_or(activated) AS activated,
         map_from_entries(collect_list(CASE WHEN step_key IS NOT NULL THEN struct(step, named_struct(
           'status', element_at(array('RUNNING', 'SUCCESS', 'FAILED', 'RETRYING'), CAST(step_key % 4 + 1 AS INT)),
           'starts', starts,
           'seq', step_key div 4)) END)) AS steps
    FROM fresh_steps GROUP BY run_id
), combined AS (
  SELECT n.run_id, c.created_at,
         least(n.terminal_key, s.fold_state.terminal_seq * 4 + CASE s.status WHEN 'COMPLETED' THEN 1
           WHEN 'FAILED' THEN 2 WHEN 'CANCELLED' THEN 3 END) AS terminal_key,
         CASE WHEN s.fold_state.terminal_seq * 4 < coalesce(n.terminal_key, s.fold_state.terminal_seq * 4 + 4)
              THEN s.completed_at ELSE n.terminal_at END AS completed_at,
         least(n.started_seq, s.fold_state.started_seq) AS started_seq,
         CASE WHEN s.fold_state.started_seq < coalesce(n.started_seq, s.fold_state.started_seq + 1)
              THEN s.started_at ELSE n.started_at END AS started_at,
         greatest(n.lifecycle_key, s.fold_state.lifecycle_seq * 4 + CASE s.fold_state.lifecycle_event
           WHEN 'RunStarted' THEN 1 WHEN 'SignalWaiting' THEN 2 WHEN 'SignalReceived' THEN 3 END) AS lifecycle_key,
         n.activated OR coalesce(s.fold_state.activated, false) AS activated,
         least(n.first_event_at, s.first_event_at) AS first_event_at,
         greatest(n.last_event_at, s.last_event_at) AS last_event_at,
         n.event_count + coalesce(s.event_count, 0) AS event_count,
         greatest(n.last_seq, s.last_seq) AS last_seq,
         n.last_position,
         CASE WHEN s.steps IS NULL THEN n.steps
              ELSE map_zip_with(s.steps, n.steps, (step, was, now) -> CASE
                WHEN was IS NULL THEN now
                WHEN now IS NULL THEN was
                ELSE named_struct(
                  'status', CASE WHEN now.seq > was.seq THEN now.status ELSE was.status END,
                  'starts', was.starts + now.starts,
                  'seq', greatest(was.seq, now.seq)) END) END AS steps
    FROM fresh_runs n
    JOIN {created} c ON n.run_id = c.run_id
    LEFT JOIN stored s ON n.run_id = s.run_id
)
SELECT run_id, created_at,
       CASE WHEN terminal_key IS NOT NULL
              THEN element_at(array('COMPLETED', 'FAILED', 'CANCELLED'), CAST(terminal_key % 4 AS INT))
            WHEN lifecycle_key % 4 = 1 THEN 'RUNNING'
            WHEN lifecycle_key % 4 = 2 THEN 'WAITING'
            WHEN activated THEN 'RUNNING'
            ELSE 'PENDING' END AS status,
       started_at,
       completed_at,
       first_event_at,
       last_event_at,
       (unix_micros(last_event_at) - unix_micros(first_event_at)) / 1e6 AS duration_s,
       CAST(event_count AS BIGINT) AS event_count,
       array_sort(map_keys(map_filter(steps, (step, state) -> state.status = 'FAILED'))) AS failed_steps,
       last_seq,
       last_position,
       steps,
       named_struct(
         'terminal_seq', terminal_key div 4,
         'started_seq', started_seq,
         'lifecycle_seq', lifecycle_key div 4,
         'lifecycle_event', element_at(array('RunStarted', 'SignalWaiting', 'SignalReceived'),
           CAST(lifecycle_key % 4 AS INT)),
         'activated', activated) AS fold_state
  FROM combined

-- name: merge
-- A row replaces a stored one only when it reflects a later event; {days} names the partitions of
-- the rows' creation days, so Iceberg opens only those.
MERGE INTO {runs} t USING {source} s ON t.run_id = s.run_id AND {days}
  WHEN MATCHED AND s.last_position > t.last_position THEN UPDATE SET *
  WHEN NOT MATCHED THEN INSERT *
