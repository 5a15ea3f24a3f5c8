"""pipeline.py: which GPU a rank's pipeline runs on, how many CPU threads it gets, and the
device combinations it refuses. (Its GPU graphs are checked in test_graph_check.py.)"""

from __future__ import annotations

import os

import pytest
import torch

from dali_pipes import open_source
from dali_pipes.run.dist import Shard
from dali_pipes.run.machine import default_threads, usable_cpus
from dali_pipes.run.pipeline import PipelineSpec, build_pipeline, cuda_device_id


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_gpu_pipelines_are_defined_with_a_device_id_without_cuda(jpeg_folder):
    pipe = build_pipeline(open_source(jpeg_folder), PipelineSpec(True, 2, "gpu", shard=Shard(0, 1, 0)))
    assert pipe.device_id == 0  # defined for GPU 0 on a machine without CUDA; only build() needs CUDA
    with pytest.raises(RuntimeError, match="CUDA"):
        pipe.build()


def test_build_pipeline_refuses_a_gpu_decode_on_a_cpu_pipeline(jpeg_folder):
    with pytest.raises(ValueError, match="decode_device='gpu' needs device='gpu'.*decode_device='cpu'"):
        build_pipeline(open_source(jpeg_folder), PipelineSpec(True, 2, "cpu", decode_device="gpu"))


@pytest.mark.parametrize("initialized, current, visible, local_rank, expected", [
    (True, 0, 1, 3, 0),     # set_device ran; each rank sees only its own GPU: torch's current device
    (True, 2, 8, 2, 2),
    (False, None, 8, 3, 3),  # CUDA not initialised yet: local rank when visible
    (False, None, 1, 3, 0),  # ... device 0 when the rank sees exactly one GPU
])
def test_cuda_device_id(monkeypatch, initialized, current, visible, local_rank, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    assert cuda_device_id(Shard(0, 1, local_rank)) == expected


def test_cuda_device_id_names_the_fix_when_ambiguous(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match="torch.cuda.set_device"):
        cuda_device_id(Shard(0, 1, 3))


def test_default_threads_follow_cpu_affinity(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_threads() == 2


def test_usable_cpus_is_the_affinity_mask():
    assert usable_cpus() == len(os.sched_getaffinity(0))
