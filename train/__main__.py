from dali_pipes.config import run_cli
from train.train import get_args_parser, main

if __name__ == "__main__":
    run_cli(main, get_args_parser().parse_args())  # bad data, a full disk: one line naming it, not a traceback
