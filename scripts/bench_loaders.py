"""Compare input pipelines: same as `dali-pipes bench loaders [flags]`."""

import sys

from dali_pipes_bench.cli import run_main
from dali_pipes_bench.loaders import main

if __name__ == "__main__":
    sys.exit(run_main(main))
