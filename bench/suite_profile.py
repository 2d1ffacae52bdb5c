"""Where the test suite's CPU goes, by kind of process: the measurement behind the suite's time.

    .venv/bin/python bench/suite_profile.py [--every 1.0] -- .venv/bin/pytest -n 3 --dist loadgroup ...

On two cores the suite is CPU-bound (the host is over 95% busy), so its wall time is its CPU divided
by two: only CPU taken out of some kind of process shortens it. This runs the command given after `--`
and samples every process on the host each `--every` seconds (/proc, Linux only), adding each one's
CPU since the last sample to its kind (a Spark driver, a test worker, a code server, a Postgres
backend, ...). It prints one JSON line: the wall time, the host's busy CPU seconds (exact, from
/proc/stat), the sampled CPU seconds (processes that live under one period are partly missed), and the
sampled seconds by kind, largest first. A profile, not a result: it prints no ratio to quote.

A process is classed by its command line, read again whenever its name changes, so a `spark-class`
script that execs its JVM is counted as the JVM. Run it alone, as any benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")

# (kind, what the command line contains): the first match names the process.
KINDS = (
    ("spark driver (test worker sessions)", ("spark.app.name=runstate-tests",)),
    ("spark driver (other)", ("SparkSubmit",)),
    ("spark executor", ("CoarseGrainedExecutorBackend",)),
    ("spark master/worker", ("deploy.master.Master", "deploy.worker.Worker")),
    ("pyspark python workers", ("pyspark.daemon", "pyspark.worker")),
    ("java (other)", ("bin/java",)),
    ("moto server", ("moto_server",)),
    ("fakesnow server", ("fakesnow_server",)),
    # `dagster dev` starts these as modules; their --instance-ref JSON can name the others, so each is
    # known by how it was started.
    ("dagster webserver", ("-m dagster_webserver", "bin/dagster-webserver")),
    ("dagster daemon", ("-m dagster._daemon", "bin/dagster-daemon")),
    ("dagster code server", ("-m dagster code-server", "-m dagster api grpc", "bin/dagster code-server")),
    # A code server starts each run with multiprocessing's spawn (dagster/_grpc/server.py).
    ("dagster run", ("execute_run", "execute_step", "multiprocessing.spawn")),
    ("dagster dev", ("dagster dev",)),
    ("runstate dev", ("bin/runstate dev",)),
    ("runstate cli", ("bin/runstate",)),
    ("pytest worker", ("exec(eval(sys.stdin.readline()))",)),
    ("pytest main", ("bin/pytest",)),
    ("postgres", ("postgres",)),
    ("python (other)", ("python",)),
)


def kind_of(cmdline: str) -> str:
    if not cmdline:
        return "kernel or unnamed"
    return next((kind for kind, marks in KINDS if any(mark in cmdline for mark in marks)), "other")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def sample(names: dict[int, tuple[str, str]]) -> dict[int, tuple[int, str]]:
    """{pid: (CPU ticks, kind)} of every process now; `names` caches (name, kind) per pid."""
    now: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read(f"/proc/{entry}/stat")
        if stat is None:
            continue
        close = stat.rindex(")")
        name, fields = stat[stat.index("(") + 1 : close], stat[close + 2 :].split()
        pid = int(entry)
        cached = names.get(pid)
        if cached is None or cached[0] != name:  # new, or exec'd into another program
            cmdline = (_read(f"/proc/{entry}/cmdline") or "").replace("\0", " ").strip()
            cached = names[pid] = (name, kind_of(cmdline))
        now[pid] = (int(fields[11]) + int(fields[12]), cached[1])
    return now


def host_busy_ticks() -> int:
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def profile(command: list[str], every: float) -> dict:
    load_start = round(os.getloadavg()[0], 2)
    names: dict[int, tuple[str, str]] = {}
    by_kind: dict[str, float] = {}
    before = sample(names)
    busy, started = host_busy_ticks(), time.monotonic()
    child = subprocess.Popen(command)
    while child.poll() is None:
        time.sleep(every)
        after = sample(names)
        for pid, (ticks, kind) in after.items():
            # A pid seen before with more ticks is the same process; a new pid counts from zero.
            spent = ticks - before[pid][0] if pid in before and ticks >= before[pid][0] else ticks
            by_kind[kind] = by_kind.get(kind, 0.0) + spent / TICKS
        before = after
        names = {pid: names[pid] for pid in after if pid in names}
    wall, busy = time.monotonic() - started, (host_busy_ticks() - busy) / TICKS
    kinds = sorted(by_kind.items(), key=lambda item: -item[1])
    return {
        "bench": "suite_profile",
        "rc": child.returncode,
        "wall_s": round(wall, 1),
        "host_busy_cpu_s": round(busy, 1),
        "sampled_cpu_s": round(sum(by_kind.values()), 1),
        "cpu_s_by_kind": {kind: round(seconds, 1) for kind, seconds in kinds if seconds >= 0.5},
        "load_start": load_start,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples (default 1)")
    args = parser.parse_args(ours)
    if not command:
        parser.error("give the command to profile after --")
    result = profile(command, args.every)
    print(json.dumps(result), flush=True)
    return 0 if result["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
