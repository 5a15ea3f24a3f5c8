"""The sharding check (sharding.py): 2-rank torchrun jobs (gloo, CPU, real DALI) whose ranks were built
wrongly fail at the end of the first epoch on every rank, naming the mistake; a right one runs on."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from dali_pipes.run import sharding

JOB = os.path.join(os.path.dirname(__file__), "sharding_job.py")
N = 24
_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")




def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([os.path.dirname(JOB), env.get("PYTHONPATH", "")]))
    return env


def _results(out, ranks=2) -> list[dict]:
    return [json.load(open(out / f"rank{r}.json")) for r in range(ranks)]


def run_job(data: str, out, mode: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", JOB, data, str(out),
           mode]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return _results(out)


def test_right_ranks_pass_the_check_and_deliver_disjoint_samples(numbered, tmp_path):
    results = run_job(numbered, tmp_path, "right")
    assert all("error" not in r and len(r["epochs"]) == 2 for r in results)
    for epoch in range(2):
        got = [set(r["epochs"][epoch]) for r in results]
        assert not got[0] & got[1] and len(got[0]) + len(got[1]) == sum(len(r["epochs"][epoch]) for r in results)


@pytest.mark.parametrize("mode", ["all_rank0", "val_all_rank0"])
def test_every_rank_built_with_rank_0_fails_after_the_first_epoch_naming_it(numbered, tmp_path, mode):
    results = run_job(numbered, tmp_path, mode)
    for r in results:
        assert len(r["epochs"]) == 0, "the error comes at the end of the first epoch"
        assert "sharding check" in r["error"] and "every rank was built with rank=0" in r["error"], r["error"]
        assert "ranks 0, 1 all delivered" in r["error"] and "list.txt" in r["error"]


def test_local_rank_passed_as_the_rank_on_two_nodes_is_named(numbered, tmp_path):
    """Two "nodes" of one process each on this machine (rendezvous on 127.0.0.1): LOCAL_RANK is 0 on both."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                               "--node_rank", str(i), "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                               "--rdzv_id", "sharding", JOB, numbered, str(tmp_path), "local_as_rank"],
                              env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for node in nodes:
        _, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-3000:]
    for r in _results(tmp_path):
        assert "LOCAL_RANK" in r["error"] and "built with rank=0" in r["error"], r["error"]


def test_ranks_that_listed_different_objects_are_refused_at_build_within_seconds(tmp_path):
    """Issue 32: an object added between two ranks' listings (no manifest) gave loaders of 15 and 18 batches, and a
    DDP loop hung at the shorter epoch's end until the process group's timeout. Now every rank refuses while the
    loaders are built, naming what differs."""
    from conftest import write_folder
    write_folder(str(tmp_path / "images"))
    (tmp_path / "out").mkdir()
    for r in run_job(str(tmp_path / "images"), tmp_path / "out", "listing"):
        assert "error" in r, "the loaders were built"
        assert r["seconds"] < 30, r
        assert "the ranks opened different data" in r["error"] and "rank 0: 12 files" in r["error"], r["error"]
        assert "rank 1: 13 files" in r["error"] and "only rank 1 lists cat/added.jpg" in r["error"], r["error"]


def _rank(rank, world, local, delivered, host="a", every_sample=True, location="d"):
    return ({"rank": rank, "world_size": world, "local_rank": local, "host": host, "complete": True, "excluded": 0,
             "location": location, "num_samples": len(delivered), "every_sample": every_sample},
            np.array(delivered, bool))


def test_judge_names_overlaps_gaps_and_causes():
    right = [_rank(0, 2, 0, [1, 1, 0, 0]), _rank(1, 2, 1, [0, 0, 1, 1])]
    assert sharding.judge(right, train=True, location="d") == "" == sharding.judge(right, train=False, location="d")
    train_tail_dropped = [_rank(0, 2, 0, [1, 0, 0, 0]), _rank(1, 2, 1, [0, 0, 1, 0])]
    assert sharding.judge(train_tail_dropped, train=True, location="d") == ""
    assert "no rank delivered sample 1" in sharding.judge(train_tail_dropped, train=False, location="d")
    wrong_world = [_rank(0, 4, 0, [1, 0, 0, 0]), _rank(1, 4, 1, [0, 1, 0, 0])]
    assert "world_size [4]" in sharding.judge(wrong_world, train=False, location="d")
    incomplete = [_rank(0, 2, 0, [1, 1, 0, 0]), _rank(0, 2, 0, [1, 1, 0, 0])]
    incomplete[0][0]["complete"] = False
    assert sharding.judge(incomplete, train=True, location="d") == ""


def test_judge_leaves_out_what_it_cannot_know_and_what_is_not_promised():
    shared = np.array([0, 1, 0, 0], bool)  # sample 1's identity is another's too (a placeholder, a repeat)
    val = [_rank(0, 2, 0, [1, 0, 0, 0]), _rank(1, 2, 1, [0, 0, 1, 1])]
    assert sharding.judge(val, train=False, location="d", ignored=shared) == ""
    dropped = [_rank(0, 2, 0, [1, 0, 0, 0], every_sample=False), _rank(1, 2, 1, [0, 0, 1, 0], every_sample=False)]
    assert sharding.judge(dropped, train=False, location="d") == "", "val with drop_last promises no full cover"
    hybrid = [_rank(0, 2, 0, [1, 1, 0, 0]), _rank(0, 2, 1, [1, 1, 0, 0]), _rank(1, 2, 2, [0, 0, 1, 1]),
              _rank(1, 2, 3, [0, 0, 1, 1])]  # tensor-parallel pairs share their data shard
    assert sharding.judge(hybrid, train=True, location="d") == ""
    other_data = [_rank(0, 2, 0, [1, 1, 0, 0]), _rank(1, 2, 1, [0, 0, 1], location="e")]
    assert "opened different data" in sharding.judge(other_data, train=True, location="d")
