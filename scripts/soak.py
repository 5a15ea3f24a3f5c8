"""Memory per epoch over many epochs: same as `dali-pipes bench soak [flags]`."""

import sys

from dali_pipes_bench.cli import run_main
from dali_pipes_bench.soak import main

if __name__ == "__main__":
    sys.exit(run_main(main))
