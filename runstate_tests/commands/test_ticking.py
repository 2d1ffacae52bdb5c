"""`runstate tick` builds what the daemon's code server builds for a tick: the resources the sensor or
schedule requires, with those they require, and no other."""

from __future__ import annotations

import dagster as dg
import pytest

from runstate.commands.ticking import tick_schedule, tick_sensor


class Broken(dg.ConfigurableResource):
    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        raise RuntimeError("the broken resource was built")


class Inner(dg.ConfigurableResource):
    value: str = "inner"


@dg.resource(required_resource_keys={"inner"})
def outer(context: dg.InitResourceContext) -> str:
    return f"outer holds {context.resources.inner.value}"


@dg.sensor(job_name="noop")
def needs_nothing(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    return dg.SkipReason("nothing to do")


@dg.sensor(job_name="noop", required_resource_keys={"outer"})
def needs_outer(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    return dg.SkipReason(context.resources.outer)


@dg.sensor(job_name="noop")
def needs_broken(context: dg.SensorEvaluationContext, broken: Broken) -> dg.SkipReason:
    return dg.SkipReason("unreachable")


@dg.op
def nothing() -> None:
    pass


@dg.job
def noop() -> None:
    nothing()


@dg.schedule(job=noop, cron_schedule="* * * * *")
def every_minute(context: dg.ScheduleEvaluationContext) -> dg.SkipReason:
    return dg.SkipReason("nothing scheduled")


DEFS = dg.Definitions(
    jobs=[noop],
    sensors=[needs_nothing, needs_outer, needs_broken],
    schedules=[every_minute],
    resources={"broken": Broken(), "inner": Inner(value="nested"), "outer": outer},
)


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance


def test_a_tick_builds_only_the_resources_its_sensor_or_schedule_requires(instance) -> None:
    assert tick_sensor("needs_nothing", defs=DEFS, instance=instance).skip_reason == "nothing to do"
    assert tick_sensor("needs_outer", defs=DEFS, instance=instance).skip_reason == "outer holds nested"
    assert tick_schedule("every_minute", defs=DEFS, instance=instance).skip_reason == "nothing scheduled"


def test_a_resource_the_sensor_requires_is_built(instance) -> None:
    with pytest.raises(dg.DagsterResourceFunctionError) as raised:
        tick_sensor("needs_broken", defs=DEFS, instance=instance)
    assert str(raised.value.__cause__) == "the broken resource was built"
