"""Val epochs with and without the val cache (run/val_cache.py): the same val loader twice, one with
--val-cache-bytes, in alternating rounds after each has run one epoch (the cached one fills its cache then, so
what is timed is what every later val epoch costs). Each epoch is timed from the first next() to the end of the
`for` loop, the loop's own work aside (`--step S`: S seconds per batch, a sleep). Prints median [min, max] of
each side and their ratio as a table (the filling epoch timed too; each round a tick of a bar on stderr) and
where the results went: val-cache.json at --out, default a folder of this run's own under $DALI_PIPES_CACHE/bench.
Run: dali-pipes bench val-cache [flags] (or python -m dali_pipes_bench.val_cache)."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Sequence

from dali_pipes import AugmentConfig, DaliLoader, LoaderConfig
from dali_pipes.options import add_arguments, from_args
from dali_pipes_bench.cli import bar, command, configs, data_or_builtin, markdown, report, run_main

SIDES = ("decoded every epoch", "from the val cache")


def epoch_seconds(loader: DaliLoader, step: float) -> tuple[int, float]:
    start, images = time.perf_counter(), 0
    for batch, _ in loader:
        images += batch.shape[0]
        if step:
            time.sleep(step)
    return images, time.perf_counter() - start


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(data: str, *, batch_size: int, rounds: int, step: float, loader: LoaderConfig,
        augment: AugmentConfig, budget: int) -> dict:
    """Seconds per val epoch of each side over `rounds` alternating rounds, and of each side's first epoch."""
    common = {**dataclasses.asdict(loader), "val_cache_bytes": 0}
    sides = {SIDES[0]: DaliLoader(data, batch_size=batch_size, train=False, augment=augment, **common),
             SIDES[1]: DaliLoader(data, batch_size=batch_size, train=False, augment=augment,
                                  **{**common, "val_cache_bytes": budget})}
    try:
        first = {name: epoch_seconds(each, step)[1] for name, each in sides.items()}  # the cached side fills
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        for _ in bar(range(rounds), desc="rounds", unit="round"):
            for name, each in sides.items():  # alternating: a machine that slows down slows both
                images, took = epoch_seconds(each, step)
                seconds[name].append(took)
        cache = sides[SIDES[1]].stats()["val_cache"]
    finally:
        for each in sides.values():
            each.close()
    summary = {name: spread(values) for name, values in seconds.items()}
    return {"data": data, "batch_size": batch_size, "step_s": step, "images_per_epoch": images,
            "first_epoch_s": first, "epoch_s": seconds, "summary": summary, "val_cache": cache,
            "ratio": summary[SIDES[1]]["median"] / summary[SIDES[0]]["median"]}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="dali-pipes bench val-cache", description=__doc__)
    p.add_argument("--data", default="", help="val data (default: the built-in dataset's train split, read as val)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds: one epoch of each side per round")
    p.add_argument("--step", type=float, default=0.0, help="seconds per batch the loop spends (a sleep)")
    p.add_argument("--budget", type=int, default=8 << 30, help="the cached side's --val-cache-bytes")
    p.add_argument("--quick", action="store_true", help="3 rounds")
    p.add_argument("--out", default="", help="write the results as JSON here (default: val-cache.json in a "
                   "folder of this run's own under $DALI_PIPES_CACHE/bench)")
    add_arguments(p, LoaderConfig, "DALI loader", skip=("val_cache_bytes",), defaults={"device": "cpu"})
    add_arguments(p, AugmentConfig, "val graph")
    args = p.parse_args(argv)
    loader, augment = from_args(LoaderConfig, args, val_cache_bytes=0), from_args(AugmentConfig, args)
    row = run(data_or_builtin(args.data), batch_size=args.batch_size, rounds=3 if args.quick else args.rounds,
              step=args.step, loader=loader, augment=augment, budget=args.budget)
    table = markdown(["val epochs", "s per val epoch median [min, max]", "rounds", "first epoch s"],
                     [(name, f"{s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]", len(row["epoch_s"][name]),
                       f"{row['first_epoch_s'][name]:.3f}") for name, s in row["summary"].items()])
    report({"command": command("val-cache", argv), "configs": configs(loader=loader, augment=augment), "row": row},
           args.out, "val-cache", f"{table}\n{row['images_per_epoch']} images per epoch; cached / decoded: "
           f"{row['ratio']:.3f}x; cache: {row['val_cache']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
