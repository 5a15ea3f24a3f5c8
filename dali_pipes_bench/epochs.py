"""Whole epochs: DaliLoader against DALI's own DALIGenericIterator driving the same graph (the pixel
guard and the sample ids included), epoch boundaries included, in alternating epochs.

Each epoch is timed from the first next() to the end of the `for` loop, so what a loader does between
epochs (its drain of DALI's epoch end, bookkeeping, trimming) counts. `--step S` makes the loop spend
S seconds per batch (a sleep: a GPU step that leaves the CPU to the loader), where a loader that
waits at a boundary shows it. Prints medians and the ratio loader / DALI; writes JSON with --out.
Run: dali-pipes bench epochs [flags] (or python -m dali_pipes_bench.epochs)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Sequence

from dali_pipes import AugmentConfig, open_source
from dali_pipes_bench.cli import command, data_or_builtin, run_main, write_json
from dali_pipes_bench.harness import LoaderOverhead


def epoch_seconds(loader, step: float) -> tuple[int, float]:
    start, images = time.perf_counter(), 0
    for batch in loader:
        images += batch[0].shape[0]
        if step:
            time.sleep(step)
    return images, time.perf_counter() - start


def run(data: str, *, batch_size: int, image_size: int, threads: int, epochs: int, step: float,
        device: str = "cpu") -> dict:
    source = open_source(data)
    pair = LoaderOverhead(source, batch_size=batch_size, train=True, device=device, num_threads=threads,
                          augment=AugmentConfig(image_size=image_size), seed=0)
    sides = {"DaliLoader": pair.loader, "DALIGenericIterator": pair.bare}
    try:
        for loader in sides.values():
            epoch_seconds(loader, 0.0)  # warm-up epoch: the first batch builds and fills the pipeline
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(epochs):
            for name, loader in sides.items():  # alternating: a machine that slows down slows both
                images, seconds = epoch_seconds(loader, step)
                rates[name].append(images / seconds)
        batches = len(pair.bare)
    finally:
        pair.close()
    medians = {name: statistics.median(r) for name, r in rates.items()}
    return {"data": data, "device": device, "batch_size": batch_size, "image_size": image_size, "threads": threads,
            "step_s": step, "batches_per_epoch": batches, "images_per_s": rates, "median_images_per_s": medians,
            "ratio": medians["DaliLoader"] / medians["DALIGenericIterator"]}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="dali-pipes bench epochs", description=__doc__)
    p.add_argument("--data", default="", help="train data (default: the built-in train split)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--threads", type=int, default=2, help="DALI threads, the same on both sides")
    p.add_argument("--epochs", type=int, default=8, help="timed epochs per side")
    p.add_argument("--step", type=float, nargs="+", default=[0.0, 0.05], help="seconds per batch the loop spends")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--out", default="", help="write the results as JSON here")
    args = p.parse_args(argv)
    data = data_or_builtin(args.data)
    rows = [run(data, batch_size=args.batch_size, image_size=args.image_size, threads=args.threads,
                epochs=args.epochs, step=step, device=args.device) for step in args.step]
    for r in rows:
        m = r["median_images_per_s"]
        print(f"step {r['step_s']:.3f} s, {r['batches_per_epoch']} batches/epoch: DaliLoader {m['DaliLoader']:.0f} "
              f"images/s, DALIGenericIterator {m['DALIGenericIterator']:.0f}: {r['ratio']:.3f}x")
    if args.out:
        write_json(args.out, {"command": command("epochs", argv), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
