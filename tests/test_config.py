"""config.py: one config path, dataclass fields that are flags with their defaults and reasons."""

import argparse
import json
from dataclasses import dataclass

import pytest

from dali_pipes.config import LoaderConfig
from dali_pipes.options import CommandParser, add_arguments, add_config_file, count_or_fraction, from_args, option


@dataclass(frozen=True)
class Example:
    size: int = option(224, "output side")
    pair: tuple[float, float] = option((0.5, 1.0), "low high")
    name: str | None = option(None, "optional", type=str)
    on: bool = option(False, "a switch")


def test_fields_become_flags_and_come_back():
    parser = argparse.ArgumentParser()
    add_arguments(parser, Example, "example")
    args = parser.parse_args(["--size", "128", "--pair", "0.1", "0.9", "--name", "x", "--on"])
    assert from_args(Example, args) == Example(128, (0.1, 0.9), "x", True)
    assert from_args(Example, parser.parse_args([])) == Example()
    assert "output side (default: 224)" in parser.format_help()


def test_counts_and_fractions():
    assert count_or_fraction("12") == 12 and count_or_fraction("0.01") == 0.01
    with pytest.raises(argparse.ArgumentTypeError):
        count_or_fraction("1.5")


def test_every_loader_field_has_a_reason():
    parser = argparse.ArgumentParser()
    add_arguments(parser, LoaderConfig, "loader")
    assert "--num-threads" in parser.format_help() and "--remote-feed" in parser.format_help()


def _configured():
    parser = CommandParser(prog="cmd")
    parser.add_argument("--epochs", type=int, default=90, help="passes")
    parser.add_argument("--loader", choices=["dali", "torch"], default="dali", help="which")
    parser.add_argument("--resume", action="store_true", help="go on")
    add_config_file(parser)
    add_arguments(parser, Example, "example")
    return parser


def test_a_config_file_gives_the_flags_values_and_the_command_line_overrides_it(tmp_path):
    """Issue 36: no config file. --config FILE (JSON or YAML) sets flags by their dest names (dashes too); flags
    given on the command line win, wherever they stand."""
    (tmp_path / "c.json").write_text(json.dumps({"epochs": 3, "loader": "torch", "pair": [0.2, 0.8], "name": None,
                                                 "on": True, "resume": True}))
    (tmp_path / "c.yaml").write_text("epochs: 3\nloader: torch\npair: [0.2, 0.8]\nname: null\n'on': true\n"
                                     "resume: true\n")
    for name in ("c.json", "c.yaml"):
        args = _configured().parse_args(["--config", str(tmp_path / name)])
        assert (args.epochs, args.loader, args.pair, args.name, args.on, args.resume) == (
            3, "torch", [0.2, 0.8], None, True, True), name
    (tmp_path / "d.yml").write_text("size: 96\nname: x\n")
    args = _configured().parse_args(["--size", "64", "--config", str(tmp_path / "d.yml"), "--no-on"])
    assert (args.size, args.name, args.on, args.epochs) == (64, "x", False, 90)


@pytest.mark.parametrize("text,error", [
    ('{"epoch": 3}', "c.json: unknown key 'epoch'. Did you mean epochs?"),
    ('{"loader": "dolly"}', "c.json: argument --loader: invalid choice: 'dolly'"),
    ('{"size": "big"}', "c.json: argument --size: invalid int value: 'big'"),
    ('{"resume": "yes"}', "c.json: resume: expected true or false, got 'yes'"),
    ('{"config": "other.json"}', "c.json: config: a config file cannot name another"),
    ('[1, 2]', "c.json: expected a mapping of flag names to values, got a list"),
    ('{"epochs": 3,}', "c.json: not valid JSON: "),
])
def test_a_config_file_with_an_unknown_key_or_a_bad_value_is_refused_naming_both(tmp_path, capsys, text, error):
    (tmp_path / "c.json").write_text(text)
    with pytest.raises(SystemExit) as ended:
        _configured().parse_args(["--config", str(tmp_path / "c.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 1 and err[0].startswith("usage: cmd ")
    assert err[-1].startswith(f"cmd: error: {tmp_path / error}"), err[-1]


def test_a_missing_config_file_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as ended:
        _configured().parse_args(["--config", str(tmp_path / "none.yaml")])
    assert ended.value.code == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == f"cmd: error: --config {tmp_path}/none.yaml: no such file"


def _help_texts(parser: argparse.ArgumentParser):
    """The parser's --help and its subcommands', all the way down."""
    yield parser.prog, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _help_texts(sub)


def test_help_texts_hold_no_measured_figures():
    """Ratios and throughputs go stale and differ per machine: they live on docs/benchmarks.md, dated."""
    import re

    from dali_pipes.tools.cli import build_parser
    from train.train import get_args_parser
    measured = re.compile(r"\b\d+(\.\d+)?(-\d+(\.\d+)?)?x\b|\d[\d,.]*\s*(images|img)/s")
    found = [(prog, m.group(0)) for parser in (build_parser(), get_args_parser())
             for prog, text in _help_texts(parser) for m in measured.finditer(" ".join(text.split()))]
    assert not found, found


def test_the_store_settings_have_store_neutral_names_and_the_s3_ones_warn_for_a_release(tmp_path, jpeg_folder):
    """storage_attempts / storage_timeout apply to every scheme; s3_attempts / s3_timeout (until 0.3) still work,
    as keywords, LoaderConfig fields, flags and config-file keys (a run's args.json), each warned of by name."""
    from dali_pipes import DaliLoader

    def warned(seen, *texts):  # every text warned of, each once
        assert sorted(str(w.message).split(" (")[0] for w in seen) == sorted(texts), [str(w.message) for w in seen]
    with pytest.warns(DeprecationWarning) as seen, pytest.raises(ValueError, match="got 0 and"):
        DaliLoader(str(jpeg_folder), batch_size=2, device="cpu", s3_attempts=0)  # the old name's value is used
    warned(seen, "s3_attempts is now storage_attempts")
    with pytest.warns(DeprecationWarning) as seen:
        assert LoaderConfig(s3_attempts=3, s3_timeout=4.0) == LoaderConfig(storage_attempts=3, storage_timeout=4.0)
    warned(seen, "s3_attempts is now storage_attempts", "s3_timeout is now storage_timeout")
    parser = CommandParser(prog="cmd")
    add_config_file(parser)
    add_arguments(parser, LoaderConfig, "loader")
    assert "--storage-attempts" in parser.format_help() and "--s3-attempts" not in parser.format_help()
    with pytest.warns(DeprecationWarning) as seen:
        args = parser.parse_args(["--s3-attempts", "3", "--s3-timeout=4"])
    warned(seen, "--s3-attempts is now --storage-attempts", "--s3-timeout is now --storage-timeout")
    assert from_args(LoaderConfig, args) == LoaderConfig(storage_attempts=3, storage_timeout=4.0)
    (tmp_path / "args.json").write_text(json.dumps({"s3_attempts": 5, "s3_timeout": 6}))
    with pytest.warns(DeprecationWarning) as seen:
        args = parser.parse_args(["--config", str(tmp_path / "args.json")])
    warned(seen, *(f"{tmp_path}/args.json: s3_{name} is now storage_{name}" for name in ("attempts", "timeout")))
    assert (args.storage_attempts, args.storage_timeout) == (5, 6.0)


def test_the_0_2_import_paths_are_gone():
    """0.4 retires 0.2's module paths (dali_pipes.tuning, ...), object_store.py's re-exports of remote.py's names and
    the flag machinery's names in config.py: each name has one home."""
    import importlib

    from dali_pipes import config
    from dali_pipes.storage import object_store
    for old in ("dali_pipes.tuning", "dali_pipes.convert", "dali_pipes.object_store", "dali_pipes.samples"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    assert not hasattr(object_store, "list_objects") and not hasattr(object_store, "UnreachableError")
    assert not hasattr(config, "add_arguments") and not hasattr(config, "from_args")
