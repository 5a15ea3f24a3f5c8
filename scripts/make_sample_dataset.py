"""Make the built-in ImageNet-like dataset: same as `dali-pipes sample OUT [flags]`."""

import sys

from dali_pipes.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["sample", *sys.argv[1:]]))
