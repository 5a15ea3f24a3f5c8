import logging

from dali_pipes.config import run_cli
from train.train import get_args_parser, main

if __name__ == "__main__":
    # The library's own lines (tuning trials and choices, bad samples excluded) on stderr, tagged.
    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("dali_pipes").setLevel(logging.INFO)
    run_cli(main, get_args_parser().parse_args())  # bad data, a full disk: one line naming it, not a traceback
