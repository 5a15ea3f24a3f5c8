"""python -m train's flags: the hand-written dataclass-to-argparse bridge (dali_pipes/options.py) against
jsonargparse (issue 36), whole command start and the parser alone, cases alternated.

    PYTHONPATH=.:/path/to/jsonargparse python benchmarks/results/cpu2-2026-11-27/bench_cli_library.py [ROUNDS]

Each child imports train.train (torch, DALI: what `python -m train` imports before it parses), then builds its
parser and parses a typical command line (or --help); it prints the seconds of the import of the argument library
+ building + parsing; the parent times the whole child.
"""

import argparse
import contextlib
import io
import statistics
import subprocess
import sys
import time

ARGV = "--data /d/train --epochs 3 --batch-size 64 --num-threads 2 --image-size 160 --workdir runs/x --skip-bad"
ARGV_UNDERSCORED = "--data /d/train --epochs 3 --batch-size 64 --num_threads 2 --image_size 160 --workdir runs/x " \
                   "--skip_bad true"  # jsonargparse's names for the dataclass fields


def hand_written(help_: bool) -> float:
    start = time.perf_counter()
    from train.train import get_args_parser
    parser = get_args_parser()
    parsed = _parse(parser, ["--help"] if help_ else ARGV.split())
    assert help_ or (parsed.num_threads, parsed.image_size, parsed.skip_bad) == (2, 160, True), parsed
    return time.perf_counter() - start


def with_jsonargparse(help_: bool) -> float:
    """The same flags through jsonargparse: the train loop's own flags copied from today's parser, the dataclasses
    by add_class_arguments (jsonargparse names them --num_threads: underscores), a --config file action."""
    start = time.perf_counter()
    from jsonargparse import ActionConfigFile, ArgumentParser

    from dali_pipes import AugmentConfig, LoaderConfig, SourceConfig
    from train.train import get_args_parser
    parser = ArgumentParser(prog="python -m train")
    parser.add_argument("--config", action=ActionConfigFile)
    fields = {f for cls in (LoaderConfig, AugmentConfig, SourceConfig) for f in cls.__dataclass_fields__}
    for action in get_args_parser()._actions:  # the same train flags (its build counted: jsonargparse's part too)
        if action.dest in fields or action.dest in ("help", "config") or not action.option_strings:
            continue
        kind = {"action": "store_true"} if action.nargs == 0 and action.const is True else \
            {"type": bool | None} if action.nargs == 0 else {"type": action.type or str}
        if action.choices:
            kind["choices"] = action.choices
        parser.add_argument(action.option_strings[0], default=action.default, help=action.help, **kind)
    for cls in (LoaderConfig, AugmentConfig, SourceConfig):
        parser.add_class_arguments(cls, nested_key=None)
    parsed = _parse(parser, ["--help"] if help_ else ARGV_UNDERSCORED.split())
    assert help_ or (parsed.num_threads, parsed.image_size, parsed.skip_bad) == (2, 160, True), parsed
    return time.perf_counter() - start


def _parse(parser, argv):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        return parser.parse_args(argv)


def child(case: str, help_: bool) -> None:
    import train.train  # noqa: F401  # what python -m train imports before it parses: not the library's part
    seconds = (hand_written if case == "hand-written" else with_jsonargparse)(help_)
    print(seconds)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    cases = [(case, what) for what in ("parse", "help") for case in ("hand-written", "jsonargparse")]
    whole: dict = {c: [] for c in cases}
    parser_s: dict = {c: [] for c in cases}
    for _ in range(rounds):
        for case, what in cases:  # alternated: the machine's load falls on every case alike
            start = time.perf_counter()
            out = subprocess.run([sys.executable, __file__, "child", case, what], capture_output=True, text=True,
                                 check=True).stdout
            whole[(case, what)].append(time.perf_counter() - start)
            parser_s[(case, what)].append(float(out.split()[-1]))
    for (case, what) in cases:
        for name, values in (("whole command s", whole), ("parser alone ms", parser_s)):
            v = values[(case, what)]
            scale = 1e3 if name.startswith("parser") else 1
            print(f"{case:13} {what:5} {name}: median {statistics.median(v) * scale:.3g} [min {min(v) * scale:.3g} "
                  f"max {max(v) * scale:.3g}] raw {' '.join(f'{x * scale:.3g}' for x in v)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2], sys.argv[3] == "help")
    else:
        main()
