"""Detection training's data wait (issue 35): torchvision's SSDlite320 MobileNetV3-Large
(`ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=91)`, no download) trained for
`--steps` steps on the references' `ssdlite` preset (RandomIoUCrop + RandomHorizontalFlip, v2, the model resizes
to 320 px itself), fed by DaliLoader (its graph on `--device`) and by torch's DataLoader + PIL (`--workers`
processes, persistent), one feed after the other, each with a fresh model from the same seed.

Per feed: images/s of the timed steps (after `--warmup`), and the data-wait fraction: the seconds spent in
`next(batches)` over the timed seconds (the GPU synchronised before the clock starts and before it stops), as
dali_pipes_bench/training.py reports for ResNet-50. The loop is the references' train_one_epoch without AMP:
images and target tensors moved to the device, loss = sum of the model's losses, SGD (lr 0.15, momentum 0.9,
weight decay 4e-5: the SSDlite recipe's).

Run: dali-pipes bench detection-training --data DIR --device gpu (or python -m dali_pipes_bench.detection_training);
DIR is a `dali-pipes sample DIR --detection` folder. torchvision as dali_pipes_bench/detection.py imports it."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Iterable, Sequence

import torch

from dali_pipes_bench.cli import bar, command, markdown, out_help, report, require, run_main
from dali_pipes_bench.detection import DALI, coco_dataset, collate_fn, import_torchvision, to_device

FEEDS = (DALI, "DataLoader + PIL")


def make_loader(feed: str, dataset: Any, *, batch_size: int, device: str, threads: int, workers: int,
                seed: int) -> Iterable:
    """The feed's loader over `dataset`, both with the references' collate_fn and a RandomSampler."""
    from torch.utils.data import DataLoader, RandomSampler

    from dali_pipes import DaliLoader
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    if feed == DALI:
        return DaliLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True, collate_fn=collate_fn,
                          device=device, num_threads=threads, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True, collate_fn=collate_fn,
                      num_workers=workers, persistent_workers=workers > 0)


def measure(make: Callable[[], Iterable], *, steps: int, warmup: int, device: torch.device, seed: int) -> dict:
    """images/s and the data-wait fraction of `steps` timed training steps after `warmup` steps."""
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large
    torch.manual_seed(seed)
    model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=91).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.15, momentum=0.9, weight_decay=4e-5)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    loader = make()
    batches = (batch for _ in iter(int, 1) for batch in loader)  # epochs back to back
    wait, images_seen, timed_from, loss = 0.0, 0, time.perf_counter(), torch.zeros(())
    for step in range(warmup + steps):
        if step == warmup:
            sync()
            wait, images_seen, timed_from = 0.0, 0, time.perf_counter()
        tick = time.perf_counter()
        images, targets = next(batches)
        wait += time.perf_counter() - tick
        images, targets = to_device(images, targets, str(device))
        loss = sum(model(images, targets).values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        images_seen += len(images)
    sync()
    seconds = time.perf_counter() - timed_from
    getattr(loader, "close", lambda: None)()
    return {"images_per_s": images_seen / seconds, "data_wait_fraction": wait / seconds, "seconds": seconds,
            "steps": steps, "loss": loss.item()}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="dali-pipes bench detection-training", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a `dali-pipes sample DIR --detection` folder")
    p.add_argument("--device", choices=("cpu", "gpu"), default="gpu", help="the model's device and DaliLoader's")
    p.add_argument("--batch-size", type=int, default=24, help="per GPU (the references' SSDlite recipe: 24)")
    p.add_argument("--steps", type=int, default=40, help="timed training steps per feed")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (cuDNN's choices, workers' start)")
    p.add_argument("--feeds", nargs="+", default=list(FEEDS), choices=FEEDS)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="DALI threads")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="DataLoader num_workers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torchvision-path", default="", help="as dali-pipes bench detection's")
    p.add_argument("--out", default="", help=out_help("detection-training.json"))
    args = p.parse_args(argv)
    if args.device == "gpu" and not torch.cuda.is_available():
        raise ValueError(f"--device gpu: torch {torch.__version__} sees no CUDA device here; run on a GPU machine "
                         f"or pass --device cpu")
    require("pycocotools", "torchvision's CocoDetection reads the annotations with it", "pip install pycocotools")
    import_torchvision(args.torchvision_path)
    dataset = coco_dataset(args.data, "ssdlite")
    device = torch.device("cuda" if args.device == "gpu" else "cpu")
    rows = []
    for feed in bar(args.feeds, desc="feeds", unit="feed"):
        make = lambda feed=feed: make_loader(feed, dataset, batch_size=args.batch_size, device=args.device,
                                             threads=args.threads, workers=args.workers, seed=args.seed)
        row = {"feed": feed, **measure(make, steps=args.steps, warmup=args.warmup, device=device, seed=args.seed)}
        rows.append(row)
    table = markdown(["feed", "images/s", "data wait (of the step time)"],
                     [(r["feed"], f"{r['images_per_s']:.1f}", f"{r['data_wait_fraction']:.3f}") for r in rows])
    report({"command": command("detection-training", argv), "data": args.data,
            "model": "ssdlite320_mobilenet_v3_large", "device": args.device, "batch_size": args.batch_size,
            "threads": args.threads, "workers": args.workers, "cpu_count": os.cpu_count(), "images": len(dataset),
            "rows": rows}, args.out, "detection-training",
           f"SSDlite320, {args.steps} steps, batch {args.batch_size}, {args.device}:\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
