"""Old /proc walk (procfs.py on main) vs psutil (resources.py): host_memory_mb and cpu_seconds of a tree of
1 + 4 processes, alternated over rounds; median and spread of microseconds per call.

As it ran on 2026-11-27 (first try, recorded in plumbing.md), kept as the record: it loaded procfs.py from the main
checkout and the try's resources.py from a helper's worktree, never committed. procfs.py is deleted since (psutil
replaced it: run/usage.py; the old module is `git show 6bb4e53:dali_pipes/run/procfs.py`), so this no longer runs.
Its successor, which runs: bench_usage_psutil.py."""
import importlib.util, statistics, subprocess, sys, time
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m
old = load("/work/main/dali_pipes/run/procfs.py", "old")
new = load("/work/wt/install/dali_pipes/run/resources.py", "new")
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(4)]
time.sleep(1)
res = {"old": {"mem": [], "cpu": []}, "new": {"mem": [], "cpu": []}}
for r in range(9):
    for name, m in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
        for key, fn in (("mem", m.host_memory_mb), ("cpu", m.cpu_seconds)):
            t = time.perf_counter(); n = 200
            for _ in range(n): fn()
            res[name][key].append((time.perf_counter() - t) / n * 1e6)
print("tree of", 1 + len(new.descendants(0 or __import__("os").getpid())), "processes; mem MB old/new:",
      round(old.host_memory_mb(), 1), round(new.host_memory_mb(), 1))
for name in res:
    for key in res[name]:
        v = res[name][key]; print(name, key, "median us/call", round(statistics.median(v), 1), "[", round(min(v), 1), round(max(v), 1), "]")
for k in kids: k.kill()
