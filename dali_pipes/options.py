"""Options: dataclass fields that are also command-line flags, for the training loop, the benchmarks and
the `dali-pipes` command alike (config.py declares the loader's).

A field declared with `option(default, "why")` becomes `--field-name` with that default and help;
`from_args(cls, args)` builds the dataclass back from the parsed flags, and `asdict` of it is what a
run saves. `add_config_file` gives a CommandParser `--config FILE`: the flags' values from a YAML or JSON file.
This module imports nothing of the project's, so any module can declare options here.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import os
import sys
import warnings
from typing import Any, Callable, NoReturn, Sequence


def option(default: Any, help: str, *, type: Callable | None = None, choices: Sequence | None = None,
           aliases: Sequence[str] = (), renamed_from: str = "") -> Any:
    """A dataclass field that is also a command-line flag. `type` is needed only when the default is
    None (the flag's type cannot be read from it); `aliases` are extra flag spellings; `renamed_from` the field's
    earlier name, still read for a release (as a flag, a config file's key, a keyword: take_renamed) with a
    DeprecationWarning naming the new one."""
    return dataclasses.field(default=default, metadata={"help": help, "type": type, "choices": choices,
                                                        "aliases": tuple(aliases), "renamed_from": renamed_from})


def renamed_fields(cls: type) -> dict[str, str]:
    """{earlier name: name} of `cls`'s option fields declared with renamed_from."""
    return {f.metadata["renamed_from"]: f.name for f in dataclasses.fields(cls) if f.metadata.get("renamed_from")}


def renamed_text(old: str, new: str) -> str:
    return f"{old} is now {new} (the same setting, for every storage scheme); the old name goes in the next release"


def take_renamed(kwargs: dict[str, Any], cls: type, stacklevel: int = 2) -> dict[str, Any]:
    """The values given under `cls`'s earlier field names, popped from `kwargs` and keyed by the new names, each
    warned of (a DeprecationWarning at the caller `stacklevel` frames up)."""
    found = {}
    for old, new in renamed_fields(cls).items():
        if old in kwargs:
            warnings.warn(renamed_text(old, new), DeprecationWarning, stacklevel=stacklevel + 1)
            found[new] = kwargs.pop(old)
    return found


def _warn_user(text: str, where: str) -> None:
    """A DeprecationWarning about the user's own input (a flag, a config file's key), shown as Python shows those of
    a script's own code (attributed to __main__; the default filters hide library-attributed ones)."""
    warnings.warn_explicit(text, DeprecationWarning, filename=where, lineno=0, module="__main__")


class _RenamedFlag(argparse._StoreAction):
    """A flag's earlier spelling: stores into the new one's dest, warns naming the new flag; not in --help."""
    def __init__(self, *args: Any, new_flag: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.new_flag = new_flag

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        _warn_user(renamed_text(str(option_string), self.new_flag), "command line")
        super().__call__(parser, namespace, values, option_string)


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
        self._reading = ""  # the config file whose values are being parsed: errors name it
        self.config_file = False  # add_config_file: --config FILE

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        args = sys.argv[1:] if args is None else list(args)
        path = _config_path(args) if self.config_file else ""
        if path:  # the file's values become the defaults: the command line's flags, wherever they stand, win
            self.set_defaults(**self._config_values(path))
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

    def _config_values(self, path: str) -> dict[str, Any]:
        """The config file's values by dest, each parsed as its flag would be (type, choices, count), so a bad
        one is refused naming the file and the flag; a flag without a value (--resume, --x/--no-x) takes a
        boolean, and any flag null (None) as is."""
        values = _read_config(self, path)
        actions = {a.dest: a for a in self._actions if a.option_strings and a.dest not in ("help", "config")
                   and not isinstance(a, _RenamedFlag)}
        for flag in (a for a in self._actions if isinstance(a, _RenamedFlag)):  # an earlier run's args.json
            old = flag.option_strings[0][2:].replace("-", "_")
            if old in values:
                _warn_user(f"{path}: {renamed_text(old, flag.dest)}", path)
                values.setdefault(flag.dest, values.pop(old))
        tokens, direct = [], {}
        for key, value in values.items():
            action = actions.get(key)
            if key == "config":
                self._config_error(path, "config: a config file cannot name another")
            if action is None:
                close = difflib.get_close_matches(key, list(actions), n=1)
                self._config_error(path, f"unknown key {key!r}{f'. Did you mean {close[0]}?' if close else ''}")
            if action.nargs == 0 and not isinstance(value, bool) and value is not None:
                self._config_error(path, f"{key}: expected true or false, got {value!r}")
            if action.nargs == 0 or value is None:
                direct[key] = value
            elif isinstance(value, list) and action.nargs not in (None, "?"):  # --mean 0.5 0.5 0.5
                tokens += [action.option_strings[0], *map(str, value)]
            else:  # --flag=VALUE: a value that starts with "-" is not read as a flag
                tokens.append(f"{action.option_strings[0]}={_token(value, action)}")
        self._reading = path
        try:
            parsed = vars(self.parse_args(tokens))
        finally:
            self._reading = ""
        return {**{key: parsed[key] for key in values if key not in direct}, **direct}

    def _config_error(self, path: str, message: str) -> NoReturn:
        self._reading = path
        self.error(message)

    def error(self, message: str) -> NoReturn:
        if self._reading:
            message = f"{self._reading}: {message}"
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def add_config_file(parser: CommandParser) -> None:
    """`--config FILE` for a CommandParser: every flag's value from a YAML or JSON mapping, keyed by the flags'
    dest names (num_threads, or num-threads), as a run's saved flags (json.dump of vars(args)) are; the flags
    given on the command line override the file's."""
    parser.add_argument("--config", default="", metavar="FILE", help="flags from a YAML or JSON file: a mapping "
                        "of flag names (batch_size or batch-size) to values, as WORKDIR/args.json holds them; flags on "
                        "the command line override it (default: none)")
    parser.config_file = True


def _config_path(args: list[str]) -> str:
    """The last --config FILE (or --config=FILE) of a command line, or ""."""
    path = ""
    for arg, after in zip(args, args[1:] + [""]):
        if arg == "--config":
            path = after
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
    return path


def _read_config(parser: CommandParser, path: str) -> dict[str, Any]:
    """The mapping in a JSON file (.json) or a YAML one (any other name), its keys with dashes as underscores."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        parser.error(f"--config {path}: no such file")
    except OSError as error:
        parser.error(f"--config {path}: {error.strerror}")
    if os.path.splitext(path)[1].lower() == ".json":
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            parser._config_error(path, f"not valid JSON: {error}")
    else:
        try:
            import yaml
        except ImportError:
            parser._config_error(path, "reading YAML needs PyYAML: pip install pyyaml (or give a .json file)")
        try:
            values = yaml.safe_load(text)
        except yaml.YAMLError as error:
            parser._config_error(path, f"not valid YAML: {' '.join(str(error).split())}")
    if not isinstance(values, dict):
        parser._config_error(path, f"expected a mapping of flag names to values, got a {type(values).__name__}")
    return {str(key).replace("-", "_"): value for key, value in values.items()}


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _none_or(kind: Callable) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.lower() in ("none", "") else kind(text)
    parse.__name__ = getattr(kind, "__name__", "value")  # argparse names the type in its errors
    parse.__wrapped__ = kind  # type: ignore[attr-defined]  # flag_text finds kind's inverse through it
    return parse


_TEXTS: dict[Any, Callable[[Any], str]] = {}  # flag type -> its inverse: a parsed value as the flag's text


def written_as(parse: Callable, text: Callable[[Any], str]) -> None:
    """Declares `text` the inverse of the flag type `parse` (parse(text(value)) == value), for a value that a config
    file holds parsed (args.json: an --image-size schedule as a mapping, a size hint as a pair); str() otherwise."""
    _TEXTS[parse] = text


def _token(value: Any, action: argparse.Action) -> str:
    """A config file's value as its flag's command-line text."""
    text = _TEXTS.get(getattr(action.type, "__wrapped__", action.type))
    return text(value) if text is not None and not isinstance(value, str) else str(value)


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
        if meta.get("renamed_from"):
            group.add_argument(flag_name(meta["renamed_from"]), dest=f.name, default=default, help=argparse.SUPPRESS,
                               action=_RenamedFlag, new_flag=flag_name(f.name), **kind)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value)
    return str(value)


def from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """The dataclass `cls` from parsed flags (fields without a flag keep their defaults)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**{**values, **overrides})
