"""Real faults for real boto3 clients: a botocore event hook that makes chosen calls fail.

`before` faults fail the call before it reaches the server (nothing happened); `after` faults fail
it after the server applied it (the response is lost), the case that makes retries dangerous.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError

from runstate.wal import WalServiceError


class InjectedFault(BotoCoreError):
    """Stands for a network failure on one call (a BotoCoreError, as botocore's own connection errors are)."""

    fmt = "{message}"


# What an injected fault surfaces as: WalTable and BlobStore wrap it in WalServiceError (naming the
# table or bucket); the stream reader lets botocore's error through.
FAULT_ERRORS = (InjectedFault, WalServiceError)


class Faults:
    """Fail `operation` calls on `client`: the next `count` of them, or each with probability `rate`."""

    def __init__(
        self,
        client: Any,
        operation: str,
        *,
        count: int = 0,
        rate: float = 0.0,
        after: bool = False,
        rng: random.Random | None = None,
        skip: int = 0,
        when: Callable[[dict], bool] | None = None,
    ) -> None:
        self.operation = operation
        self.remaining = count
        self.rate = rate
        self.rng = rng or random.Random(0)
        self.skip = skip
        self.when = when
        self.failed = 0
        self.calls = 0
        self._lock = threading.Lock()
        service = client.meta.service_model.service_id.hyphenize()
        self.event = f"{'after' if after else 'before'}-call.{service}.{operation}"
        self.client = client
        # The API parameters are only seen before they are serialised: keep them in the call's context.
        self.params_event = f"before-parameter-build.{service}.{operation}"
        client.meta.events.register(self.params_event, self._remember, unique_id=f"fault-params-{id(self)}")
        client.meta.events.register(self.event, self._hook, unique_id=f"fault-{id(self)}")

    @staticmethod
    def _remember(params: dict, context: dict, **_: Any) -> None:
        context["fault_params"] = dict(params)

    def _hook(self, **kwargs: Any) -> None:
        params = (kwargs.get("context") or {}).get("fault_params", {})
        with self._lock:
            if self.when is not None and not self.when(params):
                return
            self.calls += 1
            if self.calls <= self.skip:
                return
            fail = self.remaining > 0 or (self.rate > 0 and self.rng.random() < self.rate)
            if not fail:
                return
            if self.remaining > 0:
                self.remaining -= 1
            self.failed += 1
        raise InjectedFault(message=f"injected failure of {self.operation} ({self.event})")

    def remove(self) -> None:
        self.client.meta.events.unregister(self.event, unique_id=f"fault-{id(self)}")
        self.client.meta.events.unregister(self.params_event, unique_id=f"fault-params-{id(self)}")
