"""A training step fed by each loader: same as `dali-pipes bench training [flags]`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # train/ of this checkout
from dali_pipes_bench.cli import run_main  # noqa: E402
from dali_pipes_bench.training import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_main(main))
