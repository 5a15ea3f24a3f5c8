"""A CI-sized soak: several epochs on CPU, memory measured per epoch, growth after the second
epoch under 5% (`dali-pipes bench soak` runs the long version)."""

import json
import subprocess
import sys

from dali_pipes.tools.sample_data import SampleDatasetConfig, make_sample_dataset


def test_soak_ci_sized(tmp_path):
    """Realistic JPEGs (the built-in generator), since decoded-image buffers are what fragments."""
    make_sample_dataset(str(tmp_path / "d"), SampleDatasetConfig(classes=3, train_per_class=30, val_per_class=0),
                        progress=False)
    run = subprocess.run([sys.executable, "-m", "dali_pipes", "bench", "soak", "--data", str(tmp_path / "d" / "train"),
                          "--epochs", "8", "--device", "cpu", "--batch-size", "8", "--image-size", "160",
                          "--num-threads", "2", "--out", str(tmp_path / "soak.jsonl")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    *records, verdict = [json.loads(line) for line in open(tmp_path / "soak.jsonl")]
    assert [r["samples"] for r in records] == [88] * 8  # 90 // 8 batches of 8, every epoch
    assert verdict == json.loads(run.stdout.strip().splitlines()[-1])
    assert verdict["ok"] and verdict["growth_after_epoch_2"]["host_mb"] < 0.05
    assert verdict["configs"]["loader"]["device"] == "cpu" and verdict["configs"]["augment"]["image_size"] == 160
