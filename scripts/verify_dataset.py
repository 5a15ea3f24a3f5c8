"""Check every sample of a dataset: same as `dali-pipes verify PATH [flags]`."""

import sys

from dali_pipes.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["verify", *sys.argv[1:]]))
