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
        deadline = time.monotonic() + 30  # until each child has run its program (a fork shows "sh" first)
        while sorted(map(comm, descendants(tree.pid))) != ["sh", "sleep", "sleep"]:
            assert time.monotonic() < deadline, sorted(map(comm, descendants(tree.pid)))
            time.sleep(0.05)
        found = descendants(tree.pid)

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
