"""scripts/*.py are thin wrappers over the `dali-pipes` command: each passes its arguments to the
right subcommand (run here in-process, as `python scripts/NAME ARGS` would), and errors stay one line."""

import glob
import json
import os
import runpy
import subprocess
import sys

import pytest

from dali_pipes import open_source

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def script(monkeypatch, capsys):
    def run(name, *args):
        """stdout of `python scripts/NAME ARGS`, run in this process; fails on a non-zero exit."""
        monkeypatch.setattr(sys, "argv", [f"scripts/{name}", *map(str, args)])
        with pytest.raises(SystemExit) as exit:
            runpy.run_path(os.path.join(ROOT, "scripts", name), run_name="__main__")
        out = capsys.readouterr()
        assert exit.value.code == 0, out.err
        return out.out
    return run


def test_make_convert_index_verify(tmp_path, script):
    out = script("make_sample_dataset.py", tmp_path / "d", "--classes", 2, "--train-per-class", 3,
                 "--val-per-class", 1, "--seed", 3)
    assert "6 train + 2 val images in 2 classes" in out
    out = script("to_tfrecord.py", tmp_path / "d" / "train", tmp_path / "tfr", "--shards", 2)
    assert "6 samples -> 2 shards" in out and "MB/s" in out
    assert sorted(os.listdir(tmp_path / "tfr")) == [
        "classes.json", "manifest.json", "train-00000-of-00002.tfrecord", "train-00000-of-00002.tfrecord.idx",
        "train-00001-of-00002.tfrecord", "train-00001-of-00002.tfrecord.idx"]
    assert json.load(open(tmp_path / "tfr" / "classes.json"))["classes"] == ["0000_astronaut", "0001_chelsea"]
    out = script("to_webdataset.py", tmp_path / "d" / "train", tmp_path / "wds", "--shards", 3, "--prefix", "val")
    assert "6 samples -> 3 shards" in out and len(glob.glob(f"{tmp_path}/wds/val-*-of-00003.tar")) == 3
    for idx in glob.glob(f"{tmp_path}/tfr/*.idx"):
        os.remove(idx)
    out = script("make_index.py", f"{tmp_path}/tfr/train-*-of-*")
    assert out.count("3 samples, index") == 2
    assert "6 samples checked, 0 problems" in script("verify_dataset.py", tmp_path / "wds")
    assert open_source(str(tmp_path / "tfr")).num_samples == 6


def test_decompress_flag_is_the_decompress_subcommand(tmp_path, script):
    out = script("to_tfrecord.py", os.path.join(ROOT, "tests", "data", "tf_written_gz"), tmp_path / "plain",
                 "--decompress", "--workers", 1)
    assert "samples ->" in out and open_source(str(tmp_path / "plain")).kind == "tfrecord"


def test_errors_are_one_line_not_tracebacks(tmp_path):
    result = subprocess.run([sys.executable, "scripts/to_tfrecord.py", str(tmp_path / "nope"), str(tmp_path / "o")],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"error: {tmp_path}/nope: no such file or directory"
