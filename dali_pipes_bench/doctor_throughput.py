"""The doctor's throughput run, a benchmark: DALI gpu at hw_decoder_load 0, 0.65 and 0.99 against
DataLoader + PIL on the built-in train split at 224 px, with the hardware JPEG decoder's use read
through NVML (extra [doctor]) and a bar chart (matplotlib, extra [bench]). Timed under the measurement
protocol (protocol.py): the cases alternate in at least 3 rounds, each case at least 30 s (or --seconds
shared by the cases) and 3 epochs in all, a loader made afresh and warmed up for each window, the GPU
synchronised at each window's end; images/s median [min, max]; no "best" when the rounds spread by
more than 10%.

    python -m dali_pipes_bench.doctor_throughput TRAIN_DIR [--seconds 120] --out DIR

The GPU session's cases (issue 33, docs/gpu.md): --loads picks the hw_decoder_load values ("auto": the tuner's),
--baseline-workers / --baseline-files the DataLoader + PIL case (16 workers on a 10,000-file subset; 0 workers:
no baseline), --decode-only times the decode-only graph (the NVJPG ceiling: load 1.0, and the best mix) instead
of the loader, --cold reads cold (the page cache dropped before each window and epoch: /proc/sys/vm/drop_caches
where this process may write it, else each file's pages through posix_fadvise; throughput.json says which, and
the data folder's file system, where tmpfs cannot be dropped at all), --device cpu the same cases on CPU (the
dry run).

`python -m dali_pipes.tools.doctor` runs it in a process of its own on a GPU machine: the library never
imports the benchmarks. Writes DIR/throughput.json ({"summary", "rows"}) and DIR/throughput.png.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from dali_pipes.run.usage import gpu_used_mb
from dali_pipes.tools.environment import Nvml
from dali_pipes_bench.protocol import (
    Case,
    ProtocolConfig,
    add_protocol_arguments,
    compare,
    drop_page_cache,
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
        if images is not None and torch_cuda():  # decode-only batches stay in DALI's buffers (None)
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


@dataclass(frozen=True)
class Cases:
    """Which cases a throughput run times (the flags of the same names)."""
    loads: tuple[float | str, ...] = HW_LOADS  # hw_decoder_load of each DALI case; "auto": the tuner's
    device: str = "gpu"
    decode_only: bool = False    # the decode-only graph (profile's decode stage) instead of the loader
    baseline_workers: int = -1   # DataLoader + PIL's workers: -1 one per usable CPU, 0 no baseline
    baseline_files: int = 0      # the baseline reads an even subset of this many files (0: all)
    batch: int = BATCH


def torch_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def dali_makers(train_dir: str, cases: Cases, source) -> dict[str, Callable]:
    """name -> a maker of each DALI case: the loader (DaliLoader, train, 224 px) or the decode-only graph."""
    from dali_pipes import DaliLoader
    if not cases.decode_only:
        return {f"DALI {cases.device} hw_decoder_load={load}": (lambda load=load: DaliLoader(
            train_dir, batch_size=cases.batch, train=True, device=cases.device, image_size=224,
            hw_decoder_load=load))
            for load in cases.loads}
    return {f"decode-only {cases.device} hw_decoder_load={load}":
            (lambda load=load: DecodeOnly(source, cases.device, load, cases.batch)) for load in cases.loads}


class DecodeOnly:
    """The decode-only graph (profile's decode stage: the whole image decoded, nothing else) as a loader of
    (images, labels): a batch is `batch` decoded images, kept on the device."""

    def __init__(self, source, device: str, load: float | str, batch: int) -> None:
        from dali_pipes.graph.augment_config import AugmentConfig
        from dali_pipes.run.contract import Contract
        from dali_pipes.run.dist import Shard
        from dali_pipes.run.machine import default_threads
        from dali_pipes.run.pipeline import PipelineSpec, TunedKnobs
        from dali_pipes_bench.profile import StageRun
        augment = AugmentConfig(image_size=224, hw_decoder_load=float(load))
        self.batch = batch
        spec = PipelineSpec(contract=Contract(True, batch, drop_last=False), device=device, shard=Shard(),
                            augment=augment, knobs=TunedKnobs(num_threads=default_threads(), prefetch_queue_depth=2,
                                                              hw_decoder_load=float(load)))
        self.run = StageRun("decode", source, spec, warmup=0, nvml=False)
        self.run.prepare()

    def __iter__(self):
        while True:
            self.run.step()
            yield BATCH_MARK, range(self.batch)

    def close(self) -> None:
        self.run.release()


BATCH_MARK = None  # a decode-only batch's images stay in DALI's buffers: only the count is read


def baseline_maker(train_dir: str, cases: Cases, source) -> tuple[str, Callable] | None:
    """DataLoader + PIL with `baseline_workers` workers on all files or an even subset of `baseline_files`."""
    from dali_pipes.baseline import TorchLoader
    from dali_pipes.data.source import samples_source
    from dali_pipes.run.machine import usable_cpus
    workers = usable_cpus() if cases.baseline_workers < 0 else cases.baseline_workers
    if workers == 0:
        return None
    read, name = train_dir, f"DataLoader + PIL, {workers} workers"
    if 0 < cases.baseline_files < source.num_samples:  # every k-th file: every class keeps its share
        step = source.num_samples / cases.baseline_files
        picked = [int(i * step) for i in range(cases.baseline_files)]
        read = samples_source(source.location, [(source.files[i], source.labels[i]) for i in picked],
                              source.classes)
        name += f", {len(picked)} of {source.num_samples} files"
    return (name, lambda: TorchLoader(read, batch_size=cases.batch, train=True, image_size=224, num_workers=workers))


def throughput(train_dir: str, protocol: ProtocolConfig, cases: Cases = Cases()) -> tuple[str, list[dict], dict]:
    """Train-mode images/s at 224 px under the measurement protocol (alternating rounds, median [min, max]):
    DALI at each hw_decoder_load (the loader, or the decode-only graph), and DataLoader + PIL. Also returns how
    the page cache was dropped (cold runs)."""
    from dali_pipes import open_source
    source = open_source(train_dir)
    makers = dali_makers(train_dir, cases, source)
    baseline = baseline_maker(train_dir, cases, source)
    if baseline is not None:
        makers[baseline[0]] = baseline[1]
    files = source_files(source) if protocol.cold else []
    cache = PageCache(train_dir) if protocol.cold else None
    runs = {name: LoaderRun(make) for name, make in makers.items()}
    per_epoch = {name: max(1, source.num_samples // cases.batch) for name in runs}
    if baseline is not None and 0 < cases.baseline_files < source.num_samples:  # its epoch is the subset's
        per_epoch[baseline[0]] = max(1, cases.baseline_files // cases.batch)
    todo = [Case(name, run.step, per_epoch[name], files, prepare=run.prepare, release=run.release)
            for name, run in runs.items()]
    result = compare(todo, protocol, progress=lambda what: print(f"             {what}", flush=True),
                     **({"drop": cache.drop} if cache is not None else {}))
    rows = [{**result[name].row(), **run.summary()} for name, run in runs.items()]
    for row in rows:
        print(f"             {row['case']}: {result[row['case']].text()}", flush=True)
    page_cache = cache.describe() if cache is not None else {"cold": False}
    unranked = result.unranked_because()
    if unranked:
        return unranked, rows, page_cache
    dali = rows[:-1] if baseline is not None else rows
    best = max(dali, key=lambda r: r["images_per_s"])
    text = f"best {best['case']}: {result[best['case']].rate.text()} images/s"
    if baseline is not None:
        text += f", {best['images_per_s'] / max(rows[-1]['images_per_s'], 1e-9):.1f}x {rows[-1]['case']}"
    return text, rows, page_cache


class PageCache:
    """Cold reads: the whole page cache dropped (sync; echo 3 > /proc/sys/vm/drop_caches) where this process
    may (root outside a container), else each file's pages (posix_fadvise DONTNEED, protocol.drop_page_cache).
    Neither empties tmpfs, whose pages are the files: describe() names the data folder's file system."""
    PROC = "/proc/sys/vm/drop_caches"

    def __init__(self, folder: str) -> None:
        self.folder, self.how, self.refused, self.drops = folder, "", "", 0

    def drop(self, files) -> int:
        if self.how != "posix_fadvise":
            try:
                os.sync()
                with open(self.PROC, "w") as f:
                    f.write("3\n")
                self.how, self.drops = "drop_caches", self.drops + 1
                return len(files)
            except OSError as e:  # read-only /proc in a container, or not root
                self.how, self.refused = "posix_fadvise", f"{self.PROC}: {type(e).__name__}: {e}"
        self.drops += 1
        return drop_page_cache(files)

    def describe(self) -> dict:
        return {"cold": True, "how": self.how, "drop_caches_refused": self.refused or None, "drops": self.drops,
                "file_system": file_system(self.folder)}


def file_system(folder: str) -> str | None:
    """The type of the file system holding `folder` (/proc/mounts' longest matching mount point)."""
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) > 2]
    except OSError:
        return None
    path = os.path.realpath(folder)
    inside = [(point, kind) for point, kind in mounts if path == point or path.startswith(point.rstrip("/") + "/")]
    return max(inside, key=lambda m: len(m[0]))[1] if inside else None


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
    parser.add_argument("--loads", type=parse_loads, default=HW_LOADS, metavar="L,L,...",
                        help="hw_decoder_load of each DALI case, numbers in [0, 1] or auto (default: 0,0.65,0.99)")
    parser.add_argument("--decode-only", action="store_true", help="time the decode-only graph (the decoders' "
                        "ceiling) instead of the loader")
    parser.add_argument("--baseline-workers", type=int, default=-1, help="DataLoader + PIL's workers (default: one "
                        "per usable CPU; 0: no baseline)")
    parser.add_argument("--baseline-files", type=int, default=0, help="DataLoader + PIL reads an even subset of "
                        "this many files (default 0: all)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="the DALI cases' device (cpu: the "
                        "GPU session's dry run)")
    parser.add_argument("--batch-size", type=int, default=BATCH, help="per batch (default: %(default)s)")
    add_protocol_arguments(parser)
    args = parser.parse_args(argv)
    if args.decode_only and "auto" in args.loads:
        parser.error("--loads auto: the decode-only graph has no tuner; name the loads to time")
    cases = Cases(args.loads, args.device, args.decode_only, args.baseline_workers, args.baseline_files,
                  args.batch_size)
    count = len(cases.loads) + (cases.baseline_workers != 0)
    protocol = protocol_from_args(args, warmup=0, **({"min_seconds": args.seconds / count} if args.seconds else {}))
    summary, rows, page_cache = throughput(args.train_dir, protocol, cases)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "throughput.json"), "w") as f:
        json.dump({"summary": summary, "rows": rows, "page_cache": page_cache, "cases": vars(args)}, f, indent=1)
    plot(args.out, rows)


def parse_loads(text: str) -> tuple[float | str, ...]:
    """'0.65,0.99,auto' -> (0.65, 0.99, 'auto'); a value outside [0, 1] is refused."""
    loads: list[float | str] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value: float | str = part if part == "auto" else float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--loads: {part!r} is neither a number in [0, 1] nor auto") from None
        if value != "auto" and not 0 <= float(value) <= 1:
            raise argparse.ArgumentTypeError(f"--loads: {part} is outside [0, 1]")
        loads.append(value)
    return tuple(loads)


if __name__ == "__main__":
    main()
