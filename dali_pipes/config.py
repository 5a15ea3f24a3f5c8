"""The argparse bridge: flags for the options that every script shares, turned into library calls."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from dali_pipes.errors import DatasetError
from dali_pipes.sources import Source, TFRecordKeys, open_source


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reading TFRecord / WebDataset shards")
    group.add_argument("--image-key", default=TFRecordKeys.image, help="TFRecord feature holding the image")
    group.add_argument("--label-key", default=TFRecordKeys.label, help="TFRecord feature holding the label")
    group.add_argument("--label-offset", type=int, default=TFRecordKeys.label_offset,
                       help="subtracted from stored labels (1 for TensorFlow's 1-based ImageNet records)")
    group.add_argument("--label-ext", default="cls", help="WebDataset member extension holding the label")
    group.add_argument("--index-cache-dir", default=None,
                       help="where to build indexes when the shard folder is read-only")


def tfrecord_keys(args: argparse.Namespace) -> TFRecordKeys:
    return TFRecordKeys(args.image_key, args.label_key, args.label_offset)


def source_from_args(location: str, args: argparse.Namespace) -> Source:
    return open_source(location, keys=tfrecord_keys(args), label_ext=args.label_ext,
                       index_cache_dir=args.index_cache_dir)


def add_convert_arguments(parser: argparse.ArgumentParser, ext: str) -> None:
    """SRC OUT and the sharding flags shared by the converters."""
    parser.add_argument("src", help="image folder, file list, or shards (a folder, glob or list)")
    parser.add_argument("out", help="output folder")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--prefix", default="train", help=f"shard names: PREFIX-00000-of-0000K{ext}")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffle across shards")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    add_source_arguments(parser)


def run_cli(main: Callable[[argparse.Namespace], None], args: argparse.Namespace) -> None:
    """Run a script's main; bad data ends it with the one-line message, not a traceback."""
    try:
        main(args)
    except (DatasetError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
