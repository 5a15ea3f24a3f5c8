"""Whole epochs: DaliLoader against DALI's own DALIGenericIterator driving the same graph (the pixel
guard and the sample ids included), epoch boundaries included, under the measurement protocol
(protocol.py): a warm-up epoch each, then windows of whole epochs back to back, the two sides alternated
round after round; images/s median [min, max] per side, the ratio loader / DALI, and "not ranked" when
a side's rounds spread by more than 10%.

Each epoch is timed from the first next() to the end of the `for` loop, so what a loader does between
epochs (its drain of DALI's epoch end, bookkeeping, trimming) counts; windows of several epochs back to
back (the default: 20 epochs a side in 4 rounds, 5 a window) let no idle gap between epochs hide that
work. `--step S` makes the loop spend S seconds per batch (a sleep: a GPU step that leaves the CPU to
the loader), where a loader that waits at a boundary shows it. The gauge of issue 28 (CPU, 2 threads,
13 batches an epoch) is `dali-pipes bench epochs --batch-size 76 --step 0`.
Prints a table of each side's figures per --step (each --step a bar on stderr) and where the results went:
epochs.json at --out, default a folder of this run's own under $DALI_PIPES_CACHE/bench.
Run: dali-pipes bench epochs [flags] (or python -m dali_pipes_bench.epochs)."""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any, Iterable, Sequence

from dali_pipes import AugmentConfig, open_source
from dali_pipes.run.stats import Spread
from dali_pipes_bench.cli import bar, command, data_or_builtin, markdown, median_range, out_help, report, run_main
from dali_pipes_bench.harness import LoaderOverhead
from dali_pipes_bench.protocol import (
    CaseResult,
    Comparison,
    ProtocolConfig,
    add_protocol_arguments,
    compare,
    epoch_case,
    protocol_from_args,
    source_files,
)

SIDES = ("DaliLoader", "DALIGenericIterator")
DEFAULTS = ProtocolConfig(min_seconds=30.0, min_epochs=20, rounds=4)  # windows of 5 epochs back to back
# Figures a loaded machine barely moves, beside images/s: the loop thread's CPU (what a wrapper adds runs
# there) and the page faults (memory handed back to the OS and touched again) per epoch
COUNTERS = {"main_thread_cpu_s": time.thread_time,
            "minor_faults": lambda: float(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)}


def run(data: str, *, batch_size: int, image_size: int, threads: int, step: float, device: str = "cpu",
        protocol: ProtocolConfig = DEFAULTS, progress: Any = None) -> dict:
    """Both sides under `protocol`, each batch followed by `step` seconds of the loop's own."""
    source = open_source(data)
    pair = LoaderOverhead(source, batch_size=batch_size, train=True, device=device, num_threads=threads,
                          augment=AugmentConfig(image_size=image_size), seed=0)
    each = (lambda batch: time.sleep(step)) if step else None
    files = source_files(source) if protocol.cold else ()
    batches = len(pair.bare)
    cases = [epoch_case(SIDES[0], pair.loader, each=each, files=files),
             epoch_case(SIDES[1], dali_iterator(pair), each=each, files=files, close=pair.close)]
    result = compare(cases, protocol, progress=progress, counters=COUNTERS)
    return summary(result, data=data, device=device, batch_size=batch_size, image_size=image_size, threads=threads,
                   step_s=step, batches_per_epoch=batches)


def dali_iterator(pair: LoaderOverhead) -> Iterable:
    """The bare side: DALI's own DALIGenericIterator over the loader's graph, as DALI's examples drive it."""
    iterator = pair.bare.iterator
    if iterator is None:
        raise RuntimeError("the bare DALI side has no iterator (closed?)")
    return iterator


def summary(result: Comparison, **conditions: Any) -> dict:
    rows = [{**r.row(), "images_per_cpu_s": per_cpu_second(r).row(),
             **{f"{name}_per_epoch": r.per_unit(name).row() for name in COUNTERS}} for r in result.results]
    per_epoch = [f"{r.name}: {per_cpu_second(r).text()} images per CPU second; the loop's thread "
                 f"{r.per_unit('main_thread_cpu_s').text(1e3, 1)} ms CPU, {r.per_unit('minor_faults').text()} page "
                 f"faults per epoch" for r in result.results]
    loader, bare = (per_cpu_second(result[side]).median for side in SIDES)
    per_epoch.append(f"per CPU second, DaliLoader / DALIGenericIterator: {loader / max(bare, 1e-12):.3f}x (what "
                     f"the wall-clock ratio is on a machine of its own: CPU-bound, every core busy)")
    return {**conditions, "protocol": vars(result.config), "rows": rows, "per_epoch": per_epoch,
            "ratio_per_cpu_s": loader / max(bare, 1e-12),
            "median_images_per_s": {r["case"]: r["images_per_s"] for r in rows},
            "ratio": result.ratio(*SIDES), "ranking": result.ranking_text(), "lines": result.lines()}


def per_cpu_second(result: CaseResult) -> Spread:
    """Images per CPU second of the process, each window: on a shared machine, where the wall clock measures
    the neighbours too, the work a side costs (every thread: DALI's and the loop's)."""
    return Spread.of(w.images / w.cpu_seconds for w in result.windows if w.cpu_seconds > 0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="dali-pipes bench epochs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="", help="train data (default: the built-in train split)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--threads", type=int, default=2, help="DALI threads, the same on both sides")
    p.add_argument("--step", type=float, nargs="+", default=[0.0, 0.05], help="seconds per batch the loop spends")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--out", default="", help=out_help("epochs.json"))
    add_protocol_arguments(p, DEFAULTS, epochs_aliases=("--epochs",))  # --epochs: timed epochs per side, as before
    args = p.parse_args(argv)
    data, protocol = data_or_builtin(args.data), protocol_from_args(args)
    progress = lambda what: print(f"  {what}", file=sys.stderr, flush=True)
    rows = [run(data, batch_size=args.batch_size, image_size=args.image_size, threads=args.threads, step=step,
                device=args.device, protocol=protocol, progress=progress)
            for step in bar(args.step, desc="steps", unit="step")]
    report({"command": command("epochs", argv), "rows": rows}, args.out, "epochs", "\n".join(map(table, rows)))
    return 0


def table(r: dict) -> str:
    """One --step's summary (run's dict): each side's figures as a markdown table, the verdict and the ratios."""
    cells = [(row["case"], median_range({"median": row["images_per_s"], "min": row["min"], "max": row["max"]}),
              f"{row['spread']:.1%}", f"{row['cpu_cores']:.2f}", median_range(row["images_per_cpu_s"]),
              median_range(row["main_thread_cpu_s_per_epoch"], 1e3, 1), median_range(row["minor_faults_per_epoch"]))
             for row in r["rows"]]
    headers = ["side", "images/s median [min, max]", "spread", "cores busy", "images per CPU second median [min, max]",
               "loop thread CPU ms per epoch", "page faults per epoch"]
    return (f"step {r['step_s']:.3f} s, {r['batches_per_epoch']} batches/epoch, {r['protocol']['rounds']} rounds:\n\n"
            f"{markdown(headers, cells)}\n{r['ranking']}\n"
            f"per CPU second, DaliLoader / DALIGenericIterator: {r['ratio_per_cpu_s']:.3f}x (what the wall-clock ratio "
            f"is on a machine of its own: CPU-bound, every core busy)\n"
            f"DaliLoader / DALIGenericIterator: {r['ratio']:.3f}x (medians)\n")


if __name__ == "__main__":
    sys.exit(run_main(main))
