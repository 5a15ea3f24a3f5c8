"""A ResNet training step (ResNet-50, AMP on GPU, by default) fed by (a) one batch replayed from
device memory, the ideal, and (b) each real loader on the same data. Reports images/s, the
real/ideal ratio and the data-wait fraction of each, into OUT/<machine>-<date>/training.*"""

import argparse
import json
import os
import sys

import torch

from dali_pipes_bench import harness as bench
from dali_pipes import DaliLoader, open_source
from dali_pipes.baseline import TorchLoader
from dali_pipes_bench.training import ideal_feed, measure_training

DEFAULT_DATA = "data/sample/images/train"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="", help=f"dataset; default: the built-in train split, {DEFAULT_DATA}")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=0, help="default: 256 on GPU, 32 on CPU")
    parser.add_argument("--steps", type=int, default=0, help="timed steps per feed (default: 50 on GPU, 10 on CPU)")
    parser.add_argument("--warmup", type=int, default=0, help="untimed steps first (default: 10 on GPU, 3 on CPU)")
    parser.add_argument("--quick", action="store_true", help="a small model and few steps: a smoke test")
    parser.add_argument("--out", default="benchmarks/results")
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> str:
    gpu, cores = torch.cuda.is_available(), os.cpu_count() or 1
    if args.quick:
        args.arch, args.width, args.image_size, args.steps, args.warmup = "resnet18", 16, 112, 6, 2
    batch = args.batch_size or (256 if gpu else 32)
    args.steps, args.warmup = args.steps or (50 if gpu else 10), args.warmup or (10 if gpu else 3)
    data = args.data or DEFAULT_DATA
    if not args.data and not os.path.isdir(data):
        from dali_pipes.sample_data import make_sample_dataset
        make_sample_dataset(os.path.dirname(data))
    source = open_source(data)
    num_classes = len(source.classes) if source.classes else 1000
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    common = dict(batch_size=batch, train=True, image_size=args.image_size)
    feeds = {"ideal (one batch replayed from device memory)":
             lambda: ideal_feed(batch, args.image_size, num_classes, device)}
    if gpu:
        feeds["DALI gpu"] = lambda: DaliLoader(source, device="gpu", num_threads=cores, channels_last=True, **common)
    feeds["DALI cpu"] = lambda: DaliLoader(source, device="cpu", num_threads=cores, **common)
    feeds[f"DataLoader+PIL {cores} workers"] = lambda: TorchLoader(source, num_workers=cores, **common)
    if gpu and bench.available("torchvision"):
        feeds["torchvision GPU decode"] = lambda: bench.TorchvisionGpuLoader(source, num_workers=cores, **common)
    rows = []
    # The ideal runs first and again last: the better of the two is the reference, so that a
    # warming machine (clocks, kernel caches) cannot make a real loader beat the ideal.
    order = list(feeds.items()) + [next(iter(feeds.items()))]
    for name, factory in order:
        try:
            row = measure_training(factory, arch=args.arch, width=args.width, num_classes=num_classes,
                                   steps=args.steps, warmup=args.warmup, device=device, amp=gpu)
        except Exception as e:
            row = {"error": f"{type(e).__name__}: {e}"[:500]}
        rows.append({"feed": name, **row})
        print(json.dumps(rows[-1]), flush=True)
    first, last = rows[0], rows.pop()
    if last.get("images_per_s", 0) > first.get("images_per_s", 0):
        rows[0] = last
    ideal = rows[0].get("images_per_s")
    for row in rows:
        row["real_over_ideal"] = row.get("images_per_s", 0) / ideal if ideal else None
    info = bench.machine_info()
    out = bench.results_dir(args.out, info)
    command = "python scripts/bench_training.py " + " ".join(sys.argv[1:])
    setup = {"arch": args.arch, "width": args.width, "image_size": args.image_size, "batch_size": batch,
             "steps": args.steps, "warmup": args.warmup, "amp_bf16": gpu, "channels_last": gpu}
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump({"command": command, "machine": info, "dataset": bench.dataset_info(source), "setup": setup,
                   "results": rows}, f, indent=1, default=str)
    lines = [f"# Training step fed by each loader: {bench.machine_tag(info)}, {info['date']}\n", f"`{command}`\n",
             f"Setup: {json.dumps(setup)}\n", "| feed | images/s | real / ideal | data-wait fraction | first batch s |",
             "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['feed']} | failed: {r['error'][:80]} | | | |")
        else:
            lines.append(f"| {r['feed']} | {r['images_per_s']:.1f} | {r['real_over_ideal']:.2f} | "
                         f"{r['data_wait_fraction']:.3f} | {r['first_batch_s']:.2f} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(out, "training.md"), "w") as f:
        f.write(table)
    print(table)
    return out


if __name__ == "__main__":
    main(parse_args())
