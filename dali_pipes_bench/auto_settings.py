"""num_threads="auto" against fixed thread counts, in one run, alternating the cases:

  * training: `python -m train` (ResNet-18 by default, the built-in data, 2 epochs, 128 px) with
    --num-threads auto and each fixed count; the second epoch's images/s (auto has chosen by then) and
    the first epoch's (what the search costs);
  * the loader alone (no model): a DaliLoader epoch after epoch, the same cases, in this process.

Every auto case starts with an empty tuning memory (its own DALI_PIPES_CACHE), so the search runs in
full each time. Prints a table of medians per part and auto / best fixed (each round a tick of a bar on stderr)
and where the
results went: auto.json at --out, default a folder of this run's own under $DALI_PIPES_CACHE/bench.
Run: dali-pipes bench auto [flags] (or python -m dali_pipes_bench.auto_settings)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from dali_pipes.run.stats import Spread
from dali_pipes_bench.cli import bar, command, data_or_builtin, markdown, median_range, out_help, report, run_main
from dali_pipes_bench.protocol import MIN_ROUNDS


def train_run(data: str, threads: str, args: argparse.Namespace) -> dict:
    """One `python -m train` run: images/s of each epoch, and the threads the loader ran with."""
    with tempfile.TemporaryDirectory(prefix="dali_pipes-auto-") as work:
        cmd = [sys.executable, "-m", "train", "--data", data, "--arch", args.arch, "--image-size", str(args.image_size),
               "--epochs", "2", "--batch-size", str(args.batch_size), "--num-threads", threads, "--device", "cpu",
               "--prefetch-queue-depth", threads if threads == "auto" else "2", "--workdir", os.path.join(work, "run")]
        env = {**os.environ, "DALI_PIPES_CACHE": os.path.join(work, "cache")}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr[-2000:]}")
        history = [json.loads(line) for line in open(os.path.join(work, "run", "metrics.jsonl"))]
    return {"images_per_s": [h["images_per_s"] for h in history],
            "epoch_seconds": [h["epoch_seconds"] for h in history],
            "num_threads": [h["ranks"][0].get("num_threads") for h in history]}


def loader_run(data: str, threads: str, args: argparse.Namespace) -> dict:
    """The loader alone, no model: two epochs, images/s of each."""
    from dali_pipes import DaliLoader
    old = os.environ.get("DALI_PIPES_CACHE")
    with tempfile.TemporaryDirectory(prefix="dali_pipes-auto-") as cache:
        os.environ["DALI_PIPES_CACHE"] = cache  # an empty memory, and the choice is remembered there, not in yours
        try:
            fixed = {} if threads == "auto" else {"num_threads": int(threads), "prefetch_queue_depth": 2}
            loader = DaliLoader(data, batch_size=args.batch_size, train=True, device="cpu", image_size=args.image_size,
                                **fixed)
            rates = []
            for _ in range(2):
                start, images = time.perf_counter(), 0
                for batch, _labels in loader:
                    images += batch.shape[0]
                rates.append(images / (time.perf_counter() - start))
            chosen = loader.stats()["num_threads"]
            loader.close()
        finally:
            os.environ.pop("DALI_PIPES_CACHE") if old is None else os.environ.update(DALI_PIPES_CACHE=old)
    return {"images_per_s": rates, "num_threads": chosen}


def summarise(runs: dict[str, list[dict]]) -> dict:
    """Medians over the rounds, and why the cases may not be ranked: fewer than 3 rounds, or a case whose
    rounds spread by more than 10% (the protocol's rule, protocol.py)."""
    spreads = {case: Spread.of(r["images_per_s"][1] for r in rs) for case, rs in runs.items()}
    second = {case: spread.median for case, spread in spreads.items()}
    first = {case: statistics.median(r["images_per_s"][0] for r in rs) for case, rs in runs.items()}
    best = max((c for c in second if c != "auto"), key=second.get)
    rounds, noisy = min(len(rs) for rs in runs.values()), max(spreads.items(), key=lambda kv: kv[1].spread)
    unranked = (f"not ranked: {rounds} rounds (at least {MIN_ROUNDS} are needed)" if rounds < MIN_ROUNDS else
                f"not ranked: spread {noisy[1].spread:.0%} between rounds ({noisy[0]})" if noisy[1].noisy else None)
    return {"second_epoch_images_per_s": second, "first_epoch_images_per_s": first, "best_fixed": best,
            "second_epoch_spread": {case: spread.spread for case, spread in spreads.items()}, "unranked": unranked,
            "auto_over_best_fixed": second["auto"] / second[best],
            "auto_first_epoch_over_best_fixed": first["auto"] / first[best]}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="dali-pipes bench auto", description=__doc__)
    p.add_argument("--data", default="", help="train data (default: the built-in train split)")
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", nargs="+", default=["1", "2", "4"], help="the fixed counts")
    p.add_argument("--rounds", type=int, default=MIN_ROUNDS, help="alternating rounds of every case (fewer than "
                   f"{MIN_ROUNDS} are not ranked)")
    p.add_argument("--skip-training", action="store_true", help="the loader alone only")
    p.add_argument("--out", default="", help=out_help("auto.json"))
    args = p.parse_args(argv)
    data = data_or_builtin(args.data)
    cases = ["auto", *args.threads]
    result = {"command": command("auto", argv)}
    for name, one_run in (("loader", loader_run), ("training", train_run)):
        if name == "training" and args.skip_training:
            continue
        runs: dict[str, list[dict]] = {c: [] for c in cases}
        for _ in bar(range(args.rounds), desc=f"{name} rounds", unit="round"):
            for case in cases:
                runs[case].append(one_run(data, case, args))
        result[name] = {"runs": runs, **summarise(runs)}
    report(result, args.out, "auto", "\n".join(table(name, result[name]) for name in ("loader", "training")
                                               if name in result))
    return 0


def table(name: str, s: dict) -> str:
    """One part's summary (summarise's dict and its runs): every case's epochs as a markdown table, then auto over
    the best fixed count and why the cases are not ranked, if they are not."""
    best = s["best_fixed"]
    rows = []
    for case, runs in s["runs"].items():
        second = Spread.of(r["images_per_s"][1] for r in runs)
        rows.append((case, median_range(second.row(), digits=1), f"{second.spread:.1%}",
                     f"{s['first_epoch_images_per_s'][case]:,.1f}",
                     f"{s['second_epoch_images_per_s'][case] / s['second_epoch_images_per_s'][best]:.3f}x"))
    headers = ["threads", "epoch 2 images/s median [min, max]", "spread", "epoch 1 images/s median",
               "epoch 2 / best fixed"]
    rounds = min(len(runs) for runs in s["runs"].values())
    return (f"{name}, {rounds} round{'s' * (rounds != 1)} (epoch 1 holds auto's search):\n\n{markdown(headers, rows)}\n"
            f"auto / best fixed ({best} threads): {s['auto_over_best_fixed']:.3f}x in epoch 2; epoch 1 (the search): "
            f"{s['auto_first_epoch_over_best_fixed']:.3f}x" + (f"; {s['unranked']}" if s["unranked"] else "") + "\n")


if __name__ == "__main__":
    sys.exit(run_main(main))
