"""What every benchmark's command line shares: the built-in dataset as default data, the resolved
configs saved with the results, the command that reproduces a run, and one-line errors.

Each benchmark module (loaders, training, soak, formats) has `main(argv=None) -> int` and runs as
`python -m dali_pipes_bench.<name>`, which is what `dali-pipes bench <name>` starts."""

from __future__ import annotations

import datetime
import importlib.util
import itertools
import os
import shlex
import sys
from dataclasses import asdict
from typing import Callable, Iterable, Sequence

from tqdm import tqdm

from dali_pipes.errors import install_hint

DEFAULT_DATA = "data/sample/images/train"  # the built-in train split, relative to the working directory
BENCH_EXTRA = install_hint("bench")


def data_or_builtin(data: str) -> str:
    """`data`, or the built-in train split, made (once) when missing."""
    if data:
        return data
    if not os.path.isdir(DEFAULT_DATA):
        from dali_pipes.tools.sample_data import make_sample_dataset
        print(f"making the built-in dataset in {os.path.dirname(DEFAULT_DATA)} (pass --data to use yours)",
              file=sys.stderr, flush=True)
        make_sample_dataset(os.path.dirname(DEFAULT_DATA))
    return DEFAULT_DATA


def results_root(out: str) -> str:
    """`out`, or the benchmarks' folder under the cache root ($DALI_PIPES_CACHE/bench): never a folder relative
    to wherever a benchmark runs (inside a checkout, that is beside the committed results)."""
    from dali_pipes.storage.files import cache_root
    return os.path.abspath(out or os.path.join(cache_root(), "bench"))


def configs(**cfgs) -> dict:
    """{name: asdict(config)} of the dataclasses a run used: saved with its results."""
    return {name: asdict(cfg) for name, cfg in cfgs.items()}


def command(benchmark: str, argv: Sequence[str]) -> str:
    """The command line that reproduces this run."""
    return shlex.join(["dali-pipes", "bench", benchmark, *argv])


def write_json(path: str, result: dict) -> None:
    """A benchmark's results as JSON at `path` (its folder made)."""
    import json
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def fresh_folder(root: str, name: str) -> str:
    """ROOT/NAME made for this run, or NAME-2, NAME-3... when an earlier run made it: two runs on one day never
    write into one folder (os.mkdir is atomic: two runs at once get two folders too)."""
    os.makedirs(root, exist_ok=True)
    for n in itertools.count(1):
        path = os.path.join(root, name if n == 1 else f"{name}-{n}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")  # itertools.count never ends


def results_file(out: str, benchmark: str, filename: str) -> str:
    """`out` when given; else FILENAME in this run's own folder under the cache root,
    $DALI_PIPES_CACHE/bench/<benchmark>-<date>[-N]/ (results_root, fresh_folder)."""
    if out:
        return os.path.abspath(out)
    folder = fresh_folder(results_root(""), f"{benchmark}-{datetime.date.today().isoformat()}")
    return os.path.join(folder, filename)


def out_help(filename: str) -> str:
    """The --out help of a benchmark that writes FILENAME."""
    return f"write the results here (default: {filename} in a folder of this run's own under $DALI_PIPES_CACHE/bench)"


def bar(iterable: Iterable | None = None, **kwargs) -> tqdm:
    """A progress bar on stderr, drawn on a terminal only (stdout is left to the tables): one per case or round."""
    return tqdm(iterable, file=sys.stderr, disable=None, **kwargs)


def markdown(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table of `rows` under `headers`, as the loaders bench prints its."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def median_range(figures: dict, scale: float = 1.0, digits: int = 0) -> str:
    """A table cell "1,234 [1,200, 1,260]" of {"median", "min", "max"} (a Spread's row), each times `scale`."""
    show = lambda v: f"{v * scale:,.{digits}f}"
    return f"{show(figures['median'])} [{show(figures['min'])}, {show(figures['max'])}]"


def report(result: dict, out: str, benchmark: str, tables: str = "") -> str:
    """A benchmark's end: its tables on stdout, its results as JSON at `out` or in this run's folder under the
    cache root (results_file), and where they went. Returns that path."""
    if tables:
        print(tables)
    path = results_file(out, benchmark, f"{benchmark}.json")
    write_json(path, result)
    print(f"results in {path}")
    return path


def require(module: str, why: str, alternative: str = "") -> None:
    """Raise ImportError naming the extra that installs `module` unless it is installed."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"{module} is not installed; {why}. Install it with: {BENCH_EXTRA}"
                          + (f" (or {alternative})" if alternative else ""))


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a benchmark's main; bad data, bad settings and missing extras end it with one line."""
    try:
        return main(argv) or 0
    except (ValueError, FileNotFoundError, ImportError) as e:  # DatasetError is a ValueError
        sys.exit(f"error: {e}")
