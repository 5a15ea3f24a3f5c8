"""Convert an image folder or file list (or any source) to TFRecord shards + DALI indexes + classes.json.

With --decompress, SRC is GZIP/ZLIB-compressed TFRecords; they are rewritten uncompressed,
record for record, so that DALI can read them."""

import argparse

from dali_pipes import DatasetError
from dali_pipes.config import add_convert_arguments, run_cli, source_from_args
from dali_pipes.convert import decompress_tfrecords, write_tfrecords
from dali_pipes.sources import classify


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    add_convert_arguments(parser, ".tfrecord")
    parser.add_argument("--decompress", action="store_true", help="SRC is GZIP/ZLIB TFRecords: write them uncompressed")
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    if args.decompress:
        kind, shards = classify(args.src)
        if kind != "tfrecord":
            raise DatasetError(f"{args.src}: --decompress needs TFRecord shards, found {kind}")
        stats = decompress_tfrecords(shards, args.out, workers=args.workers)
    else:
        stats = write_tfrecords(source_from_args(args.src, args), args.out, shards=args.shards,
                                prefix=args.prefix, seed=args.seed, workers=args.workers)
    print(f"{args.out}: {stats}")


if __name__ == "__main__":
    run_cli(main, parse_args())
