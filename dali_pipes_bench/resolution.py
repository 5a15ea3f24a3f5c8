"""Progressive resizing, measured.

  1. The loader at each size: one DaliLoader whose schedule changes the size every epoch, cycling
     through --sizes (128, 160, 192, 224 px), so the sizes alternate in one run on one warm machine;
     images/s per epoch (the pipeline rebuild at each change included), the median per size.
  2. `python -m train` at one size (--fixed) and with an FFCV-style ramp up to it (--ramp), the same
     epochs, data and seed: epoch times, total time, final val top-1.
  3. The ramp again with --compile: dynamo's compile seconds at each size (metrics.jsonl's compile_s).

Writes OUT/<machine>-<date>/resolution.json (with the resolved configs) and resolution.md (OUT: --out, default
$DALI_PIPES_CACHE/bench) and prints the tables.
Run from a checkout's root (python -m train is the checkout's): dali-pipes bench resolution [flags].
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from tqdm import tqdm

from dali_pipes import DaliLoader, LoaderConfig, SourceConfig, open_source, progressive
from dali_pipes.graph.resolution import parse_image_size, schedule_text
from dali_pipes.options import add_arguments, from_args
from dali_pipes_bench import harness as bench
from dali_pipes_bench.cli import DEFAULT_DATA, command, configs, data_or_builtin, results_root, run_main

# --quick: a smoke test
QUICK = dict(sizes=[32, 48], rounds=1, epochs=2, width=8, arch="resnet10", batch_size=8, repeats=1)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = QUICK if "--quick" in argv else {}
    p = argparse.ArgumentParser(prog="dali-pipes bench resolution", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="", help=f"train data (val: its sibling val/); default: {DEFAULT_DATA}")
    p.add_argument("--sizes", type=int, nargs="+", default=quick.get("sizes", [128, 160, 192, 224]),
                   help="loader: the sizes, alternating epoch by epoch")
    p.add_argument("--rounds", type=int, default=quick.get("rounds", 3), help="loader: epochs at each size")
    p.add_argument("--batch-size", type=int, default=quick.get("batch_size", 32), help="loader and training")
    p.add_argument("--arch", default=quick.get("arch", "resnet18"), help="training: the model (train.models)")
    p.add_argument("--width", type=int, default=quick.get("width", 64), help="training: ResNet base width")
    p.add_argument("--epochs", type=int, default=quick.get("epochs", 3), help="training: epochs of each run")
    p.add_argument("--ramp", type=parse_image_size, default=None, help="training: the schedule (default: "
                   "dali_pipes.progressive from the smallest of --sizes to --fixed over the epochs)")
    p.add_argument("--fixed", type=int, default=None, help="training: the one size (default: the third of --sizes)")
    p.add_argument("--repeats", type=int, default=quick.get("repeats", 2), help="training: runs of each, alternating")
    p.add_argument("--no-train", action="store_true", help="measure the loader only")
    p.add_argument("--no-compile", action="store_true", help="skip the --compile run")
    p.add_argument("--quick", action="store_true", help="tiny sizes, a tiny model, few epochs: a smoke test (its "
                   "training runs in this process; a real run starts python -m train for each)")
    p.add_argument("--out", default="", help="results root folder (default: $DALI_PIPES_CACHE/bench, under the "
                   "cache root)")
    add_arguments(p, SourceConfig, "reading --data")
    add_arguments(p, LoaderConfig, "the DALI loader", skip=("device", "decode_device"))
    args = p.parse_args(argv)
    args.fixed = args.fixed or args.sizes[min(2, len(args.sizes) - 1)]
    if args.ramp is None:  # FFCV's ramp, from the smallest size to --fixed, reached in the last epoch
        args.ramp = progressive(min(args.sizes), args.fixed, 0, max(0, args.epochs - 1), step=16 if quick else 32)
    return args


def loader_rates(source, args, loader: LoaderConfig) -> list[dict]:
    """One row per epoch of one loader whose size changes every epoch (the sizes cycle)."""
    schedule = {epoch: args.sizes[epoch % len(args.sizes)] for epoch in range(args.rounds * len(args.sizes))}
    kwargs = {k: v for k, v in vars(loader).items() if k not in ("device", "decode_device")}
    dali = DaliLoader(source, batch_size=args.batch_size, train=True, device="cpu", image_size=schedule, seed=0,
                      **kwargs)
    rows = []
    for epoch in tqdm(range(len(schedule)), desc="loader epochs", unit="epoch", file=sys.stderr, disable=None):
        dali.set_epoch(epoch)
        size, images, first = dali.image_size, 0, None
        start = time.perf_counter()
        for batch, _ in dali:
            first = first if first is not None else time.perf_counter() - start
            images += len(batch)
        seconds = time.perf_counter() - start
        rows.append({"epoch": epoch, "image_size": size, "images": images, "seconds": round(seconds, 3),
                     "images_per_s": round(images / seconds, 1), "first_batch_s": round(first, 3)})
    dali.close()
    return rows


def per_size(rows: list[dict]) -> list[dict]:
    """The median, lowest and highest images/s of each size, and the median first batch (the rebuild)."""
    out = []
    for size in sorted({r["image_size"] for r in rows}):
        mine = [r for r in rows if r["image_size"] == size]
        rates = [r["images_per_s"] for r in mine]
        out.append({"image_size": size, "epochs": len(mine), "median_images_per_s": statistics.median(rates),
                    "min": min(rates), "max": max(rates),
                    "median_first_batch_s": statistics.median(r["first_batch_s"] for r in mine)})
    return out


def train_run(args, name: str, image_size, compile: bool, data: str, work: str) -> dict:
    """`python -m train` in a child process; its epochs from metrics.jsonl."""
    workdir = os.path.join(work, re.sub(r"[^a-z0-9]+", "-", name).strip("-"))
    cmd = [sys.executable, "-m", "train", "--data", data, "--device", "cpu", "--arch", args.arch, "--width",
           str(args.width), "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--image-size",
           schedule_text(image_size), "--workdir", workdir, "--checkpoint-every", "0", "--seed", "0",
           *(["--compile"] if compile else [])]
    print(" ".join(cmd), flush=True)
    start = time.perf_counter()
    if args.quick:  # a smoke test: in this process, where torch and DALI are imported already (a child's start
        # would cost more than its tiny run); a real run gives each training run a process of its own, as a user's
        from train.train import get_args_parser, main
        with contextlib.redirect_stdout(io.StringIO()):
            main(get_args_parser().parse_args(cmd[3:]))
    else:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    total = time.perf_counter() - start
    keep = ("epoch", "image_size", "epoch_seconds", "images_per_s", "train_loss", "val_top1", "val_image_size",
            "compiles", "compile_s")
    epochs = [{k: m[k] for k in keep if k in m} for m in map(json.loads, open(os.path.join(workdir, "metrics.jsonl")))]
    row = {"run": name, "image_size": schedule_text(image_size), "compile": compile, "process_s": round(total, 1),
           "train_s": round(sum(e["epoch_seconds"] for e in epochs), 1), "final_val_top1": epochs[-1].get("val_top1"),
           "epochs": epochs}
    return row


def training_rows(args) -> list[dict]:
    data = data_or_builtin(args.data)
    # Alternating and repeated: a shared machine's load changes from minute to minute.
    runs = [(f"{name} #{i + 1}", size, False) for i in range(args.repeats)
            for name, size in (("fixed", args.fixed), ("ramp", args.ramp))]
    runs += [("ramp, --compile", args.ramp, True)] * (not args.no_compile)
    with tempfile.TemporaryDirectory(prefix="bench-resolution-") as work:
        return [train_run(args, name, size, compile, data, work)
                for name, size, compile in tqdm(runs, desc="training runs", unit="run", file=sys.stderr, disable=None)]


def markdown(run: dict) -> str:
    info = run["machine"]
    lines = [f"# Progressive resizing: {bench.machine_tag(info)}, {info['date']}\n", f"`{run['command']}`\n",
             f"Setup: {json.dumps(run['setup'])}\n",
             "## The loader at each size (one run, sizes alternating by epoch)\n",
             "| size px | epochs | images/s (median) | min | max | first batch s (rebuild) |",
             "|---|---|---|---|---|---|"]
    for r in run["loader"]["per_size"]:
        lines.append(f"| {r['image_size']} | {r['epochs']} | {r['median_images_per_s']:.1f} | {r['min']:.1f} | "
                     f"{r['max']:.1f} | {r['median_first_batch_s']:.2f} |")
    if run["training"]:
        lines += ["\n## python -m train, same epochs\n", "| run | --image-size | epoch s | train s | process s | "
                  "final val top-1 | compile s per size |", "|---|---|---|---|---|---|---|"]
        for r in run["training"]:
            epoch_s = ", ".join(f"{e['epoch_seconds']:.1f} ({e['image_size']})" for e in r["epochs"])
            compiled = ", ".join(f"{e['image_size']}: {e['compile_s']:.1f}" for e in r["epochs"] if e.get("compiles"))
            lines.append(f"| {r['run']} | {r['image_size']} | {epoch_s} | {r['train_s']:.1f} | {r['process_s']:.1f} | "
                         f"{r['final_val_top1']:.3f} | {compiled or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    source_cfg, loader = from_args(SourceConfig, args), from_args(LoaderConfig, args, device="cpu")
    source = open_source(data_or_builtin(args.data), **source_cfg.open_kwargs())
    rows = loader_rates(source, args, loader)
    info = bench.machine_info()
    run = {"command": command("resolution", argv), "machine": info, "dataset": bench.dataset_info(source),
           "setup": {"sizes": args.sizes, "rounds": args.rounds, "batch_size": args.batch_size, "arch": args.arch,
                     "width": args.width, "epochs": args.epochs, "repeats": args.repeats, "fixed": args.fixed,
                     "ramp": schedule_text(args.ramp)},
           "configs": configs(source=source_cfg, loader=loader),
           "loader": {"per_size": per_size(rows), "epochs": rows},
           "training": [] if args.no_train else training_rows(args)}
    out = bench.results_dir(results_root(args.out), info)
    with open(os.path.join(out, "resolution.json"), "w") as f:
        json.dump(run, f, indent=1, default=str)
    table = markdown(run)
    with open(os.path.join(out, "resolution.md"), "w") as f:
        f.write(table)
    print(f"{table}\nresults in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
