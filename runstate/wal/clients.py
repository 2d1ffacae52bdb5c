"""boto3 clients for the WAL: sessions kept per process, a connection per worker thread, standard retries."""

from __future__ import annotations

import os
import threading
from typing import Any

from runstate import defaults

# The flush marks rows Applied from thread pools (several datasets at once): keep a connection per thread.
MAX_POOL_CONNECTIONS = 64

# A new boto3 session parses botocore's JSON models again (the endpoints, the service's API): about 0.13 s
# of CPU for each client made from it, against 0.01 s from a session that has them. A sensor builds its
# resources at every tick (wal_sensor every 5 s), so each process keeps one session per credentials and
# region. A session is not thread-safe: clients are made from it under the lock. The clients themselves
# are thread-safe, and each has its own event hooks.
_sessions: dict[tuple[str | None, str | None, str], Any] = {}
_sessions_lock = threading.Lock()


def _forget_sessions_in_a_forked_child() -> None:
    global _sessions_lock
    _sessions.clear()
    _sessions_lock = threading.Lock()  # it may have been held by a thread that does not exist here


os.register_at_fork(after_in_child=_forget_sessions_in_a_forked_child)


def aws_client(
    service: str,
    *,
    endpoint_url: str | None = None,
    region: str = defaults.AWS_REGION,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
) -> Any:
    """A new client of `service` (dynamodb, dynamodbstreams, s3); empty credentials use boto3's own chain."""
    import boto3
    from botocore.config import Config

    key = (access_key_id or None, secret_access_key or None, region)
    config = Config(max_pool_connections=MAX_POOL_CONNECTIONS, retries={"mode": "standard"})
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None:
            # A session of our own: boto3's default session is not safe to share across threads.
            session = _sessions[key] = boto3.session.Session(
                aws_access_key_id=key[0], aws_secret_access_key=key[1], region_name=region
            )
        return session.client(service, endpoint_url=endpoint_url, config=config)
