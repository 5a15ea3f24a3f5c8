"""pipeline.py: which GPU a rank's pipeline runs on, how many CPU threads it gets, and the
device combinations it refuses. (Its GPU graphs are checked in test_graph_check.py.)"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

import dali_pipes
from dali_pipes import AugmentConfig, open_source
from dali_pipes.run.contract import Contract
from dali_pipes.run.dist import Shard
from dali_pipes.run.machine import default_threads, usable_cpus
from dali_pipes.run.pipeline import PipelineSpec, TunedKnobs, build_pipeline, cuda_device_id


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_gpu_pipelines_are_defined_with_a_device_id_without_cuda(jpeg_folder):
    spec = PipelineSpec(contract=Contract(True, 2, False), device="gpu", shard=Shard(0, 1, 0))
    pipe = build_pipeline(open_source(jpeg_folder), spec)
    assert pipe.device_id == 0  # defined for GPU 0 on a machine without CUDA; only build() needs CUDA
    with pytest.raises(RuntimeError, match="CUDA"):
        pipe.build()


def test_the_spec_refuses_a_gpu_decode_on_a_cpu_pipeline():
    with pytest.raises(ValueError, match="decode_device='gpu' needs device='gpu'.*decode_device='cpu'"):
        PipelineSpec(contract=Contract(True, 2, False), device="cpu", decode_device="gpu")


# -- issue 34: one spec, validated once ----------------------------------------------------------------------

def test_the_spec_and_its_knobs_cannot_be_built_positionally():
    """Two int fields swapped by position would pass mypy and swap the values: keywords only."""
    with pytest.raises(TypeError):
        PipelineSpec(True, 2)  # type: ignore[misc]
    with pytest.raises(TypeError):
        TunedKnobs(4, 2)  # type: ignore[misc]


@pytest.mark.parametrize("device, decode_device, resolved", [
    ("cpu", None, "cpu"), ("gpu", None, "gpu"), ("gpu", "cpu", "cpu"), ("gpu", "gpu", "gpu")])
def test_the_spec_resolves_the_decode_device_once(device, decode_device, resolved):
    """decode_device is resolved when the spec is made, never None after: no reader resolves it again."""
    spec = PipelineSpec(contract=Contract(True, 2, False), device=device, decode_device=decode_device)
    assert spec.decode_device == resolved
    assert dataclasses.replace(spec, seed=1).decode_device == resolved  # a new spec stays resolved


def test_the_tuned_knobs_are_one_resolved_value():
    """"auto" and None are read once (TunedKnobs.requested): the spec holds numbers, and the names left to tune."""
    knobs, tuned = TunedKnobs.requested("auto", "auto", "auto")
    assert knobs == TunedKnobs(num_threads=default_threads(), prefetch_queue_depth=2, hw_decoder_load=0.65)
    assert tuned == ("num_threads", "prefetch_queue_depth", "hw_decoder_load")
    assert TunedKnobs.requested(None, 3, 0.99) == (TunedKnobs(prefetch_queue_depth=3, hw_decoder_load=0.99), ())
    assert PipelineSpec(contract=Contract(True, 2, False)).knobs.num_threads == default_threads()
    with pytest.raises(ValueError, match="prefetch_queue_depth must be a count or 'auto', got '3'"):
        TunedKnobs.requested(2, "3", 0.65)
    with pytest.raises(ValueError, match="num_threads must be a positive count, got -1"):
        TunedKnobs(num_threads=-1)
    # the decoder builds with the knobs' load: a fixed load in augment that the knobs do not carry is refused
    with pytest.raises(ValueError, match=r"knobs=TunedKnobs\(hw_decoder_load=0.99\)"):
        PipelineSpec(contract=Contract(True, 2, False), augment=AugmentConfig(hw_decoder_load=0.99))


def test_the_batch_size_has_one_home_the_loaders_contract(jpeg_folder):
    """issue 34: DaliLoader(batch_size=...) is stored once, in the loader's epoch contract (run/contract.py); the
    spec carries that contract itself, so DALI's batch (pipeline_def), the reader's model and the remote feed read
    the size the epoch is cut by, and no spec can batch otherwise."""
    assert "batch_size" not in {f.name for f in dataclasses.fields(PipelineSpec)}  # no copy of its own
    loader = dali_pipes.DaliLoader(jpeg_folder, batch_size=3, train=True, device="cpu", num_threads=1, image_size=32)
    try:
        contract, pipe = loader.contract, loader.pipe
        assert pipe.spec.contract is contract and pipe.order is None  # DALI's reader reads (no drawn sampler)
        assert pipe.built is not None and pipe.built.contract is contract and pipe.feed.spec.contract is contract
        assert pipe.spec.batch_size == pipe.reader().batch_size == loader.batch_size == 3
        assert dataclasses.replace(pipe.spec, seed=1).contract is contract  # tuning's and schedules' new specs
        assert pipe.run.iterator.batch_size == 3  # what DALI batches by (pipeline_def's max_batch_size)
    finally:
        loader.close()
    drawn = dali_pipes.DaliLoader(jpeg_folder, batch_size=3, sampler=[0, 5, 5, 2, 11], device="cpu", num_threads=1,
                                  image_size=32)
    try:  # a drawn sampler's feed (run/sampled.py) fills DALI's batches by the same contract
        order = drawn.pipe.order
        assert order is not None and order.feed.contract is drawn.contract is drawn.pipe.spec.contract
        assert [len(labels) for _, labels in drawn] == [3, 2]
    finally:
        drawn.close()


def test_num_threads_enters_dali_once_from_the_spec(jpeg_folder):
    """DALI gets the thread count once, from the spec's knobs (pipeline_def); the decoders get it from
    build_pipeline as an argument, never read back from the pipeline being defined (Pipeline.current)."""
    spec = PipelineSpec(contract=Contract(True, 2, False), knobs=TunedKnobs(num_threads=3))
    assert build_pipeline(open_source(jpeg_folder), spec).num_threads == 3
    library = Path(dali_pipes.__file__).parent
    read_back = [path.relative_to(library) for path in library.rglob("*.py")
                 if "Pipeline.current" in (text := path.read_text()) and "num_threads" in text]
    assert read_back == []  # graph/augment.py read it back for the decoders' paddings


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
