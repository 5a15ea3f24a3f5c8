"""Build (or check) the DALI index of every TFRecord / tar shard of a dataset."""

import argparse

from dali_pipes.config import add_source_arguments, run_cli, source_from_args


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", help="shards: a folder, a glob such as 'train-*-of-*', or a list file")
    add_source_arguments(parser)
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    source = source_from_args(args.path, args)
    if not source.index_files:
        print(f"{args.path}: {source.kind} needs no index")
        return
    for shard, index, count in zip(source.files, source.index_files, source.counts):
        print(f"{shard}: {count} samples, index {index}")


if __name__ == "__main__":
    run_cli(main, parse_args())
