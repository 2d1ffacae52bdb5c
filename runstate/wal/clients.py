"""boto3 clients for the WAL: a session of their own, a connection per worker thread, standard retries."""

from __future__ import annotations

from typing import Any

# The flush marks rows Applied from thread pools (several datasets at once): keep a connection per thread.
MAX_POOL_CONNECTIONS = 64


def aws_client(
    service: str,
    *,
    endpoint_url: str | None = None,
    region: str = "us-east-1",
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
) -> Any:
    """A client of `service` (dynamodb, dynamodbstreams, s3); empty credentials use boto3's own chain."""
    import boto3
    from botocore.config import Config

    # A session of our own: boto3's default session is not safe to share across threads.
    session = boto3.session.Session(
        aws_access_key_id=access_key_id or None,
        aws_secret_access_key=secret_access_key or None,
        region_name=region,
    )
    config = Config(max_pool_connections=MAX_POOL_CONNECTIONS, retries={"mode": "standard"})
    return session.client(service, endpoint_url=endpoint_url, config=config)
