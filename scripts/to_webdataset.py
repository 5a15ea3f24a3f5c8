"""Convert to WebDataset tar shards: same as `dali-pipes convert webdataset SRC OUT [flags]`."""

import sys

from dali_pipes.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", "webdataset", *sys.argv[1:]]))
