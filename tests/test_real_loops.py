"""Validation loops shaped like real scripts' (tests/val_loop_job.py), 2 ranks under torchrun (gloo, CPU),
with a val count that is not a multiple of the batch and one small against world_size x batch: no crash,
no nan, equal batch counts, and the counts and top-1 the data says (the oracle is right on even labels)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from conftest import write_folder

JOB = os.path.join(os.path.dirname(__file__), "val_loop_job.py")
_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "TORCHELASTIC_RUN_ID")
SETS = {"65 at batch 32": ((20, 21, 24), 32), "5 at batch 4": ((2, 1, 2), 4)}


@pytest.fixture(scope="module", params=list(SETS))
def val_set(request, tmp_path_factory):
    counts, batch = SETS[request.param]
    root = tmp_path_factory.mktemp("val") / "images"
    write_folder(str(root), counts=counts)
    return str(root), counts, batch


def run_job(folder: str, out, loop: str, batch: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", JOB, folder,
           str(out), "--loop", loop, "--batch", str(batch)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "result.json") as f:
        return json.load(f)


@pytest.mark.parametrize("loop", ["per_batch", "at_end", "examples"])
def test_validation_loop_counts_exactly_without_nan(val_set, loop, tmp_path, torchvision):
    folder, counts, batch = val_set
    n, even = sum(counts), counts[0] + counts[2]
    result = run_job(folder, tmp_path, loop, batch)
    assert result["finite"] and len(set(result["batches"])) == 1 or loop == "at_end"
    if loop == "per_batch":  # DistributedSampler's count per rank, repeats included
        assert result["count"] == math.ceil(n / 2) and 0 <= result["top1"] <= 100
        assert result["batches"] == [math.ceil(math.ceil(n / 2) / batch)] * 2
    else:  # every sample exactly once
        assert result["count"] == n
        assert result["top1"] == pytest.approx(100 * even / n)


@pytest.mark.parametrize("form", ["location", "dataset"])
def test_lightning_module_logging_with_sync_dist(val_set, tmp_path, form, torchvision):
    pytest.importorskip("lightning", reason="Lightning is an optional extra: pip install dali_pipes[lightning]")
    folder, counts, batch = val_set
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env.update(PYTHONPATH=os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p), MASTER_ADDR="127.0.0.1")
    job = os.path.join(os.path.dirname(__file__), "lightning_sync_job.py")
    done = subprocess.run([sys.executable, job, folder, str(tmp_path), str(batch), form], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    with open(tmp_path / "metrics.json") as f:
        metrics = json.load(f)
    assert all(math.isfinite(metrics[k]) for k in ("val_loss", "val_acc"))
    assert metrics["val_count"] == 2 * math.ceil(sum(counts) / 2)  # DistributedSampler's count: sharded
