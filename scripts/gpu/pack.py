"""Pack the wheels a lent GPU machine lacks into parts of one call each: dali_pipes_bench/gpu_pack.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: dali_pipes_bench need not be installed

from dali_pipes_bench.gpu_pack import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
