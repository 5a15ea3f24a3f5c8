"""Convert an image folder or file list (or any source) to WebDataset tar shards + DALI indexes + classes.json."""

import argparse

from dali_pipes.config import add_convert_arguments, run_cli, source_from_args
from dali_pipes.convert import write_webdataset


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    add_convert_arguments(parser, ".tar")
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    stats = write_webdataset(source_from_args(args.src, args), args.out, shards=args.shards,
                             prefix=args.prefix, seed=args.seed, workers=args.workers)
    print(f"{args.out}: {stats}")


if __name__ == "__main__":
    run_cli(main, parse_args())
