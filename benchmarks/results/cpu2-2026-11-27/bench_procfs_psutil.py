"""bench_procfs.py again, psutil done well (issue 36, second try): the hand-written /proc walk
(dali_pipes/run/procfs.py) against psutil reading only what the callers use (memory_info().rss, cpu_times(),
children(recursive=True), one cached Process for this process; no memory_full_info, no USS), and a hybrid (the /proc
children walk for the tree, psutil for each process's fields). host_memory_mb and cpu_seconds, 200 calls per round,
the three alternated (rotated) over 9 rounds; median and spread of microseconds per call. Two trees: 1 + 4 one-thread
processes (bench_procfs.py's), and the shape of a training process (24 threads, as DALI's and torch's pools give it,
and 4 workers of 4 threads each).

    PYTHONPATH=. python benchmarks/results/cpu2-2026-11-27/bench_procfs_psutil.py"""
import os
import statistics
import subprocess
import sys
import threading
import time

import psutil
from bench_usage_psutil import old_module  # run/procfs.py as it was (deleted since: psutil replaced it)

old = old_module()

_SELF = psutil.Process()


class Psutil:
    @staticmethod
    def tree(pid=None):
        root = _SELF if pid is None or pid == os.getpid() else psutil.Process(pid)
        try:
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    @classmethod
    def host_memory_mb(cls, pid=None):
        total = 0
        for p in cls.tree(pid):
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total / 2**20

    @classmethod
    def cpu_seconds(cls, pid=None):
        total = 0.0
        for p in cls.tree(pid):
            try:
                t = p.cpu_times()  # reaped children's time is in their reaper's children_user/system
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        return total


class Hybrid(Psutil):
    _procs: dict = {}

    @classmethod
    def tree(cls, pid=None):
        pid = pid or os.getpid()
        out = []
        for p in [pid, *old.descendants(pid)]:
            if p not in cls._procs:
                try:
                    cls._procs[p] = psutil.Process(p)
                except psutil.Error:
                    continue
            out.append(cls._procs[p])
        return out


def spawn(threads_each):
    code = (f"import threading, time; [threading.Thread(target=time.sleep, args=(120,), daemon=True).start() "
            f"for _ in range({threads_each - 1})]; time.sleep(120)")
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]


def run(label, own_threads, threads_each):
    stop = threading.Event()
    pool = [threading.Thread(target=stop.wait, daemon=True) for _ in range(own_threads - 1)]
    for t in pool:
        t.start()
    kids = spawn(threads_each)
    time.sleep(1.5)
    impls = {"old": old, "psutil": Psutil, "hybrid": Hybrid}
    res = {name: {"mem": [], "cpu": []} for name in impls}
    for r in range(9):
        names = list(impls)[r % 3:] + list(impls)[:r % 3]
        for name in names:
            m = impls[name]
            for key, fn in (("mem", m.host_memory_mb), ("cpu", m.cpu_seconds)):
                t = time.perf_counter()
                n = 200
                for _ in range(n):
                    fn()
                res[name][key].append((time.perf_counter() - t) / n * 1e6)
    print(f"{label}: tree of {1 + len(old.descendants(os.getpid()))} processes, this one with "
          f"{len(os.listdir('/proc/self/task'))} threads; {len(psutil.pids())} processes on the machine, load "
          f"{os.getloadavg()[0]:.2f}; mem MB old/psutil/hybrid {old.host_memory_mb():.1f} "
          f"{Psutil.host_memory_mb():.1f} {Hybrid.host_memory_mb():.1f}")
    for name in res:
        for key in res[name]:
            v = res[name][key]
            print(f"  {name:6} {key} median us/call {statistics.median(v):8.1f} [ {min(v):8.1f} {max(v):8.1f} ] raw",
                  " ".join(f"{x:.0f}" for x in v))
    for k in kids:
        k.kill()
        k.wait()
    stop.set()


if __name__ == "__main__":
    print("psutil", psutil.__version__, "Python", sys.version.split()[0], time.strftime("%Y-%m-%d %H:%M"))
    run("bench_procfs.py's tree", 1, 1)
    run("a training process's shape", 24, 4)
