"""Build (or check) the DALI index of every shard: same as `dali-pipes index PATH [flags]`."""

import sys

from dali_pipes.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["index", *sys.argv[1:]]))
