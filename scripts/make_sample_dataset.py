"""Make the built-in ImageNet-like dataset: OUT/train/<class>/*.jpg and OUT/val/<class>/*.jpg."""

import argparse
import time

from dali_pipes.sample_data import SampleDatasetConfig, make_sample_dataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", help="output folder")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train-per-class", type=int, default=100)
    parser.add_argument("--val-per-class", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    return parser.parse_args()


def main(args: argparse.Namespace) -> None:
    cfg = SampleDatasetConfig(classes=args.classes, train_per_class=args.train_per_class,
                              val_per_class=args.val_per_class, seed=args.seed)
    start = time.perf_counter()
    stats = make_sample_dataset(args.out, cfg, workers=args.workers)
    print(f"{args.out}: {stats['train']} train + {stats['val']} val images in {args.classes} classes, "
          f"mean {stats['mean_bytes'] / 1e3:.0f} KB, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main(parse_args())
