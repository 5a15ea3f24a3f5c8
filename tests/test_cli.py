"""The `dali-pipes` command as a user gets it from `pip install .`: built into a wheel, installed
into a prefix of its own, run from a folder outside the repository. Also: the library and the
training loop never import the benchmarks, and every loader option is a benchmark flag
(tests/test_soak.py runs `python -m dali_pipes bench soak`)."""

import argparse
import ast
import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from dali_pipes import AugmentConfig, LoaderConfig, SourceConfig
from dali_pipes.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dali_pipes", "dali_pipes_bench", "train")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder, environment) of dali_pipes installed from a wheel into a fresh prefix; the
    environment puts that prefix, not the clone, on the path."""
    tmp = tmp_path_factory.mktemp("installed")
    src = tmp / "src"  # a copy, so the build writes nothing into the clone
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(tmp / "wheels")],
                   check=True, capture_output=True, timeout=300)
    [wheel] = (tmp / "wheels").glob("dali_pipes-*.whl")
    prefix = tmp / "prefix"
    # --ignore-installed: else pip uninstalls the dali_pipes of the running environment (the clone's)
    subprocess.run([*pip, "install", "--no-deps", "--ignore-installed", "--no-warn-script-location",
                    "--prefix", str(prefix), str(wheel)], check=True, capture_output=True, timeout=300)
    site = sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)})
    env = {**os.environ, "PYTHONPATH": site}
    return prefix / "bin", env


def run(installed, work, *args, ok=True):
    bin_dir, env = installed
    result = subprocess.run([str(bin_dir / "dali-pipes"), *map(str, args)], cwd=work, env=env,
                            capture_output=True, text=True, timeout=300)
    if ok:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_the_wheel_installs_no_top_level_train_package(installed):
    _, env = installed
    site = env["PYTHONPATH"]
    assert os.path.isdir(os.path.join(site, "dali_pipes")) and not os.path.exists(os.path.join(site, "train"))


def test_installed_command_works_outside_the_repository(installed, tmp_path):
    bin_dir, env = installed
    where = subprocess.run([sys.executable, "-c", "import dali_pipes, dali_pipes_bench; "
                            "print(dali_pipes.__file__); print(dali_pipes_bench.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(path.startswith(str(bin_dir.parent)) for path in where), where  # the prefix, not the clone
    assert "sample" in run(installed, tmp_path, "--help").stdout

    assert "6 train + 2 val images in 2 classes" in run(installed, tmp_path, "sample", "d", "--classes", 2,
                                                        "--train-per-class", 3, "--val-per-class", 1).stdout
    assert "6 samples -> 2 shards" in run(installed, tmp_path, "convert", "tfrecord", "d/train", "tfr",
                                          "--shards", 2).stdout
    for idx in (tmp_path / "tfr").glob("*.idx"):
        idx.unlink()
    assert run(installed, tmp_path, "index", "tfr").stdout.count("3 samples, index") == 2
    assert "6 samples checked, 0 problems" in run(installed, tmp_path, "verify", "tfr").stdout

    error = run(installed, tmp_path, "verify", "nope", ok=False)
    assert (error.returncode, error.stderr.strip()) == (1, "error: nope: no such file or directory")


def test_python_m_dali_pipes_is_the_same_command(tmp_path):
    result = subprocess.run([sys.executable, "-m", "dali_pipes", "--help"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "usage: dali-pipes" in result.stdout
    for command in ("sample", "convert", "index", "verify", "bench", "doctor"):
        assert f"    {command} " in result.stdout


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_library_and_training_loop_never_import_the_benchmarks():
    files = [p for package in ("dali_pipes", "train") for p in (ROOT / package).rglob("*.py")]
    offenders = [str(p.relative_to(ROOT)) for p in files
                 if any(name.split(".")[0] == "dali_pipes_bench" for name in _imported_modules(p))]
    assert len(files) > 10 and offenders == []


@pytest.mark.parametrize("benchmark", ["loaders", "training", "soak", "formats"])
def test_every_loader_option_is_a_benchmark_flag(benchmark):
    """Each benchmark that builds a DaliLoader takes every augmentation and loader field as a flag,
    except those its cases set themselves."""
    module = importlib.import_module(f"dali_pipes_bench.{benchmark}")
    args = vars(module.parse_args([]))
    set_by_cases = {"loaders": {"device", "num_threads"}, "training": {"device"}}.get(benchmark, set())
    expected = {f.name for cls in (AugmentConfig, LoaderConfig) for f in dataclasses.fields(cls)} - set_by_cases
    if benchmark != "formats":  # formats reads the data it makes itself
        expected |= {f.name for f in dataclasses.fields(SourceConfig)}
    assert expected <= set(args), expected - set(args)


def test_missing_extra_is_one_line_naming_it(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "skimage" else find_spec(name, *a))
    with pytest.raises(SystemExit) as exit:
        main(["sample", str(tmp_path / "d"), "--classes", "1"])
    assert str(exit.value.code).startswith("error: skimage is not installed")
    assert "pip install '.[sample]' (from the dali_pipes checkout)" in str(exit.value.code)
    assert not (tmp_path / "d").exists()  # checked before anything is written


def test_doctor_runs_or_says_it_is_missing(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["doctor", "--help"])
    if importlib.util.find_spec("dali_pipes.tools.doctor") is None:
        assert "has no dali_pipes/tools/doctor.py" in str(exit.value.code)
    else:
        assert exit.value.code == 0 and "usage:" in capsys.readouterr().out


def _parsers(parser):
    """A parser and every subcommand parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases name one parser twice
                yield from _parsers(sub)


@pytest.mark.parametrize("argv,usage,guess", [
    (["convert", "tfrecord", "a", "b", "--shard", "2"], "dali-pipes convert tfrecord",
     "--shard 2. Did you mean --shards?"),
    (["verify", "d", "--max-pixel", "9"], "dali-pipes verify", "--max-pixel 9. Did you mean --max-pixels?"),
    (["doctor", "--quik"], "python -m dali_pipes.tools.doctor", "--quik. Did you mean --quick?"),
])
def test_a_mistyped_or_abbreviated_flag_ends_with_the_subcommands_usage_a_guess_and_exit_1(capsys, argv, usage, guess):
    """Issue 32: `--shard 2` (for --shards) was accepted as an abbreviation; a mistyped flag exited 2 after the
    top-level usage. Now: exit 1 (as docs/data.md promises for bad input), the subcommand's own usage, a guess."""
    with pytest.raises(SystemExit) as ended:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 1 and err[0].startswith(f"usage: {usage} ")
    assert err[-1] == f"{usage}: error: unrecognized arguments: {guess}"


def test_python_m_train_refuses_an_abbreviated_flag_the_same_way(capsys):
    from train.train import get_args_parser
    with pytest.raises(SystemExit) as ended:
        get_args_parser().parse_args(["--epoch", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 1 and err[0].startswith("usage: python -m train ")
    assert err[-1] == "python -m train: error: unrecognized arguments: --epoch 1. Did you mean --epochs?"


def test_every_flag_of_every_command_shows_its_default_in_help():
    """Issue 32: `python -m train --help` showed no default for --epochs, --batch-size, --arch, --lr, --workdir."""
    from dali_pipes.tools import doctor
    from dali_pipes.tools.cli import build_parser
    from train.train import get_args_parser
    missing = []
    for top in (build_parser(), get_args_parser(), doctor.build_parser()):
        for parser in _parsers(top):
            formatter = parser._get_formatter()
            for action in parser._actions:
                if action.option_strings and action.help is not argparse.SUPPRESS and not isinstance(
                        action, (argparse._HelpAction, argparse._VersionAction)):
                    text = formatter._expand_help(action) if action.help else ""
                    if "default" not in text.lower():
                        missing.append(f"{parser.prog} {action.option_strings[0]}")
    assert missing == []
    help_text = get_args_parser().format_help()
    for shown in ("passes over the train data (default: 90)", "per rank (default: 256)", "(default: resnet50)",
                  "(default: runs/latest)", "default: 0.1 x global batch / 256"):
        assert shown in " ".join(help_text.split()), shown


def test_python_m_train_flags_come_back_from_args_json_given_as_config(tmp_path):
    """Issue 36: args.json could not be given back. Every flag's value, parsed (an --image-size schedule, a size
    hint, a pair, "auto", None), comes back from `--config args.json` as the command line gave it."""
    import json

    from train.run import replayable_args
    from train.train import get_args_parser, loader_configs
    argv = ["--data", "-odd name", "--image-size", "0:160,10:192", "--decoder-size-hint", "100x200", "--max-bad",
            "0.01", "--no-amp", "--channels-last", "--png16", "pil", "--hw-decoder-load", "auto", "--mean", "0.1",
            "0.2", "0.3", "--augmix-depth", "-1", "--num-threads", "3", "--device", "cpu", "--record-labels",
            "--auto-augment", "augmix", "--compile"]
    args = get_args_parser().parse_args(argv)
    (tmp_path / "args.json").write_text(json.dumps(replayable_args(args)))
    again = get_args_parser().parse_args(["--config", str(tmp_path / "args.json")])
    assert json.dumps(replayable_args(again)) == json.dumps(replayable_args(args))
    assert loader_configs(again) == loader_configs(args)
    assert (again.image_size, again.decoder_size_hint, again.data) == ({0: 160, 10: 192}, (100, 200), "-odd name")
