"""runstate.procfs: what /proc says of a process and the processes below it."""

from __future__ import annotations

import subprocess
import time

from runstate.procfs import alive, descendants


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as handle:
        return handle.read().strip()


def test_descendants_are_every_process_below_whatever_its_session_and_no_other():
    # Two levels below the root, one of them in a session of its own (setsid), and a stranger beside.
    tree = subprocess.Popen(["sh", "-c", "sleep 60 & setsid sh -c 'sleep 61 & wait' & wait"])
    stranger = subprocess.Popen(["sleep", "62"])
    try:
        deadline = time.monotonic() + 30
        while len(found := descendants(tree.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)

        assert sorted(map(comm, found)) == ["sh", "sleep", "sleep"]
        assert stranger.pid not in found and tree.pid not in found
        assert all(map(alive, found))
    finally:
        for pid in descendants(tree.pid):
            subprocess.run(["kill", str(pid)], check=False)
        tree.kill()
        stranger.kill()
        tree.wait()
        stranger.wait()

    assert descendants(tree.pid) == []
