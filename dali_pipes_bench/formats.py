"""Make the built-in dataset, convert its train split, and read one epoch of each format (image
folder, TFRecord, WebDataset) through DaliLoader in val mode (decode + resize + centre crop +
normalise); prints a table of images/s and where the results went: formats.json (every row and the
resolved configs) at --out, default $DALI_PIPES_CACHE/bench/formats-<date>/. --data is where the
dataset and its copies are made: a folder holding anything else is refused.
Run: dali-pipes bench formats [flags] (or python -m dali_pipes_bench.formats)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict
from typing import Sequence

from dali_pipes import AugmentConfig, DaliLoader, LoaderConfig, open_source
from dali_pipes.errors import DatasetError
from dali_pipes.options import add_arguments, from_args
from dali_pipes.tools.convert import write_tfrecords, write_webdataset
from dali_pipes.tools.sample_data import make_sample_dataset
from dali_pipes_bench.cli import bar, command, configs, markdown, report, run_main

MADE = {"images", "tfrecord", "webdataset", "parquet"}  # what --data holds once the benchmarks made their copies


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dali-pipes bench formats", description=__doc__)
    parser.add_argument("--data", default="data/sample", help="where the built-in dataset (DATA/images) and its "
                        "conversions (DATA/tfrecord, DATA/webdataset) are made, once; not your data: a folder "
                        "holding anything else is refused")
    parser.add_argument("--shards", type=int, default=8, help="shards of each conversion")
    parser.add_argument("--batch-size", type=int, default=64, help="per step")
    parser.add_argument("--out", default="", help="write the results (rows and configs) as JSON here "
                        "(default: formats.json in a folder of this run's own under $DALI_PIPES_CACHE/bench)")
    add_arguments(parser, AugmentConfig, "augmentation")
    add_arguments(parser, LoaderConfig, "DALI loader", defaults={"device": "cpu"})
    return parser.parse_args(argv)


def check_work_folder(root: str) -> None:
    """Refuse a `root` holding what the benchmarks did not make (a user's dataset given as --data): they write
    1,200 images and their shard copies into it."""
    if not os.path.isdir(root):
        return
    foreign = sorted(set(os.listdir(root)) - MADE)
    images = os.path.join(root, "images")
    if os.path.isdir(images):
        foreign += sorted(f"images/{name}" for name in set(os.listdir(images)) - {"train", "val"})
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise DatasetError(root, f"holds {shown}, which bench formats did not make: --data is the folder where it "
                           f"makes the built-in dataset (DATA/images) and its copies (DATA/tfrecord, DATA/webdataset)",
                           "pass a new or empty folder (default: data/sample); to time your own data, run "
                           "dali-pipes bench loaders --data DIR")


def format_copies(root: str, shards: int) -> dict[str, str]:
    """Name -> location of the built-in train split as image folder, TFRecord and WebDataset shards."""
    check_work_folder(root)
    images = os.path.join(root, "images")
    if not os.path.isdir(os.path.join(images, "val")):
        print(make_sample_dataset(images), file=sys.stderr)
    train = open_source(os.path.join(images, "train"))
    copies = {"image folder": train.location, "TFRecord": os.path.join(root, "tfrecord"),
              "WebDataset": os.path.join(root, "webdataset")}
    for name, write in (("TFRecord", write_tfrecords), ("WebDataset", write_webdataset)):
        if not os.path.exists(os.path.join(copies[name], "classes.json")):  # overwrite: a copy cut short is ours
            print(f"{name}: {write(train, copies[name], shards=shards, overwrite=True)}", file=sys.stderr)
    return copies


def read_epoch(location: str, batch_size: int, augment: AugmentConfig, loader_cfg: LoaderConfig) -> dict:
    """One val epoch of `location`: samples (padding excluded) and seconds after the loader is built."""
    loader = DaliLoader(location, batch_size=batch_size, train=False, augment=augment, **asdict(loader_cfg))
    start = time.perf_counter()
    samples = sum(int((labels >= 0).sum()) for _, labels in loader)  # label -1: padding of the last batch
    seconds = time.perf_counter() - start
    loader.close()
    return {"samples": samples, "seconds": round(seconds, 3), "images_per_s": round(samples / seconds, 1)}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    augment, loader_cfg = from_args(AugmentConfig, args), from_args(LoaderConfig, args)
    rows = []
    for name, location in bar(format_copies(args.data, args.shards).items(), desc="formats", unit="format"):
        rows.append({"format": name, **read_epoch(location, args.batch_size, augment, loader_cfg)})
    result = {"command": command("formats", argv), "results": rows,
              "configs": configs(augment=augment, loader=loader_cfg)}
    table = markdown(["format", "images", "seconds", "images/s"],
                     [(r["format"], r["samples"], f"{r['seconds']:.2f}", f"{r['images_per_s']:.0f}") for r in rows])
    report(result, args.out, "formats", f"One val epoch on DALI {loader_cfg.device}:\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
