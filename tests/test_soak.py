"""A CI-sized soak: several epochs on CPU, memory measured per epoch, growth after the second
epoch under 5% (`dali-pipes bench soak` runs the long version)."""

import json
import os
import subprocess
import sys

from dali_pipes.tools.sample_data import SampleDatasetConfig, make_sample_dataset


def test_soak_ci_sized(tmp_path):
    """Realistic JPEGs (the built-in generator), since decoded-image buffers are what fragments."""
    make_sample_dataset(str(tmp_path / "d"), SampleDatasetConfig(classes=3, train_per_class=30, val_per_class=0),
                        progress=False)
    run = subprocess.run([sys.executable, "-m", "dali_pipes", "bench", "soak", "--data", str(tmp_path / "d" / "train"),
                          "--epochs", "8", "--device", "cpu", "--batch-size", "8", "--image-size", "160",
                          "--num-threads", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "DALI_PIPES_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # issue 36: a table of the epochs and the verdict on stdout, not JSON lines; they go to the results file
    assert not [line for line in run.stdout.splitlines() if line.startswith("{")], run.stdout
    assert "| 7 | 88 |" in run.stdout and "memory growth after epoch 2: host" in run.stdout
    *_, last = run.stdout.strip().splitlines()
    path = last.removeprefix("results in ")
    assert path.startswith(str(tmp_path / "cache" / "bench" / "soak-")) and path.endswith("soak.jsonl")
    *records, verdict = [json.loads(line) for line in open(path)]
    assert [r["samples"] for r in records] == [88] * 8  # 90 // 8 batches of 8, every epoch
    assert verdict["ok"] and verdict["growth_after_epoch_2"]["host_mb"] < 0.05
    assert verdict["configs"]["loader"]["device"] == "cpu" and verdict["configs"]["augment"]["image_size"] == 160
