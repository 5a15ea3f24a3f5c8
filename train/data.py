"""The run's data: the built-in dataset when --data is not given (made once), the val folder beside the
train folder, and the number of classes the data holds."""

from __future__ import annotations

import argparse
import os

import torch.distributed as dist

from dali_pipes import Source

DEFAULT_DATA = "data/sample/images"  # the built-in dataset, made on first use


def resolve_data(args: argparse.Namespace) -> tuple[str, str]:
    """(train data, val data or ""): the built-in dataset, made once, when --data is not given."""
    data = args.data
    if not data:
        data = os.path.join(DEFAULT_DATA, "train")
        if not os.path.isdir(data):
            from dali_pipes.tools.sample_data import make_sample_dataset
            if int(os.environ.get("RANK", 0)) == 0:
                print(f"making the built-in dataset in {DEFAULT_DATA} ...", flush=True)
                make_sample_dataset(DEFAULT_DATA)
            if dist.is_initialized():
                dist.barrier()
    val = args.val_data
    if not val:
        guess = os.path.join(os.path.dirname(os.path.abspath(data.rstrip("/"))), "val")
        val = guess if os.path.isdir(guess) and os.path.abspath(guess) != os.path.abspath(data) else ""
    return data, val


def num_classes_of(source: Source) -> int:
    """Classes of the train source: its class list, or its largest label + 1."""
    if source.classes:
        return len(source.classes)
    if source.labels:
        return max(source.labels) + 1
    raise SystemExit(f"{source.location}: cannot tell the number of classes (no classes.json); pass --num-classes")


def data_line(args: argparse.Namespace, train: Source, val: Source | None) -> str:
    """The start-up line: the data found (images, classes) and where val comes from."""
    classes = args.num_classes or num_classes_of(train)
    line = f"data: {train.location} ({train.kind}): {train.num_samples} images, {classes} classes; val: "
    if val is None:
        return line + "none (no --val-data, and no val folder beside the train data)"
    found = "" if args.val_data else ", found beside the train data"
    return line + f"{val.location} ({val.kind}): {val.num_samples} images{found}"
