"""A training step fed by each loader: same as `dali-pipes bench training [flags]`."""

import sys

from dali_pipes_bench.cli import run_main
from dali_pipes_bench.training import main

if __name__ == "__main__":
    sys.exit(run_main(main))
