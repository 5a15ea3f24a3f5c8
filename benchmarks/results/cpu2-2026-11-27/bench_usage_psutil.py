"""psutil adopted (issue 36, third try): dali_pipes/run/usage.py (psutil reads each process's fields; the tree from
the kernel's /proc/PID/task/*/children, psutil's walk where Linux lacks them) against the hand-written /proc module it
replaced (run/procfs.py as of 6bb4e53, read from git). host_memory_mb and cpu_seconds, 200 calls per round, the two
alternated over 11 rounds; median and spread of microseconds per call, and the figures each gives. Two trees: 1 + 4
one-thread processes, and a training process's shape (24 threads, 4 workers of 4 threads each).

    PYTHONPATH=. python benchmarks/results/cpu2-2026-11-27/bench_usage_psutil.py"""
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil

from dali_pipes.run import usage as new


def old_module():
    source = subprocess.run(["git", "show", "6bb4e53:dali_pipes/run/procfs.py"], check=True, capture_output=True,
                            text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "old_procfs.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("old_procfs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spawn(threads_each):
    code = (f"import threading, time; [threading.Thread(target=time.sleep, args=(120,), daemon=True).start() "
            f"for _ in range({threads_each - 1})]; time.sleep(120)")
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]


def run(label, old, own_threads, threads_each, rounds=11, calls=200):
    stop = threading.Event()
    pool = [threading.Thread(target=stop.wait, daemon=True) for _ in range(own_threads - 1)]
    for t in pool:
        t.start()
    kids = spawn(threads_each)
    time.sleep(1.5)
    impls = {"hand-written": old, "psutil": new}
    res = {name: {"mem": [], "cpu": []} for name in impls}
    for r in range(rounds):
        for name in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
            for key, fn in (("mem", impls[name].host_memory_mb), ("cpu", impls[name].cpu_seconds)):
                t = time.perf_counter()
                for _ in range(calls):
                    fn()
                res[name][key].append((time.perf_counter() - t) / calls * 1e6)
    print(f"{label}: tree of {1 + len(new.descendants(os.getpid()))} processes, this one with "
          f"{len(os.listdir('/proc/self/task'))} threads; {len(psutil.pids())} processes on the machine, load "
          f"{os.getloadavg()[0]:.2f}; MB hand-written/psutil {old.host_memory_mb():.1f} {new.host_memory_mb():.1f}; "
          f"CPU s {old.cpu_seconds():.2f} {new.cpu_seconds():.2f}")
    for name in res:
        for key in res[name]:
            v = res[name][key]
            print(f"  {name:12} {key} median us/call {statistics.median(v):8.1f} [ {min(v):8.1f} {max(v):8.1f} ] raw",
                  " ".join(f"{x:.0f}" for x in v))
    for k in kids:
        k.kill()
        k.wait()
    stop.set()


if __name__ == "__main__":
    print("psutil", psutil.__version__, "Python", sys.version.split()[0], time.strftime("%Y-%m-%d %H:%M"))
    old = old_module()
    run("1 + 4 one-thread processes", old, 1, 1)
    run("a training process's shape", old, 24, 4)
