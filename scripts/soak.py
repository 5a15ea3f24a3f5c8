"""Soak test: many epochs of one loader, host RSS (process tree) and GPU memory per epoch.
Exits 1 if memory grows by 5% or more after the second epoch. Not part of the default test run;
tests/test_soak.py runs a CI-sized version."""

import argparse
import json
import sys

from dali_pipes import DaliLoader
from dali_pipes_bench.soak import growth_after, soak

DEFAULT_DATA = "data/sample/images/train"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--device", default="auto", choices=["auto", "gpu", "cpu"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--val", action="store_true", help="val mode instead of train")
    parser.add_argument("--max-growth", type=float, default=0.05)
    parser.add_argument("--out", default="", help="also write the per-epoch records here (JSON lines)")
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    loader = DaliLoader(args.data, batch_size=args.batch_size, train=not args.val, device=args.device,
                        image_size=args.image_size, num_threads=args.threads)
    records = []
    for record in soak(loader, args.epochs):
        records.append(record)
        print(json.dumps(record), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    verdict = {key: growth_after(records, key) for key in ("host_mb", "gpu_used_mb")}
    failed = [k for k, g in verdict.items() if g is not None and g >= args.max_growth]
    print(json.dumps({"growth_after_epoch_2": verdict, "limit": args.max_growth, "ok": not failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
