"""The doctor's throughput run, a benchmark: DALI gpu at hw_decoder_load 0, 0.65 and 0.99 against
DataLoader + PIL on the built-in train split at 224 px, with the hardware JPEG decoder's use read
through NVML (extra [doctor]) and a bar chart (matplotlib, extra [bench]).

    python -m dali_pipes_bench.doctor_throughput TRAIN_DIR [--seconds 60] --out DIR

`python -m dali_pipes.tools.doctor` runs it in a process of its own on a GPU machine: the library never
imports the benchmarks. Writes DIR/throughput.json ({"summary", "rows"}) and DIR/throughput.png.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Callable, Sequence

import numpy as np

from dali_pipes.run.procfs import gpu_used_mb
from dali_pipes.tools.doctor import Nvml

HW_LOADS = (0.0, 0.65, 0.99)


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


def throughput(train_dir: str, seconds: float) -> tuple[str, list[dict]]:
    """Train-mode images/s at 224 px, each case for seconds / 4: DALI gpu at each hw_decoder_load,
    and DataLoader + PIL with a worker per CPU, batches moved to the GPU as a training step would."""
    from dali_pipes import DaliLoader
    from dali_pipes.baseline import TorchLoader
    from dali_pipes.run.machine import usable_cpus
    per_case = seconds / (len(HW_LOADS) + 1)
    cases = {f"DALI gpu hw_decoder_load={load}": (lambda load=load: DaliLoader(
        train_dir, batch_size=100, train=True, device="gpu", image_size=224, hw_decoder_load=load))
        for load in HW_LOADS}
    cases[f"DataLoader + PIL, {usable_cpus()} workers"] = lambda: TorchLoader(
        train_dir, batch_size=100, train=True, image_size=224, num_workers=usable_cpus())
    rows = []
    for name, make in cases.items():
        with NvmlSampler() as nvml:
            rate, used_mb = _images_per_s(make, per_case)
        rows.append({"case": name, "images_per_s": round(rate, 1), "gpu_used_mb": used_mb, **nvml.summary()})
        print(f"             {json.dumps(rows[-1])}", flush=True)
    best = max(rows[:-1], key=lambda r: r["images_per_s"])
    ratio = best["images_per_s"] / max(rows[-1]["images_per_s"], 1e-9)
    return f"best {best['case']}: {best['images_per_s']:.0f} images/s, {ratio:.1f}x DataLoader + PIL", rows


def _forever(loader):
    """Batches epoch after epoch."""
    while True:
        yield from loader


def _images_per_s(make: Callable, seconds: float) -> tuple[float, float]:
    """Delivered images/s of a loader over `seconds` after a warm-up, and the GPU memory in use at
    the end, in MB (all processes: DALI's buffers and pools included)."""
    import torch
    loader = make()
    try:
        batches = _forever(loader)
        for _ in range(3):
            next(batches)
        torch.cuda.synchronize()
        start, samples = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            images, labels = next(batches)
            images = images.to("cuda", non_blocking=True)
            samples += len(labels)
        torch.cuda.synchronize()
        return samples / (time.perf_counter() - start), round(gpu_used_mb())
    finally:
        loader.close()


def plot(out: str, rows: list[dict], name: str = "throughput.png",
         xlabel: str = "images/s (train, 224 px)") -> str | None:
    """`name` (a PNG) in `out`: a bar per case; None without matplotlib or rows."""
    try:
        import matplotlib
    except ImportError:
        return None
    if not rows:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    ax.barh([r["case"] for r in rows], [r["images_per_s"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    path = os.path.join(out, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dali_pipes_bench.doctor_throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("train_dir")
    parser.add_argument("--seconds", type=float, default=60.0, help="the whole run (default: %(default)s)")
    parser.add_argument("--out", required=True, help="folder for throughput.json and throughput.png")
    args = parser.parse_args(argv)
    summary, rows = throughput(args.train_dir, args.seconds)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "throughput.json"), "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1)
    plot(args.out, rows)


if __name__ == "__main__":
    main()
