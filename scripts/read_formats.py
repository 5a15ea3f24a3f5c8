"""One epoch of each storage format: same as `dali-pipes bench formats [flags]`."""

import sys

from dali_pipes_bench.cli import run_main
from dali_pipes_bench.formats import main

if __name__ == "__main__":
    sys.exit(run_main(main))
