"""files.locked (main) vs filelock.FileLock: one acquire + release of an uncontended lock, alternated over rounds."""
import importlib.util, os, statistics, tempfile, time
import filelock
spec = importlib.util.spec_from_file_location("files", "/work/main/dali_pipes/storage/files.py")
files = importlib.util.module_from_spec(spec); spec.loader.exec_module(files)
path = os.path.join(tempfile.mkdtemp(), "tuning.json.lock")
def old():
    with files.locked(path, 10.0): pass
def new():
    with filelock.FileLock(path, timeout=10.0): pass
res = {"hand-written": [], "filelock": []}
for r in range(11):
    for name, fn in (("hand-written", old), ("filelock", new)) if r % 2 == 0 else (("filelock", new), ("hand-written", old)):
        n = 2000; t = time.perf_counter()
        for _ in range(n): fn()
        res[name].append((time.perf_counter() - t) / n * 1e6)
for name, v in res.items():
    print(name, "median us per lock", round(statistics.median(v), 1), "[", round(min(v), 1), round(max(v), 1), "]")
