"""What reading a sampler exactly costs: the same DaliLoader with a WeightedRandomSampler (its indices drawn every
epoch and fed to DALI, dali_pipes/run/sampled.py) and without one (DALI's reader shuffles), whole epochs in one
run, the cases taking turns in a rotating order (a machine that slows down slows all), several rounds. A third
case, SubsetRandomSampler over every sample, is read the sampler's way too but reads the same files as the plain
loader, each once per epoch: the mechanism's cost without the weighted draw's other mix of images (repeats).

A turn is one untimed epoch, then `--epochs` timed ones, back to back as in training: each timed epoch from its
first next() to the end of its `for` loop, so what happens at epoch boundaries counts (the sampler's draw, the
feed's start, a pipeline that cannot read ahead into an epoch not drawn yet), and neither case starts its timed
epochs with batches read ahead while the other case was timed. Between turns the loop sleeps `--settle` seconds,
so that a pipeline's read-ahead never runs into the other case's turn. `--step S` spends S seconds per batch (a
sleep: a GPU step that leaves the CPU to the loader). Per epoch: images/s, and the process's CPU seconds per
1000 images (DALI's threads included; on a shared machine less disturbed by the other processes than wall time).
Prints a table per case of the median and quartiles; the cost as 1 - sampler / plain of the medians, and the
median of each round's own ratio (the cases a few seconds apart); each round is a tick of a bar on stderr. Every
epoch's figures go to sampler.json at --out, default a folder of this run's own under $DALI_PIPES_CACHE/bench.
No timing is asserted anywhere. Run: dali-pipes bench sampler [flags] (or python -m dali_pipes_bench.sampler_cost)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Sequence

from dali_pipes_bench.cli import bar, command, data_or_builtin, markdown, report, run_main


def epoch_rate(loader, step: float) -> tuple[float, float]:
    """(images/s, CPU seconds per 1000 images) of one whole epoch of `loader`."""
    start, cpu, images = time.perf_counter(), time.process_time(), 0
    for batch in loader:
        images += batch[0].shape[0]
        if step:
            time.sleep(step)
    return images / (time.perf_counter() - start), 1000 * (time.process_time() - cpu) / images


def spread(values: list[float]) -> dict:
    """Median, quartiles and range."""
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return {"median": statistics.median(values), "q1": q1, "q3": q3, "min": min(values), "max": max(values),
            "n": len(values)}


def run(data: str, *, batch_size: int, image_size: int, threads: int, rounds: int, epochs: int, step: float,
        settle: float, device: str = "cpu") -> dict:
    import torch
    from torch.utils.data import SubsetRandomSampler, WeightedRandomSampler

    from dali_pipes import DaliLoader
    common = dict(batch_size=batch_size, train=True, device=device, num_threads=threads, image_size=image_size,
                  seed=0, drop_last=True)
    plain = DaliLoader(data, shuffle=True, **common)
    count = plain.num_samples
    weights = torch.rand(count, generator=torch.Generator().manual_seed(0)) + 0.1
    sampler = WeightedRandomSampler(weights, count, generator=torch.Generator().manual_seed(1))
    every = SubsetRandomSampler(range(count), generator=torch.Generator().manual_seed(2))
    cases = {"plain": plain, "WeightedRandomSampler": DaliLoader(data, sampler=sampler, **common),
             "SubsetRandomSampler": DaliLoader(data, sampler=every, **common)}
    rates: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    ratios: dict[str, list[float]] = {name: [] for name in list(cases)[1:]}
    try:
        for turn in bar(range(rounds), desc="rounds", unit="round"):
            medians, names = {}, list(cases)
            for name in names[turn % len(names):] + names[:turn % len(names)]:  # each case first in turn
                time.sleep(settle)
                epoch_rate(cases[name], 0.0)  # untimed: its start may hold batches read ahead before the turn
                timed = [epoch_rate(cases[name], step) for _ in range(epochs)]
                for rate, seconds in timed:
                    rates[name].append(rate)
                    cpu[name].append(seconds)
                medians[name] = statistics.median(rate for rate, _ in timed)
            for name in ratios:
                ratios[name].append(medians[name] / medians["plain"])
        batches = len(plain)
    finally:
        for loader in cases.values():
            loader.close()
    summary = {name: {"images_per_s": spread(rates[name]), "cpu_s_per_1000_images": spread(cpu[name])}
               for name in cases}
    plain_rate, plain_cpu = (summary["plain"][key]["median"] for key in ("images_per_s", "cpu_s_per_1000_images"))
    costs = {name: {"cost": 1 - summary[name]["images_per_s"]["median"] / plain_rate,
                    "cost_of_round_ratios": 1 - statistics.median(ratios[name]), "round_ratios": spread(ratios[name]),
                    "cpu_cost": summary[name]["cpu_s_per_1000_images"]["median"] / plain_cpu - 1} for name in ratios}
    return {"data": data, "samples": count, "device": device, "batch_size": batch_size, "image_size": image_size,
            "threads": threads, "step_s": step, "batches_per_epoch": batches, "images_per_s": rates,
            "cpu_s_per_1000_images": cpu, "summary": summary, "round_ratios": ratios, "costs": costs}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="dali-pipes bench sampler", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="", help="train data, image files (default: the built-in train split)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--threads", type=int, default=2, help="DALI threads, the same for both cases")
    p.add_argument("--rounds", type=int, default=8, help="turns per case, alternating which goes first")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per turn (after one untimed)")
    p.add_argument("--step", type=float, default=0.0, help="seconds per batch the loop spends")
    p.add_argument("--settle", type=float, default=1.0, help="seconds between turns")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--out", default="", help="write the results as JSON here (default: sampler.json in a folder "
                   "of this run's own under $DALI_PIPES_CACHE/bench)")
    args = p.parse_args(argv)
    result = run(data_or_builtin(args.data), batch_size=args.batch_size, image_size=args.image_size,
                 threads=args.threads, rounds=args.rounds, epochs=args.epochs, step=args.step, settle=args.settle,
                 device=args.device)
    rows = []
    for name, both in result["summary"].items():
        s, c = both["images_per_s"], both["cpu_s_per_1000_images"]
        rows.append((name, f"{s['median']:.0f} [{s['q1']:.0f}, {s['q3']:.0f}]", f"{s['min']:.0f}-{s['max']:.0f}",
                     s["n"], f"{c['median']:.2f} [{c['q1']:.2f}, {c['q3']:.2f}]"))
    lines = [markdown(["case", "images/s median [quartiles]", "range", "epochs", "CPU s per 1000 images"], rows)]
    for name, c in result["costs"].items():
        r = c["round_ratios"]
        lines.append(f"cost of {name}: {100 * c['cost']:.1f}% of the plain loader's median images/s; median of the "
                     f"rounds' own ratios {100 * c['cost_of_round_ratios']:.1f}% (ratios {r['q1']:.3f}-{r['q3']:.3f}, "
                     f"range {r['min']:.3f}-{r['max']:.3f}); CPU per image {100 * c['cpu_cost']:+.1f}%")
    report({"command": command("sampler", argv), **result}, args.out, "sampler",
           f"{result['batches_per_epoch']} batches an epoch:\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
