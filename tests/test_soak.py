"""A CI-sized soak: several epochs on CPU, memory measured per epoch, growth after the second
epoch under 5% (scripts/soak.py runs the long version)."""

import json
import os
import subprocess
import sys

from dali_pipes.sample_data import SampleDatasetConfig, make_sample_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_soak_ci_sized(tmp_path):
    """Realistic JPEGs (the built-in generator), since decoded-image buffers are what fragments."""
    make_sample_dataset(str(tmp_path / "d"), SampleDatasetConfig(classes=3, train_per_class=30, val_per_class=0),
                        progress=False)
    run = subprocess.run([sys.executable, "scripts/soak.py", "--data", str(tmp_path / "d" / "train"), "--epochs", "8",
                          "--device", "cpu", "--batch-size", "8", "--image-size", "160", "--threads", "2",
                          "--out", str(tmp_path / "soak.jsonl")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    records = [json.loads(l) for l in open(tmp_path / "soak.jsonl")]
    assert [r["samples"] for r in records] == [88] * 8  # 90 // 8 batches of 8, every epoch
    verdict = json.loads(run.stdout.strip().splitlines()[-1])
    assert verdict["ok"] and verdict["growth_after_epoch_2"]["host_mb"] < 0.05
