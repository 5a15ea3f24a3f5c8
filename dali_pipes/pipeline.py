"""Wire one Source to one graph for one rank as a DALI pipeline."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from dali_pipes.dist import Shard, usable_cpus
from dali_pipes.graph import AugmentConfig, eval_augment, resolve_decode_device, train_augment
from dali_pipes.reader import READER_NAME
from dali_pipes.source import Source

if TYPE_CHECKING:
    from nvidia.dali import Pipeline

__all__ = ["READER_NAME", "build_pipeline", "cuda_device_id", "default_threads", "rank_seed",
           "usable_cpus"]


def rank_seed(seed: int, rank: int) -> int:
    """A distinct, reproducible DALI seed per (seed, rank): ranks must not draw the same crops."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0] & 0x7FFFFFFF)


def build_pipeline(source: Source, *, train: bool, batch_size: int, device: str = "cpu",
                   shard: Shard = Shard(), augment: AugmentConfig = AugmentConfig(), num_threads: int | None = None,
                   seed: int = 0, shuffle_buffer: int = 4096, prefetch_queue_depth: int = 2,
                   checkpoint: str | None = None, enable_checkpointing: bool = True,
                   decode_device: str | None = None, device_id: int | None = None, sample_ids: bool = False,
                   max_pixels: int | None = None) -> Pipeline:
    """An unbuilt DALI pipeline yielding (images, labels) for one rank.

    Train: the reader shuffles through a buffer of `shuffle_buffer` samples and moves to the
    next shard each epoch (stick_to_shard=False), so ranks see other data every epoch. Val: no
    shuffle, each rank keeps its shard. Both pad the last batch (pad_last_batch=True) so that
    every rank runs the same number of batches; DaliLoader drops or masks the padding.

    device="gpu": images and labels come out on the GPU (`device_id`, default `cuda_device_id(shard)`);
    labels too, as DALI's own examples return them: a CPU output of a GPU pipeline arrives in
    pageable host memory and its copy to the GPU would sync. `decode_device` (None: `device`) "cpu"
    with device="gpu" decodes on the CPU threads and augments on the GPU (graph.py). `max_pixels`: a
    batch with an image whose header claims more pixels fails before decoding (reader.guard_pixels)."""
    from nvidia.dali import pipeline_def
    resolve_decode_device(device, decode_device)  # refuse a bad combination before DALI sees it
    if device == "gpu" and device_id is None:
        device_id = cuda_device_id(shard)

    @pipeline_def(batch_size=batch_size, num_threads=num_threads or default_threads(shard),
                  device_id=device_id if device == "gpu" else None, seed=rank_seed(seed, shard.rank),
                  prefetch_queue_depth=prefetch_queue_depth, enable_checkpointing=enable_checkpointing,
                  enable_conditionals=train and augment.auto_augment is not None)
    def graph():
        jpegs, labels = source.dali_reader(
            name=READER_NAME, shard_id=shard.rank, num_shards=shard.world_size, random_shuffle=train,
            initial_fill=shuffle_buffer, pad_last_batch=True, stick_to_shard=not train, max_pixels=max_pixels)
        # After a decode error the loader finds the culprit from the reader's position (recovery.py);
        # sample_ids=True adds each sample's identity (elastic.py: what an elastic resume must skip).
        images = (train_augment if train else eval_augment)(jpegs, augment, device, decode_device)
        if sample_ids:
            from dali_pipes.elastic import sample_ids as identity_rows
            return images, labels.gpu() if device == "gpu" else labels, identity_rows(jpegs)
        return images, labels.gpu() if device == "gpu" else labels

    return graph(checkpoint=checkpoint) if checkpoint else graph()


def cuda_device_id(shard: Shard) -> int:
    """The CUDA device a rank's pipeline runs on.

    Once torch has initialised CUDA (train.py calls torch.cuda.set_device first), torch's current
    device: right whether a rank sees every GPU of the node or, as under some schedulers
    (CUDA_VISIBLE_DEVICES per rank), only its own, where `local_rank` would name a device it cannot
    see. Before that: `local_rank` when that device is visible, device 0 when the rank sees exactly
    one GPU, else an error naming the fix. Without CUDA (a pipeline only defined, as the static
    graph checks do) `local_rank`."""
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0 or shard.local_rank < visible:
        return shard.local_rank
    if visible == 1:
        return 0
    raise ValueError(f"local rank {shard.local_rank} but this process sees {visible} GPUs (devices 0-{visible - 1}); "
                     f"call torch.cuda.set_device(...) for this rank before building the loader")


def default_threads(shard: Shard) -> int:
    """CPU threads per pipeline: the CPUs this process may use, shared by the ranks on this node."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(1, usable_cpus() // local_ranks)
