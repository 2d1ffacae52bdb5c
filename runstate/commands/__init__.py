"""The commands the CLI, the demo and tests share: flush now, merge now, tick a sensor or a schedule, set
the Spark pool's limit.

Dagster-aware, between the CLI and the Dagster shell: a command builds what it needs from
`runstate.defs`, plans with the core's planners (`runstate.wal.planning`, the ones the sensors call) and
executes runs in-process (`ticking.execute_run`). It returns (or yields) what happened; printing and exit
codes are the CLI's. Nothing here is imported at start: each module is imported by the verb that needs it.

- `ticking`: tick_sensor, tick_schedule, execute_run, default_defs
- `flush`: flush_now (`runstate wal flush`), tick_wal (`runstate wal tick`)
- `merge`: merge_now (`runstate wal merge`)
- `maintenance`: tick_maintenance (`runstate maintenance tick`)
- `instance`: default_instance; limit_spark_pool (`runstate db upgrade`, `services up`, `dev`), which
  loads the instance and not the definitions
"""
