"""Our moto server keeps DynamoDB's single-item atomicity, which plain moto_server loses under load.

moto's `put_item` reads the current item, evaluates the condition, then writes. On a busy server a
request thread is preempted in between, and another conditional put of the same key passes the
same check. Waiting for load to line that up makes a test that fails at random, so both servers
run as real processes whose item read is followed by a 2 ms pause: the preemption, every time.
Threads race conditional PutItems on the same keys, all released together for each key. On plain
moto keys are won twice; on ours each key is won exactly once.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import boto3
from botocore.config import Config

from runstate.services.moto import healthy
from runstate.services.state import free_port

PLAIN = "moto.server"
OURS = "runstate.services.moto_server"
RACERS = 8
KEYS = 30
# Every item read (put_item's condition check starts with one) is followed by a pause, in the server.
PREEMPTED_AFTER_READ = """
import time
from moto.dynamodb.models.table import Table
read_item = Table.get_item
def read_then_pause(self, *args, **kwargs):
    item = read_item(self, *args, **kwargs)
    time.sleep(0.002)
    return item
Table.get_item = read_then_pause
"""


@contextmanager
def moto_process(module: str) -> Iterator[str]:
    """A moto server process (plain or ours), preempted between the read and the write of every put."""
    port = free_port()
    code = f"{PREEMPTED_AFTER_READ}\nfrom {module} import main\nmain(['-H', '127.0.0.1', '-p', '{port}'])\n"
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not healthy(url):
            assert process.poll() is None, process.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, f"{module} did not answer within 120 s"
            time.sleep(0.2)
        yield url
    finally:
        process.kill()
        process.wait()


def dynamodb(url: str):
    config = Config(max_pool_connections=RACERS * 2, retries={"max_attempts": 1}, read_timeout=120)
    return boto3.client(
        "dynamodb",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=config,
    )


def wins_per_key(url: str) -> Counter[int]:
    """Every racer tries a conditional first write of each key; how many of them succeeded, per key."""
    client = dynamodb(url)
    table = f"race_{uuid.uuid4().hex[:8]}"
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    wins: Counter[int] = Counter()
    count_lock = threading.Lock()
    together = threading.Barrier(RACERS)

    def racer(racer_id: int) -> None:
        for key in range(KEYS):
            together.wait(timeout=120)
            try:
                client.put_item(
                    TableName=table,
                    Item={"pk": {"S": f"k{key}"}, "by": {"N": str(racer_id)}},
                    ConditionExpression="attribute_not_exists(pk)",
                )
            except client.exceptions.ConditionalCheckFailedException:
                continue
            with count_lock:
                wins[key] += 1

    with ThreadPoolExecutor(RACERS) as pool:
        list(pool.map(racer, range(RACERS)))
    return wins


def test_plain_moto_lets_two_conditional_puts_on_one_key_both_succeed():
    """The control: it shows that the test below can fail."""
    with moto_process(PLAIN) as url:
        wins = wins_per_key(url)

    assert max(wins.values()) > 1


def test_our_moto_lets_exactly_one_conditional_put_win_each_key():
    with moto_process(OURS) as url:
        wins = wins_per_key(url)

    assert wins == Counter({key: 1 for key in range(KEYS)})


def test_a_stalled_upload_does_not_hold_up_other_requests():
    """The body is read before the lock, so a client that stops mid-body blocks nobody."""
    with moto_process(OURS) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as stalled:
            stalled.sendall(
                b"PUT /stalled-bucket/key HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Length: 1000\r\n\r\n" + b"x" * 10
            )

            tables = dynamodb(url).list_tables()  # read_timeout 120 s: a held lock would surface as an error

        assert tables["TableNames"] == []


def test_a_chunked_upload_arrives_whole():
    """Transfer-Encoding: chunked has no Content-Length; the buffered body must still reach moto."""
    with moto_process(OURS) as url:
        s3 = boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        s3.create_bucket(Bucket="chunks")
        body = b"".join(f"line {n}\n".encode() for n in range(5000))
        conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
        conn.request("PUT", "/chunks/blob", body=iter([body[:7000], body[7000:]]), encode_chunked=True)
        assert conn.getresponse().status == 200
        conn.close()

        assert s3.get_object(Bucket="chunks", Key="blob")["Body"].read() == body


def test_our_server_exits_cleanly_on_sigterm():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", OURS, "-H", "127.0.0.1", "-p", str(port)])
    try:
        deadline = time.monotonic() + 120
        while not healthy(f"http://127.0.0.1:{port}") and time.monotonic() < deadline:
            time.sleep(0.2)
        process.terminate()
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
