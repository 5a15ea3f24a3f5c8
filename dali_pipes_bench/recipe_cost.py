"""What a modern recipe's extras cost the loader: the plain DaliLoader against the same loader with each extra
(mixup + cutmix on every batch: torchvision's references' RandomChoice([MixUp(0.2), CutMix(1.0)]), read as
run/batch_mix.MixSettings), in one run: each round times every case once, in alternating order, over the same
number of batches (each made ready: a GPU batch is synchronised; each round a tick of a bar on stderr). Prints a
table per case: median images/s, min, max, the spread (max - min) / median, and the cost against the plain loader
from the rounds' paired ratios (median of case / plain in the same round). Beside the wall clock, each pass
records the process's CPU time per image (DALI's threads and the loop's): on a machine shared with other work
the wall clock swings with the neighbours, the CPU a case needs per image much less, and on a CPU-bound loader
it is what images/s follows (cpu_cost_percent). A further case is one entry in CASES. The time of the mix alone
on one batch is reported too (mix_ms: wall, mix_cpu_ms: CPU). The results (every pass) go to recipes.json at
--out, default a folder of this run's own under $DALI_PIPES_CACHE/bench. No timing is asserted anywhere.

    python -m dali_pipes_bench.recipe_cost [--data PATH] [--rounds 7] [--batches 12] [--batch-size 64]
                                           [--threads 2] [--device auto] [--out results.json]
(or dali-pipes bench recipes ...)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Iterator, Sequence

import torch

from dali_pipes import DaliLoader
from dali_pipes.run.batch_mix import BatchMix, MixSettings
from dali_pipes_bench.cli import bar, command, data_or_builtin, markdown, report, run_main

# name -> the DaliLoader keywords of the case, given the dataset's number of classes
CASES: dict[str, Callable[[int], dict[str, Any]]] = {
    "plain": lambda classes: {},
    "mixup+cutmix": lambda classes: {"batch_transform": MixSettings(num_classes=classes, mixup_alpha=0.2,
                                                                    cutmix_alpha=1.0)},
}


def endless(loader: DaliLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The loader's batches across epochs, each made ready (a GPU batch synchronised)."""
    while True:
        for images, targets in loader:
            if images.is_cuda:
                torch.cuda.synchronize(images.device)
            yield images, targets


def one_pass(stream: Iterator, batches: int, batch_size: int) -> tuple[float, float]:
    """(images/s, CPU milliseconds of the process per image) over `batches` batches."""
    next(stream)  # the step between passes is not timed
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(stream)
    images = batches * batch_size
    return images / (time.perf_counter() - start), (time.process_time() - cpu) * 1000 / images


def mix_ms(settings: MixSettings, images: torch.Tensor, labels: torch.Tensor, calls: int = 20) -> tuple[float, float]:
    """Median (wall, CPU) milliseconds of the batch mix alone on one batch (mixup and cutmix draws alike), each
    call on a fresh copy (the mix works in place)."""
    mix = BatchMix(settings, seed=0)
    wall, cpu = [], []
    for i in range(calls):
        batch = images.clone()
        start, start_cpu = time.perf_counter(), time.process_time()
        out = mix(batch, labels, (0, 0, i))
        if out[0].is_cuda:
            torch.cuda.synchronize(out[0].device)
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def summary(rates: dict[str, list[float]], cpu: dict[str, list[float]]) -> dict[str, dict]:
    """Per case: images/s median, min, max, spread; CPU ms per image (median); against "plain": the median of the
    rounds' paired ratios of images/s (cost_percent) and of CPU per image (cpu_cost_percent)."""
    out = {}
    for name, values in rates.items():
        median = statistics.median(values)
        row = {"median": round(median, 1), "min": round(min(values), 1), "max": round(max(values), 1),
               "spread": round((max(values) - min(values)) / median, 3),
               "cpu_ms_per_image": round(statistics.median(cpu[name]), 2)}
        if name != "plain":
            ratio = statistics.median(case / plain for case, plain in zip(values, rates["plain"]))
            cpu_ratio = statistics.median(case / plain for case, plain in zip(cpu[name], cpu["plain"]))
            row.update(ratio_to_plain=round(ratio, 3), cost_percent=round(100 * (1 - ratio), 1),
                       cpu_cost_percent=round(100 * (cpu_ratio - 1), 1))
        out[name] = row
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dali-pipes bench recipes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="", help="a train dataset location (default: the built-in set)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batches", type=int, default=12, help="timed batches per case and round")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--threads", type=int, default=2, help="DALI threads (fixed: tuning would differ by case)")
    p.add_argument("--warmup", type=int, default=4, help="untimed batches per case before the rounds")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default="", help="write the results here as JSON (default: recipes.json in a folder "
                   "of this run's own under $DALI_PIPES_CACHE/bench)")
    args = p.parse_args(argv)
    data = data_or_builtin(args.data)
    make = lambda **extra: DaliLoader(data, batch_size=args.batch_size, train=True, device=args.device, seed=0,
                                      image_size=args.image_size, num_threads=args.threads,
                                      prefetch_queue_depth=2, **extra)
    plain = make()
    classes = len(plain.dataset.classes)
    loaders = {name: plain if name == "plain" else make(**case(classes)) for name, case in CASES.items()}
    streams = {name: endless(loader) for name, loader in loaders.items()}
    for stream in streams.values():  # pipelines built, prefetch queues past their first fill
        for _ in range(args.warmup):
            next(stream)
    rates: dict[str, list[float]] = {name: [] for name in CASES}
    cpu: dict[str, list[float]] = {name: [] for name in CASES}
    for round_ in bar(range(args.rounds), desc="rounds", unit="round"):
        order = list(CASES) if round_ % 2 == 0 else list(reversed(CASES))  # alternate who goes first
        for name in order:
            rate, cpu_ms = one_pass(streams[name], args.batches, args.batch_size)
            rates[name].append(rate)
            cpu[name].append(cpu_ms)
    images, labels = next(streams["plain"])
    settings = CASES["mixup+cutmix"](classes)["batch_transform"]
    result = {"command": command("recipes", list(argv or [])), "device": plain.device,
              "batch_size": args.batch_size, "image_size": args.image_size, "rounds": args.rounds,
              "batches": args.batches, "rates": rates, "cpu_ms_per_image": cpu, "summary": summary(rates, cpu)}
    result["mix_ms"], result["mix_cpu_ms"] = (round(v, 2) for v in mix_ms(settings, images, labels))
    for loader in loaders.values():
        loader.close()
    report(result, args.out, "recipes", tables(result))
    return 0


def tables(result: dict) -> str:
    """The summary per case as a markdown table, and the mix's own time."""
    rows = [(name, f"{s['median']:.0f} [{s['min']:.0f}, {s['max']:.0f}]", f"{100 * s['spread']:.0f}%",
             f"{s['cpu_ms_per_image']:.2f}", f"{s['cost_percent']:.1f}%" if "cost_percent" in s else "-",
             f"{s['cpu_cost_percent']:+.1f}%" if "cpu_cost_percent" in s else "-")
            for name, s in result["summary"].items()]
    table = markdown(["case", "images/s median [min, max]", "spread", "CPU ms per image", "cost (round ratios)",
                      "CPU cost"], rows)
    return (f"{result['rounds']} rounds of {result['batches']} batches of {result['batch_size']} on "
            f"{result['device']}:\n\n{table}\nthe mix alone: {result['mix_ms']} ms a batch "
            f"({result['mix_cpu_ms']} ms CPU)\n")


if __name__ == "__main__":
    raise SystemExit(run_main(main))
