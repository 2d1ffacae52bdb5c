"""A standalone Spark cluster from the installed pyspark: one master and N workers, on loopback only.

`runstate services up --spark-workers N` starts it (and `down` stops it); tests and the benchmark start
their own with `StandaloneCluster.start`. pip's pyspark ships `bin/spark-class` but not `sbin/`, so
each daemon is `spark-class org.apache.spark.deploy.<master|worker>...` in a session of its own, with
`SPARK_LOCAL_IP=127.0.0.1` (else the daemons bind the machine's external address) and free ports.

Every daemon's executors and Python workers stay in its session (Spark's launcher forks them without
setsid; pyspark's daemon only changes its process group), so stopping a daemon means signalling every
process of its session: no executor JVM or Python worker outlives `down`, even one whose parent died.

The daemons get no AWS credentials from the caller's environment: on a real cluster executors do not
share the driver's environment either, so the blob reads must get the endpoint and credentials from
the configuration (`BlobLocation`, shipped with the task) or from the executors' own chain.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runstate.config import state_dir
from runstate.services.state import (
    EMBEDDED,
    LOOPBACK,
    ServiceError,
    ServiceRecord,
    free_port,
    is_running,
    service_record,
    spawn_detached,
    wait_until,
)

Log = Callable[[str], None]
MASTER = "spark-master"
WORKER_PREFIX = "spark-worker-"
# Each worker offers 2 cores and 2g, and an application gets one core on every worker (the master's
# spark.deploy.defaultCores = the number of workers): two applications (a merge run beside a
# maintenance run, or a test session beside a zombie) both get one executor per worker at once.
WORKER_CORES = 2
WORKER_MEMORY = "2g"
DAEMON_MEMORY = "512m"  # the master and worker daemons only schedule; executors get their own heap
# What a worker may take of the machine: the memory it offers its executors plus its daemon's heap. A
# machine runs at most one worker per core and per this much memory (`max_workers`).
WORKER_FOOTPRINT_BYTES = (2048 + 512) << 20
# Workers start this many at a time, and each wave registers before the next starts: a starting JVM
# takes a core for seconds, and a worker that cannot start stops the rest from being started at all.
START_WAVE = 4
# A worker deletes the folders (jars included) of applications that ended more than an hour ago.
WORKER_OPTS = (
    "-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval=600 "
    "-Dspark.worker.cleanup.appDataTtl=3600"
)
START_TIMEOUT_S = 180.0  # a JVM starting on a loaded, shared machine
STOP_TIMEOUT_S = 30.0


def spark_home() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError("spark: pyspark is not installed in this Python; run `make setup`")
    home = Path(list(spec.submodule_search_locations)[0])
    if not (home / "bin" / "spark-class").exists():
        raise ServiceError(f"spark: {home}/bin/spark-class is missing; reinstall pyspark")
    return home


def max_workers() -> int:
    """The most workers this machine runs: one per core (of this process's) and per 2.5 GiB of memory."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, min(len(os.sched_getaffinity(0)), memory // WORKER_FOOTPRINT_BYTES))


def check_workers(workers: int) -> None:
    """ServiceError when this machine cannot run `workers` workers (before any is started)."""
    limit = max_workers()
    if workers > limit:
        raise ServiceError(
            f"spark: {workers} workers is more than this machine can run: at most {limit} (one per core "
            f"and per {WORKER_FOOTPRINT_BYTES >> 20} MiB of memory; each offers {WORKER_CORES} cores and "
            f"{WORKER_MEMORY})"
        )


def daemon_env(default_cores: int | None = None) -> dict[str, str]:
    """The caller's environment without AWS or Spark settings, plus loopback and the daemons' options
    (`default_cores`: the master's cores per application)."""
    dropped = ("AWS_", "SPARK_", "PYSPARK_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(dropped)}
    env.update(
        {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_WORKER_OPTS": WORKER_OPTS,
        }
    )
    if default_cores is not None:
        env["SPARK_MASTER_OPTS"] = f"-Dspark.deploy.defaultCores={default_cores}"
    return env


def _spark_class(*args: str) -> list[str]:
    return [str(spark_home() / "bin" / "spark-class"), *args]


def master_state(webui: str) -> dict[str, Any] | None:
    """The master's own JSON status page, or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"{webui}/json/", timeout=2) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


def alive_worker_ports(webui: str) -> set[int]:
    state = master_state(webui) or {}
    return {int(w["port"]) for w in state.get("workers", []) if w.get("state") == "ALIVE"}


def session_members(sid: int) -> list[int]:
    """Every live process of session `sid` (a session id is never reused while a member lives)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                members.append(int(stat.parent.name))
    return members


def kill_session(record: ServiceRecord) -> None:
    """SIGKILL a daemon with its executors and Python workers at once: the machine is gone."""
    if record.pid is None or not is_running(record):
        return
    for pid in session_members(record.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(record.pid, STOP_TIMEOUT_S)


def stop_session(record: ServiceRecord, timeout: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM the daemon (a worker then stops its executors), then SIGKILL what is left of its session.

    False when the daemon was not running (whatever of its session is left is still killed)."""
    if record.pid is None:
        return False
    was_running = is_running(record)
    if was_running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGTERM)
        _wait_gone(record.pid, timeout)
    for pid in session_members(record.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(record.pid, timeout)
    return was_running


def _wait_gone(sid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(sid, os.WNOHANG)  # reap it when this very process started it
        if not session_members(sid):
            return
        time.sleep(0.1)


@dataclass
class StandaloneCluster:
    """A master and its workers, each a ServiceRecord (pid, start time, ports, log)."""

    master: ServiceRecord
    base_dir: Path
    workers: dict[str, ServiceRecord] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.master.url

    @property
    def webui(self) -> str:
        return self.master.extra["webui"]

    @classmethod
    def start(
        cls, workers: int, base_dir: Path | None = None, *, wave: int = START_WAVE, log: Log = lambda _: None
    ) -> StandaloneCluster:
        """A new master and `workers` workers; everything started is stopped again if one fails."""
        check_workers(workers)
        base_dir = base_dir or state_dir() / "spark"
        cluster = cls(start_master(base_dir, default_cores=max(workers, 1)), base_dir)
        try:
            cluster.scale(workers, wave=wave, log=log)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def scale(self, workers: int, *, wave: int = START_WAVE, log: Log = lambda _: None) -> None:
        """Start or stop workers until exactly `workers` of ours are running and registered; new ones
        start `wave` at a time, each wave registered before the next is started."""
        check_workers(workers)
        for name, record in list(self.workers.items()):
            if not is_running(record):
                stop_session(record)
                del self.workers[name]
        while len(self.workers) > workers:
            name = max(self.workers, key=_worker_index)
            stop_session(self.workers.pop(name))
        while len(self.workers) < workers:
            started = [self._spawn_worker() for _ in range(min(wave, workers - len(self.workers)))]
            for name, process in started:
                log(f"{name} started (pid {process.pid})")
            for name, process in started:
                self.workers[name] = self._await_worker(name, process)
                log(f"{name} registered with {self.url}")

    def _spawn_worker(self) -> tuple[str, Any]:
        index = 1 + max((_worker_index(name) for name in self.workers), default=0)
        name = f"{WORKER_PREFIX}{index}"
        port, webui_port = free_port(), free_port()
        work_dir = self.base_dir / f"worker-{index}"
        work_dir.mkdir(parents=True, exist_ok=True)
        argv = _spark_class(
            "org.apache.spark.deploy.worker.Worker",
            self.url,
            *("--host", LOOPBACK, "--port", str(port), "--webui-port", str(webui_port)),
            *("--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY, "--work-dir", str(work_dir)),
        )
        log = self.base_dir / "logs" / f"{name}.log"
        process = spawn_detached(argv, log_path=log, env=daemon_env())
        self.workers[name] = service_record(name, f"spark://{LOOPBACK}:{port}", port, process, log, {})
        return name, process

    def _await_worker(self, name: str, process: Any) -> ServiceRecord:
        record = self.workers[name]
        wait_until(
            lambda: record.port in alive_worker_ports(self.webui),
            timeout=START_TIMEOUT_S,
            process=process,
            what=f"{name} (registering with {self.url})",
            log=Path(record.log or ""),
        )
        return record

    def kill_worker(self, name: str) -> None:
        kill_session(self.workers.pop(name))

    def worker_of(self, pid: int) -> str | None:
        """The worker whose session holds process `pid` (an executor's Python worker, say)."""
        try:
            sid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
        except (OSError, IndexError, ValueError):
            return None
        return next((name for name, r in self.workers.items() if r.pid == sid), None)

    def healthy(self) -> bool:
        ports = alive_worker_ports(self.webui) if is_running(self.master) else set()
        return all(is_running(r) and r.port in ports for r in self.workers.values())

    def stop(self) -> list[str]:
        """Workers first (each takes its executors along), then the master; the names that were running."""
        stopped = [name for name, record in self.workers.items() if stop_session(record)]
        self.workers.clear()
        if stop_session(self.master):
            stopped.append(MASTER)
        return stopped

    def records(self) -> dict[str, ServiceRecord]:
        return {MASTER: self.master, **self.workers}

    @classmethod
    def from_records(cls, records: Mapping[str, ServiceRecord], base_dir: Path) -> StandaloneCluster | None:
        master = records.get(MASTER)
        if master is None:
            return None
        workers = {name: r for name, r in records.items() if name.startswith(WORKER_PREFIX)}
        return cls(master, base_dir, workers)


def start_master(base_dir: Path, *, default_cores: int) -> ServiceRecord:
    port, webui_port = free_port(), free_port()
    webui = f"http://{LOOPBACK}:{webui_port}"
    argv = _spark_class(
        "org.apache.spark.deploy.master.Master",
        *("--host", LOOPBACK, "--port", str(port), "--webui-port", str(webui_port)),
    )
    log = base_dir / "logs" / f"{MASTER}.log"
    process = spawn_detached(argv, log_path=log, env=daemon_env(default_cores))
    wait_until(
        lambda: (master_state(webui) or {}).get("status") == "ALIVE",
        timeout=START_TIMEOUT_S,
        process=process,
        what=MASTER,
        log=log,
    )
    return service_record(MASTER, f"spark://{LOOPBACK}:{port}", port, process, log, {"webui": webui})


def _worker_index(name: str) -> int:
    return int(name[len(WORKER_PREFIX) :])


# ----- `runstate services up|down|status`: the cluster's records live in .runstate/spark.json


def cluster_file() -> Path:
    return state_dir() / "spark.json"


def load_cluster() -> StandaloneCluster | None:
    path = cluster_file()
    if not path.exists():
        return None
    records = {name: ServiceRecord(**raw) for name, raw in json.loads(path.read_text()).items()}
    return StandaloneCluster.from_records(records, state_dir() / "spark")


def save_cluster(cluster: StandaloneCluster | None) -> None:
    path = cluster_file()
    if cluster is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({n: asdict(r) for n, r in cluster.records().items()}, indent=2) + "\n")


def up(caller_env: Mapping[str, str], workers: int | None, log: Log = lambda _: None) -> dict[str, str]:
    """Bring the recorded cluster to `workers` workers (None: as recorded, 0: stop it).

    Returns the `.env` values: RUNSTATE_SPARK_MASTER while a cluster of ours runs, else nothing.
    Called by `runstate.services.up` under its lock.
    """
    cluster = load_cluster()
    if workers and caller_env.get("RUNSTATE_SPARK_MASTER") not in (
        None,
        "",
        *([cluster.url] if cluster else []),
    ):
        raise ServiceError(
            f"spark: RUNSTATE_SPARK_MASTER={caller_env['RUNSTATE_SPARK_MASTER']} names another cluster; "
            "unset it to let `runstate services up --spark-workers N` start one on loopback"
        )
    # None keeps the recorded size: a plain `up` restarts a cluster that lost a daemon.
    wanted = workers if workers is not None else len(cluster.workers) if cluster else 0
    check_workers(wanted)  # before the running cluster is stopped for a size this machine cannot run
    reusable = cluster is not None and cluster.healthy() and len(cluster.workers) == wanted
    if cluster is not None and not reusable:
        # Stopped, not resized: the master's defaultCores (one core per worker) was set at its start.
        for name in cluster.stop():
            log(f"{name:<9} stopped")
        cluster = None
    if wanted and cluster is None:
        cluster = StandaloneCluster.start(wanted, log=log)
    if cluster is not None:
        log(f"{MASTER:<9} embedded {cluster.url} ({len(cluster.workers)} worker(s), UI {cluster.webui})")
    save_cluster(cluster)
    return {"RUNSTATE_SPARK_MASTER": cluster.url} if cluster else {}


def down(log: Log = lambda _: None) -> list[str]:
    cluster = load_cluster()
    stopped = cluster.stop() if cluster else []
    for name in stopped:
        log(f"{name:<9} stopped")
    save_cluster(None)
    return stopped


def status() -> list[tuple[str, str, str, bool, int | None, str]]:
    """(name, kind, url, healthy, pid, detail) of the master and each worker."""
    cluster = load_cluster()
    if cluster is None:
        return []
    alive = alive_worker_ports(cluster.webui) if is_running(cluster.master) else set()
    master_ok = is_running(cluster.master) and master_state(cluster.webui) is not None
    rows = [(MASTER, EMBEDDED, cluster.url, master_ok, cluster.master.pid, f"UI {cluster.webui}")]
    for name, record in cluster.workers.items():
        ok = is_running(record) and record.port in alive
        detail = "" if ok else "not registered with the master; run `runstate services up --spark-workers N`"
        rows.append((name, EMBEDDED, record.url, ok, record.pid, detail))
    return rows
