"""What reading a sampler exactly costs: the same DaliLoader with a WeightedRandomSampler (its indices drawn every
epoch and fed to DALI, dali_pipes/run/sampled.py) and without one (DALI's reader shuffles), whole epochs in one
run, the two cases alternating turn by turn (a machine that slows down slows both), several rounds.

Each epoch is timed from its first next() to the end of its `for` loop, so what happens at epoch boundaries
counts: the sampler's draw, the feed's start, a pipeline that cannot read ahead into an epoch not drawn yet.
Between turns the loop sleeps `--settle` seconds, so that a pipeline's read-ahead does not run into the other
case's timing (in training it runs during the last steps). `--step S` spends S seconds per batch (a sleep: a GPU
step that leaves the CPU to the loader). Prints each epoch, then per case the median images/s and its spread,
and the cost (1 - sampler / plain, of the medians); writes JSON with --out. No timing is asserted anywhere.
Run: dali-pipes bench sampler [flags] (or python -m dali_pipes_bench.sampler_cost)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Sequence

from dali_pipes_bench.cli import command, data_or_builtin, run_main, write_json


def epoch_rate(loader, step: float) -> float:
    """Images/s of one whole epoch of `loader`."""
    start, images = time.perf_counter(), 0
    for batch in loader:
        images += batch[0].shape[0]
        if step:
            time.sleep(step)
    return images / (time.perf_counter() - start)


def spread(rates: list[float]) -> dict:
    """Median, quartiles and range of a case's epoch rates."""
    q1, _, q3 = statistics.quantiles(rates, n=4) if len(rates) > 1 else (rates[0],) * 3
    return {"median": statistics.median(rates), "q1": q1, "q3": q3, "min": min(rates), "max": max(rates),
            "epochs": len(rates)}


def run(data: str, *, batch_size: int, image_size: int, threads: int, rounds: int, epochs: int, step: float,
        settle: float, device: str = "cpu") -> dict:
    import torch
    from torch.utils.data import WeightedRandomSampler

    from dali_pipes import DaliLoader
    common = dict(batch_size=batch_size, train=True, device=device, num_threads=threads, image_size=image_size,
                  seed=0, drop_last=True)
    plain = DaliLoader(data, shuffle=True, **common)
    count = plain.num_samples
    weights = torch.rand(count, generator=torch.Generator().manual_seed(0)) + 0.1
    sampler = WeightedRandomSampler(weights, count, generator=torch.Generator().manual_seed(1))
    cases = {"plain": plain, "WeightedRandomSampler": DaliLoader(data, sampler=sampler, **common)}
    rates: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for loader in cases.values():
            epoch_rate(loader, 0.0)  # warm-up: the first epoch builds and fills the pipeline
        for turn in range(rounds):
            for name in (list(cases) if turn % 2 == 0 else list(cases)[::-1]):
                time.sleep(settle)
                for _ in range(epochs):
                    rate = epoch_rate(cases[name], step)
                    rates[name].append(rate)
                    print(json.dumps({"round": turn, "case": name, "images_per_s": round(rate, 1)}), flush=True)
        batches = len(plain)
    finally:
        for loader in cases.values():
            loader.close()
    summary = {name: spread(r) for name, r in rates.items()}
    cost = 1 - summary["WeightedRandomSampler"]["median"] / summary["plain"]["median"]
    return {"data": data, "samples": count, "device": device, "batch_size": batch_size, "image_size": image_size,
            "threads": threads, "step_s": step, "batches_per_epoch": batches, "images_per_s": rates,
            "summary": summary, "cost": cost}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="dali-pipes bench sampler", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="", help="train data, image files (default: the built-in train split)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--threads", type=int, default=2, help="DALI threads, the same for both cases")
    p.add_argument("--rounds", type=int, default=6, help="turns per case, alternating which goes first")
    p.add_argument("--epochs", type=int, default=2, help="epochs per turn")
    p.add_argument("--step", type=float, default=0.0, help="seconds per batch the loop spends")
    p.add_argument("--settle", type=float, default=1.0, help="seconds between turns")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--out", default="", help="write the results as JSON here")
    args = p.parse_args(argv)
    result = run(data_or_builtin(args.data), batch_size=args.batch_size, image_size=args.image_size,
                 threads=args.threads, rounds=args.rounds, epochs=args.epochs, step=args.step, settle=args.settle,
                 device=args.device)
    for name, s in result["summary"].items():
        print(f"{name}: median {s['median']:.0f} images/s (quartiles {s['q1']:.0f}-{s['q3']:.0f}, range "
              f"{s['min']:.0f}-{s['max']:.0f}, {s['epochs']} epochs of {result['batches_per_epoch']} batches)")
    print(f"cost of the sampler: {100 * result['cost']:.1f}% of the plain loader's median images/s")
    if args.out:
        write_json(args.out, {"command": command("sampler", argv), **result})
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
