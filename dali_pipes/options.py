"""Options: dataclass fields that are also command-line flags, for the training loop, the benchmarks and
the `dali-pipes` command alike (config.py declares the loader's).

A field declared with `option(default, "why")` becomes `--field-name` with that default and help;
`from_args(cls, args)` builds the dataclass back from the parsed flags, and `asdict` of it is what a
run saves. This module imports nothing of the project's, so any module can declare options here.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import sys
from typing import Any, Callable, NoReturn, Sequence


def option(default: Any, help: str, *, type: Callable | None = None, choices: Sequence | None = None,
           aliases: Sequence[str] = ()) -> Any:
    """A dataclass field that is also a command-line flag. `type` is needed only when the default is
    None (the flag's type cannot be read from it); `aliases` are extra flag spellings."""
    return dataclasses.field(default=default, metadata={"help": help, "type": type, "choices": choices,
                                                        "aliases": tuple(aliases)})


class _DefaultsShown(argparse.HelpFormatter):
    """Every flag's help ends with its default, unless the help already says it (the generated options and
    flags whose default is a rule, "default: all cores", say their own)."""
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.default is argparse.SUPPRESS or "default" in text.lower()
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return text
        shown = _default_text(action.default).replace("%", "%%")  # argparse %-formats the help
        return f"{text} (default: {shown})".lstrip()


def _default_text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None or value == "" else _show(value)


class DefaultsFormatter(_DefaultsShown, argparse.HelpFormatter):
    pass


class RawDefaultsFormatter(_DefaultsShown, argparse.RawDescriptionHelpFormatter):
    pass


class CommandParser(argparse.ArgumentParser):
    """The project's commands' parser: no abbreviations (--shard is not --shards), every default in --help,
    and bad flags end with the failing (sub)command's own usage, a "did you mean", and exit status 1 (as
    every other bad input does). Subcommands made with add_subparsers are CommandParsers too."""
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        # a subcommand's parser is asked for known args by its parent: refusing the rest here shows its usage
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._did_you_mean(extras)}")
        return parsed, extras

    def _did_you_mean(self, extras: list[str]) -> str:
        for extra in extras:
            if extra.startswith("--"):
                close = difflib.get_close_matches(extra.split("=")[0], list(self._option_string_actions), n=1)
                if close:
                    return f". Did you mean {close[0]}?"
        return ""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _none_or(kind: Callable) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.lower() in ("none", "") else kind(text)
    parse.__name__ = getattr(kind, "__name__", "value")  # argparse names the type in its errors
    return parse


def count_or_fraction(text: str) -> int | float:
    """"12" -> 12 (a count), "0.01" -> 0.01 (a fraction)."""
    try:
        return int(text)
    except ValueError:
        value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected a count (int) or a fraction in (0, 1)")
    return value


def auto_or_count(text: str) -> int | str:
    """"auto" (the loader tunes it: tuning.py) or a count of at least 1."""
    if str(text).lower() == "auto":
        return "auto"
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected 'auto' or a count of at least 1")
    return value


def auto_or_fraction(text: str) -> float | str:
    """"auto" (the loader tunes it: tuning.py) or a number in [0, 1] (hw_decoder_load)."""
    if str(text).lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text}: expected 'auto' or a number in [0, 1]")
    return value


def add_arguments(parser: argparse.ArgumentParser, cls: type, title: str, skip: Sequence[str] = (),
                  defaults: dict | None = None) -> None:
    """One flag per option field of `cls`, in an argument group; `defaults` overrides a field's default."""
    group = parser.add_argument_group(title)
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        default = (defaults or {}).get(f.name, f.default)
        meta = f.metadata
        kind: dict[str, Any] = {}
        if isinstance(f.default, bool) or meta["type"] is bool:  # bool | None: --x, --no-x, or neither (None)
            kind["action"] = argparse.BooleanOptionalAction
        elif isinstance(f.default, tuple):
            kind.update(nargs=len(f.default), type=type(f.default[0]))
        else:
            base = meta["type"] or type(f.default)
            kind["type"] = _none_or(base) if f.default is None else base
        if meta["choices"]:
            kind["choices"] = list(meta["choices"])
        shown = "" if "default:" in meta["help"] else f" (default: {_show(default)})"  # some explain theirs
        group.add_argument(flag_name(f.name), *meta["aliases"], dest=f.name, default=default,
                           help=meta["help"] + shown, **kind)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


def from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """The dataclass `cls` from parsed flags (fields without a flag keep their defaults)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**{**values, **overrides})
