"""GPU start-up costs for each preallocation of the GPU decoders (graph.augment's decoder_size_hint): seconds
from DaliLoader(...) to its first batch (stats()["first_batch_s"]) and GPU memory, DALI's apart from torch's
(usage.gpu_memory_figures), over a train loader's first batches. Each case runs in a fresh process (DALI's
pools are per process and never shrink), in alternating rounds. Cases:
  * imagenet: 5980x6430, ImageNet's largest image: the default where the data's sizes are unknown (before);
  * data: the box around the data's images, read from their headers here (what a converted dataset's
    manifest gives the loader by itself: after, for converted data);
  * lazy: 0x0, nothing preallocated; DALI allocates on first use (after, opt-in: --decoder-size-hint 0x0).
With --epochs N (and --val-data), each case goes on for N whole epochs of the train loader and of a val loader
(the val cache off) in the same process, and the figures are the peaks over all of it: train + val after N
epochs, as a training run holds them. --cases picks cases by name.
Prints a table of median [min, max] per case (each round a tick of a bar on stderr) and where the results went:
startup.json at --out, default a folder of this run's own under $DALI_PIPES_CACHE/bench. Needs a GPU.
Run: dali-pipes bench startup [flags] (or python -m dali_pipes_bench.startup)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Sequence

from dali_pipes_bench.cli import bar, command, data_or_builtin, markdown, report, run_main

FIGURES = ("first_batch_s", "gpu_dali_peak_mb", "gpu_torch_reserved_peak_mb", "gpu_device_used_peak_mb")


def data_box(data: str) -> str:
    """WIDTHxHEIGHT of the box around every image of `data`, from the images' headers."""
    import io

    from PIL import Image

    from dali_pipes import open_source
    from dali_pipes.data.formats import read_sample
    sizes = [Image.open(io.BytesIO(read_sample(ref).data)).size for ref in open_source(data).refs()]
    return f"{max(w for w, _ in sizes)}x{max(h for _, h in sizes)}"


def child(data: str, hint: str, batch_size: int, batches: int, epochs: int = 0, val_data: str = "") -> dict:
    """One case in this (fresh) process: the loader's first `batches` batches on the GPU; with `epochs`, then
    that many whole epochs of it and of a val loader on `val_data`."""
    import torch

    from dali_pipes import DaliLoader
    from dali_pipes.graph.augment_config import parse_size_hint
    from dali_pipes.run.usage import PeakSampler, gpu_memory_figures, gpu_used_mb
    torch.cuda.init()
    before = gpu_used_mb()  # the CUDA context: what training holds before its loaders
    with PeakSampler(0.02) as sampler:
        loader = DaliLoader(data, batch_size=batch_size, train=True, device="gpu", image_size=224, seed=0,
                            decoder_size_hint=parse_size_hint(hint))
        it = iter(loader)
        for _ in range(min(batches, len(loader))):
            next(it)
        torch.cuda.synchronize()
        first_batch_s = loader.stats()["first_batch_s"]
        val = run_epochs(loader, it, epochs, val_data, batch_size, parse_size_hint(hint)) if epochs else None
        torch.cuda.synchronize()
        out = {"first_batch_s": first_batch_s, **gpu_memory_figures(sampler, before),
               **({"epochs": epochs, "val_first_batch_s": val} if epochs else {})}
        loader.close()
    return out


def run_epochs(train, rest, epochs: int, val_data: str, batch_size: int, hint) -> float | None:
    """The rest of the train loader's epoch, then `epochs` rounds of a val epoch and (but the last) a train
    epoch: a training run's loaders after `epochs` epochs. Returns the val loader's first-batch seconds."""
    from dali_pipes import DaliLoader
    for _ in rest:
        pass
    val = DaliLoader(val_data, batch_size=batch_size, train=False, device=train.device, image_size=224,
                     **({"decoder_size_hint": hint} if train.device == "gpu" else {})) if val_data else None
    for epoch in range(epochs):
        for _ in val or ():
            pass
        if epoch < epochs - 1:
            train.set_epoch(epoch + 1)
            for _ in train:
                pass
    first = val.stats()["first_batch_s"] if val is not None else None
    if val is not None:
        val.close()
    return first


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="dali-pipes bench startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="", help="train data (default: the built-in train split)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=20, help="batches read per case after the first")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds: one process per case per round")
    p.add_argument("--quick", action="store_true", help="2 rounds, batch 64")
    p.add_argument("--out", default="", help="write the results as JSON here (default: startup.json in a folder "
                   "of this run's own under $DALI_PIPES_CACHE/bench)")
    p.add_argument("--epochs", type=int, default=0, help="then this many whole epochs of train and val (0: none)")
    p.add_argument("--val-data", default="", help="val data for --epochs (default: none, train only)")
    p.add_argument("--cases", default="imagenet,data,lazy", help="the cases to run, by name")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)  # one case, in the process it starts
    args = p.parse_args(argv)
    data = data_or_builtin(args.data)
    batch_size = 64 if args.quick else args.batch_size
    if args.child:  # the parent reads this line from the pipe: the user never sees it
        print(json.dumps(child(data, args.child, batch_size, args.batches, args.epochs, args.val_data)), flush=True)
        return 0
    import torch
    if not torch.cuda.is_available():
        raise ValueError(f"the startup benchmark needs a CUDA GPU; torch {torch.__version__} sees none")
    cases = {name: hint for name, hint in {"imagenet": "5980x6430", "data": "", "lazy": "0x0"}.items()
             if name in args.cases.split(",")}
    if "data" in cases:
        cases["data"] = data_box(data)
    rows: dict[str, list[dict]] = {name: [] for name in cases}
    for _ in bar(range(2 if args.quick else args.rounds), desc="rounds", unit="round"):
        for name, hint in cases.items():  # alternating: a machine that slows down slows every case
            run = subprocess.run([sys.executable, "-m", "dali_pipes_bench.startup", "--data", data, "--child", hint,
                                  "--batch-size", str(batch_size), "--batches", str(args.batches),
                                  "--epochs", str(args.epochs), "--val-data", args.val_data],
                                 capture_output=True, text=True, env={**os.environ})
            if run.returncode != 0:
                raise ValueError(f"case {name} ({hint}) failed: {run.stderr[-2000:]}")
            rows[name].append(json.loads(run.stdout.strip().splitlines()[-1]))
    summary = {name: {key: _spread([r[key] for r in runs]) for key in FIGURES} for name, runs in rows.items()}
    table = markdown(["case", "decoder size hint", *(f"{key} median [min, max]" for key in FIGURES)],
                     [(name, cases[name] or "-", *(f"{s['median']} [{s['min']}, {s['max']}]" for s in figures.values()))
                      for name, figures in summary.items()])
    report({"command": command("startup", argv), "batch_size": batch_size, "cases": cases, "epochs": args.epochs,
            "val_data": args.val_data, "runs": rows, "summary": summary}, args.out, "startup", table)
    return 0


def _spread(values: list) -> dict:
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(known), 3), "min": round(min(known), 3), "max": round(max(known), 3)}


if __name__ == "__main__":
    sys.exit(run_main(main))
