"""python -m train's flags: the hand-written bridge (dali_pipes/options.py) against simple-parsing and tyro (issue 36,
after jsonargparse: bench_cli_library.py), whole command start and the parser alone, the cases alternated.

    PYTHONPATH=.:/path/to/the/libraries python benchmarks/results/cpu2-2026-11-27/bench_cli_tyro_simple_parsing.py [N]
    ... bench_cli_tyro_simple_parsing.py show CASE ARGS...   # one case's parse of ARGS (or its --help), printed

Each child imports train.train (torch, DALI: what `python -m train` imports before it parses), then imports the
argument library, builds the parser with every flag and parses a typical command line (or --help); it prints the
seconds of the library's import + building + parsing; the parent times the whole child. Both libraries get the same
flags: the three dataclasses' fields with the help, choices, aliases and parsers options.py gives them (simple-parsing:
its `field(...)`, which passes argparse keywords through; tyro: `Annotated[..., tyro.conf.arg(help, aliases)]`, a
PrimitiveConstructorSpec for auto_or_count and the other parsers, Literal for choices), and the loop's own flags
copied from today's parser (simple-parsing: added to its argparse parser; tyro: a fourth dataclass).
"""

import contextlib
import dataclasses
import io
import statistics
import subprocess
import sys
import time
from typing import Annotated, Any, Literal

ARGV = "--data /d/train --epochs 3 --batch-size 64 --num-threads 2 --image-size 160 --workdir runs/x --skip-bad"


def _configs():
    from dali_pipes import AugmentConfig, LoaderConfig, SourceConfig
    return LoaderConfig, AugmentConfig, SourceConfig


def _loop_actions():
    from train.train import get_args_parser
    fields = {f.name for cls in _configs() for f in dataclasses.fields(cls)}
    return [a for a in get_args_parser()._actions
            if a.option_strings and a.dest not in fields and a.dest not in ("help", "config")]


def _remade(cls, field_for, module: str = __name__) -> type:
    fields = [field_for(f) for f in dataclasses.fields(cls) if "help" in f.metadata]
    new = dataclasses.make_dataclass(cls.__name__, fields, frozen=True)
    new.__module__ = module  # where its annotations are resolved
    return new


def hand_written(argv):
    from train.train import get_args_parser
    return get_args_parser().parse_args(argv)


def with_simple_parsing(argv):
    import simple_parsing as sp

    def field_for(f):
        m, kw = f.metadata, {}
        if m["choices"]:
            kw["choices"] = list(m["choices"])
        if m["type"] and m["type"] is not bool:
            kw["type"] = m["type"]
        if isinstance(f.default, tuple):
            kw.update(nargs=len(f.default), type=type(f.default[0]))
        return f.name, f.type, sp.field(default=f.default, alias=list(m["aliases"]) or None, help=m["help"], **kw)

    parser = sp.ArgumentParser(prog="python -m train", add_option_string_dash_variants=sp.DashVariant.DASH,
                               add_config_path_arg=True, allow_abbrev=False)
    for action in _loop_actions():
        kind = {"action": type(action)} if action.nargs == 0 else {"type": action.type, "choices": action.choices}
        parser.add_argument(*action.option_strings, dest=action.dest, default=action.default, help=action.help, **kind)
    for cls in _configs():
        # the project's annotations are strings, resolved in the class's own module
        parser.add_arguments(_remade(cls, field_for, cls.__module__), dest=cls.__name__)
    return parser.parse_args(argv)


def with_tyro(argv):
    import tyro
    from tyro.constructors import PrimitiveConstructorSpec

    def parsed_by(parse):
        return PrimitiveConstructorSpec(nargs=1, metavar=getattr(parse, "__name__", "value").upper(),
                                        instance_from_str=lambda a: parse(a[0]), is_instance=lambda x: True,
                                        str_from_instance=lambda x: [str(x)])

    def annotated(default, help, aliases=(), choices=None, parse=None):
        if isinstance(default, bool) or parse is bool:
            kind: Any = bool if default is not None else bool | None
        elif isinstance(default, tuple):
            kind = tuple[(type(default[0]),) * len(default)]
        elif choices:
            kind = Literal[tuple(choices)]
        elif parse:
            kind = Annotated[Any, parsed_by(parse)]
        else:
            kind = type(default)
        return Annotated[kind, tyro.conf.arg(help=help, aliases=tuple(aliases) or None)]

    def field_for(f):
        m = f.metadata
        return f.name, annotated(f.default, m["help"], m["aliases"], m["choices"], m["type"]), \
            dataclasses.field(default=f.default)

    loop = dataclasses.make_dataclass("Loop", [
        (a.dest, annotated(a.default, a.help or "", choices=a.choices, parse=bool if a.nargs == 0 else a.type),
         dataclasses.field(default=a.default)) for a in _loop_actions()])
    loop.__module__ = __name__
    parts = [("loop", loop)] + [(cls.__name__, _remade(cls, field_for)) for cls in _configs()]
    every = dataclasses.make_dataclass("Every", [(name, Annotated[cls, tyro.conf.OmitArgPrefixes],
                                                  dataclasses.field(default_factory=cls)) for name, cls in parts])
    every.__module__ = __name__
    globals().update({cls.__name__: cls for _, cls in parts} | {"Every": every})
    return tyro.cli(every, args=argv, prog="python -m train")


CASES = {"hand-written": hand_written, "simple-parsing": with_simple_parsing, "tyro": with_tyro}


def child(case: str, help_: bool) -> None:
    import train.train  # noqa: F401  # what python -m train imports before it parses: not the library's part
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        CASES[case](["--help"] if help_ else ARGV.split())
    print(time.perf_counter() - start)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    cases = [(case, what) for what in ("parse", "help") for case in CASES]
    whole: dict = {c: [] for c in cases}
    parser_s: dict = {c: [] for c in cases}
    for r in range(rounds):
        for case, what in cases[r % len(cases):] + cases[:r % len(cases)]:  # rotated: load falls on every case alike
            start = time.perf_counter()
            out = subprocess.run([sys.executable, __file__, "child", case, what], capture_output=True, text=True,
                                 check=True).stdout
            whole[(case, what)].append(time.perf_counter() - start)
            parser_s[(case, what)].append(float(out.split()[-1]))
    for (case, what) in cases:
        for name, values in (("whole command s", whole), ("parser alone ms", parser_s)):
            v = values[(case, what)]
            scale = 1e3 if name.startswith("parser") else 1
            print(f"{case:14} {what:5} {name}: median {statistics.median(v) * scale:.3g} [min {min(v) * scale:.3g} "
                  f"max {max(v) * scale:.3g}] raw {' '.join(f'{x * scale:.3g}' for x in v)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2], sys.argv[3] == "help")
    elif sys.argv[1:2] == ["show"]:
        print(CASES[sys.argv[2]](sys.argv[3:]))
    else:
        main()
