"""The device side of a GPU session (receive N, run) and its --dry-run: dali_pipes_bench/gpu_session.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: a lent machine installs nothing of ours

from dali_pipes_bench.gpu_session import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
