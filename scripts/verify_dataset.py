"""Check every sample of a dataset (image folder, file list, TFRecord or tar shards) in parallel.

Prints each problem with its file (and record) and exits 1 when anything is wrong."""

import argparse
import sys

from dali_pipes.config import add_source_arguments, run_cli, tfrecord_keys
from dali_pipes.verify import DEFAULT_MAX_PIXELS, verify, write_clean_list


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", help="image folder, file list, or shards (a folder, glob or list)")
    parser.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                        help="images with more pixels are flagged (decompression-bomb guard)")
    parser.add_argument("--write-clean-list", metavar="FILE",
                        help="write a file list ('relative/path label') of the good samples")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    add_source_arguments(parser)
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    report = verify(args.path, keys=tfrecord_keys(args), label_ext=args.label_ext, max_pixels=args.max_pixels,
                    workers=args.workers)
    for problem in report.problems:
        print(problem)
    print(f"{args.path}: {report.kind}, {report.checked} samples checked, {len(report.problems)} problems")
    if args.write_clean_list:
        lines = write_clean_list(report, args.write_clean_list)
        print(f"{args.write_clean_list}: {lines} good samples listed")
    if report.problems:
        sys.exit(1)


if __name__ == "__main__":
    run_cli(main, parse_args())
