"""The Spark cluster tests' view of an application's executors."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from runstate_tests.support.devserver import poll

WORKERS = 2


class Executors:
    """The live executors of an application (their completed and running tasks), from its UI's executors
    REST endpoint."""

    def __init__(self, spark: Any = None, ui: str | None = None) -> None:
        self.ui = ui or spark.sparkContext.uiWebUrl

    def counts(self) -> dict[str, int]:
        """Completed tasks per live executor id."""
        return {e["id"]: int(e["completedTasks"]) for e in self._live()}

    def busy(self) -> list[str]:
        """The ids of the live executors running a task now (as far as the UI's listener knows)."""
        return [e["id"] for e in self._live() if e["activeTasks"] > 0]

    def _live(self) -> list[dict[str, Any]]:
        [app] = self._get("/api/v1/applications")
        executors = self._get(f"/api/v1/applications/{app['id']}/executors")
        return [e for e in executors if e["id"] != "driver" and e["isActive"]]

    def _get(self, path: str) -> Any:
        # Patient: on a loaded machine the UI's Jetty answers in seconds, not milliseconds.
        with urllib.request.urlopen(f"{self.ui}{path}", timeout=60) as response:
            return json.load(response)

    def wait_until_each_ran_tasks_since(self, before: dict[str, int], executors: int = WORKERS) -> dict:
        """Every one of `executors` executors completed tasks after `before` (the UI's listener lags a little)."""

        def grown() -> dict[str, int] | None:
            now = self.counts()
            ran = {e: n - before.get(e, 0) for e, n in now.items() if n > before.get(e, 0)}
            return ran if len(ran) >= executors else None

        return poll(grown, timeout=120, every=0.25, what=f"tasks on {executors} executors")
