"""The doctor's throughput run, a benchmark: DALI gpu at hw_decoder_load 0, 0.65 and 0.99 against
DataLoader + PIL on the built-in train split at 224 px, with the hardware JPEG decoder's use read
through NVML (extra [doctor]) and a bar chart (matplotlib, extra [bench]). Timed under the measurement
protocol (protocol.py): the cases alternate in at least 3 rounds, each case at least 30 s (or --seconds
shared by the cases) and 3 epochs in all, a loader made afresh and warmed up for each window, the GPU
synchronised at each window's end; images/s median [min, max]; no "best" when the rounds spread by
more than 10%.

    python -m dali_pipes_bench.doctor_throughput TRAIN_DIR [--seconds 120] --out DIR

`python -m dali_pipes.tools.doctor` runs it in a process of its own on a GPU machine: the library never
imports the benchmarks. Writes DIR/throughput.json ({"summary", "rows"}) and DIR/throughput.png.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from typing import Callable, Iterator, Sequence

import numpy as np

from dali_pipes.run.procfs import gpu_used_mb
from dali_pipes.tools.doctor import Nvml
from dali_pipes_bench.protocol import (
    Case,
    ProtocolConfig,
    add_protocol_arguments,
    compare,
    protocol_from_args,
    source_files,
)

HW_LOADS = (0.0, 0.65, 0.99)
BATCH = 100


class NvmlSampler:
    """Samples NVML utilisation every 0.2 s in a thread, for one throughput run."""

    def __init__(self) -> None:
        self.nvml, self.samples, self._stop = Nvml.open(), [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.samples.append(self.nvml.readings())

    def __enter__(self) -> "NvmlSampler":
        if self.nvml is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def summary(self) -> dict:
        if self.nvml is None:
            return {"nvml": "not available (pip install nvidia-ml-py)"}
        out = {}
        for key in ("jpeg", "video_decoder", "gpu"):
            values = [s[key] for s in self.samples if s.get(key) is not None]
            out[f"{key}_util_mean"] = round(float(np.mean(values)), 1) if values else None
            out[f"{key}_util_max"] = max(values) if values else None
        return out


class LoaderRun:
    """One case of the throughput run: its loader made before each window (then `warmup` batches untimed)
    and closed after, so one is alive at a time; batches moved to the GPU as a training step would."""

    def __init__(self, make: Callable, warmup: int = 3) -> None:
        self.make, self.warmup, self.loader = make, warmup, None
        self.batches: Iterator | None = None
        self.nvml: NvmlSampler | None = None
        self.used_mb: list[float] = []
        self.nvml_summaries: list[dict] = []

    def prepare(self) -> None:
        self.loader = self.make()
        self.batches = _forever(self.loader)
        for _ in range(self.warmup):
            next(self.batches)
        self.nvml = NvmlSampler().__enter__()

    def step(self) -> int:
        assert self.batches is not None, "prepare() runs before each window"  # the protocol's order
        images, labels = next(self.batches)
        images.to("cuda", non_blocking=True)
        return len(labels)

    def release(self) -> None:
        if self.nvml is not None:
            self.nvml.__exit__(None, None, None)
            self.nvml_summaries.append(self.nvml.summary())
        self.used_mb.append(round(gpu_used_mb() or 0.0))
        if self.loader is not None:
            self.loader.close()
        self.loader = self.batches = self.nvml = None

    def summary(self) -> dict:
        """GPU memory in use at the end of a window (all processes: DALI's buffers and pools included), the
        most of any window; NVML's figures of the last window."""
        return {"gpu_used_mb": max(self.used_mb, default=None), **(self.nvml_summaries[-1] if self.nvml_summaries
                                                                    else {})}


def throughput(train_dir: str, protocol: ProtocolConfig) -> tuple[str, list[dict]]:
    """Train-mode images/s at 224 px under the measurement protocol (alternating rounds, median [min, max]):
    DALI gpu at each hw_decoder_load, and DataLoader + PIL with a worker per CPU."""
    from dali_pipes import DaliLoader, open_source
    from dali_pipes.baseline import TorchLoader
    from dali_pipes.run.machine import usable_cpus
    makers: dict[str, Callable] = {f"DALI gpu hw_decoder_load={load}": (lambda load=load: DaliLoader(
        train_dir, batch_size=BATCH, train=True, device="gpu", image_size=224, hw_decoder_load=load))
        for load in HW_LOADS}
    makers[f"DataLoader + PIL, {usable_cpus()} workers"] = lambda: TorchLoader(
        train_dir, batch_size=BATCH, train=True, image_size=224, num_workers=usable_cpus())
    source = open_source(train_dir)
    files = source_files(source) if protocol.cold else []
    runs = {name: LoaderRun(make) for name, make in makers.items()}
    cases = [Case(name, run.step, max(1, source.num_samples // BATCH), files, prepare=run.prepare, release=run.release)
             for name, run in runs.items()]
    result = compare(cases, protocol, progress=lambda what: print(f"             {what}", flush=True))
    rows = [{**result[name].row(), **run.summary()} for name, run in runs.items()]
    for row in rows:
        print(f"             {row['case']}: {result[row['case']].text()}", flush=True)
    unranked = result.unranked_because()
    if unranked:
        return unranked, rows
    best = max(rows[:-1], key=lambda r: r["images_per_s"])
    ratio = best["images_per_s"] / max(rows[-1]["images_per_s"], 1e-9)
    return (f"best {best['case']}: {result[best['case']].rate.text()} images/s, {ratio:.1f}x DataLoader + PIL",
            rows)


def _forever(loader):
    """Batches epoch after epoch."""
    while True:
        yield from loader


def plot(out: str, rows: list[dict], name: str = "throughput.png",
         xlabel: str = "images/s (train, 224 px)", log: bool = False) -> str | None:
    """`name` (a PNG) in `out`: a bar per case (bar_chart); None without matplotlib or rows."""
    try:
        import matplotlib  # noqa: F401  (extra [bench])
    except ImportError:
        return None
    if not rows:
        return None
    import matplotlib.pyplot as plt
    fig = bar_chart(rows, xlabel, log)
    path = os.path.join(out, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bar_chart(rows: list[dict], xlabel: str, log: bool = False):
    """A matplotlib Figure: a bar per case, labelled with its images/s; on a log axis with `log`, where rates
    orders of magnitude apart (the reader alone vs decode) would leave the slower bars as slivers."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = [r["images_per_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    bars = ax.barh([r["case"] for r in rows], rates)
    ax.bar_label(bars, labels=[f" {rate:,.0f}" for rate in rates], fontsize=8)
    positive = [rate for rate in rates if rate > 0]
    if log and positive:
        ax.set_xscale("log")
        ax.set_xlim(min(positive) / 2, max(positive) * 3)  # room for the labels beside the longest bar
    ax.invert_yaxis()
    ax.set_xlabel(xlabel + (" (log scale)" if log else ""))
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dali_pipes_bench.doctor_throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("train_dir")
    parser.add_argument("--seconds", type=float, default=None, help="the whole run's timed seconds, shared by the "
                        "cases (sets --min-seconds to SECONDS / cases)")
    parser.add_argument("--out", required=True, help="folder for throughput.json and throughput.png")
    add_protocol_arguments(parser)
    args = parser.parse_args(argv)
    cases = len(HW_LOADS) + 1
    protocol = protocol_from_args(args, warmup=0, **({"min_seconds": args.seconds / cases} if args.seconds else {}))
    summary, rows = throughput(args.train_dir, protocol)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "throughput.json"), "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1)
    plot(args.out, rows)


if __name__ == "__main__":
    main()
