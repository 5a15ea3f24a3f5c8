"""dist.py: which rank this process is, and the worker pools of convert / verify / the sample dataset."""

import os
import subprocess
import sys

import pytest

from dali_pipes.run.dist import Shard
from dali_pipes.tools.workers import process_pool


def test_shard_from_explicit_values_environment_and_default(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert Shard.from_env() == Shard(0, 1, 0)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert Shard.from_env() == Shard(3, 4, 1)
    assert Shard.from_env(rank=0, world_size=2) == Shard(0, 2, 1)
    with pytest.raises(ValueError, match="rank 4 is not in"):
        Shard(4, 4)


def test_pools_spawn_once_dali_is_loaded():
    """A fork of a process with DALI's threads can hang on a lock they held: pools spawn then."""
    code = ("import sys, os; from dali_pipes.tools.workers import process_pool\n"
            "if __name__ == '__main__':\n"
            "    with process_pool(1) as p: print(p._mp_context.get_start_method())\n"
            "    import nvidia.dali\n"
            "    with process_pool(1) as p:\n"
            "        print(p._mp_context.get_start_method(), list(p.map(os.getenv, ['HOME']))[0] is not None)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["fork", "spawn", "True"]


def test_pool_sees_the_environment_of_now(monkeypatch):
    monkeypatch.setenv("DALI_PIPES_TEST_VALUE", "seen")
    with process_pool(1) as pool:
        assert list(pool.map(os.getenv, ["DALI_PIPES_TEST_VALUE"])) == ["seen"]


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_pool_workers_die_with_their_parent(how, tmp_path):
    import signal
    import time
    script = (
        "import os, sys, time\n"
        "from dali_pipes.tools.workers import process_pool\n"
        "def pid(_): return os.getpid()\n"
        "def nap(_): time.sleep(600)\n"
        "if __name__ == '__main__':\n"
        "    pool = process_pool(2)\n"
        "    pids = set(pool.map(pid, range(8)))\n"
        "    futures = [pool.submit(nap, i) for i in range(2)]\n"
        "    print(' '.join(map(str, pids)), flush=True)\n"
        "    time.sleep(600)\n")
    (tmp_path / "parent.py").write_text(script)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    workers = [int(p) for p in parent.stdout.readline().split()]
    assert workers and all(_alive(p) for p in workers)
    parent.send_signal(getattr(signal, how))
    parent.wait(30)
    deadline = time.monotonic() + 30  # a wait, not a timing check: the watchdog polls every second
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphans = [p for p in workers if _alive(p)]
    for pid in orphans:  # a failed test leaves no process behind
        os.kill(pid, signal.SIGKILL)
    assert orphans == []


def _alive(pid: int) -> bool:
    """A process that runs (a zombie, dead but not yet reaped by init, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
