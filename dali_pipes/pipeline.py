"""Wire one Source to one graph for one rank as a DALI pipeline."""

from __future__ import annotations

import os

import numpy as np

from dali_pipes.graph import AugmentConfig, eval_augment, train_augment
from dali_pipes.dist import Shard
from dali_pipes.sources import Source

READER_NAME = "Reader"


def rank_seed(seed: int, rank: int) -> int:
    """A distinct, reproducible DALI seed per (seed, rank): ranks must not draw the same crops."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0] & 0x7FFFFFFF)


def build_pipeline(source: Source, *, train: bool, batch_size: int, device: str = "cpu",
                   shard: Shard = Shard(), augment: AugmentConfig = AugmentConfig(), num_threads: int | None = None,
                   seed: int = 0, shuffle_buffer: int = 4096, prefetch_queue_depth: int = 2,
                   checkpoint: str | None = None, enable_checkpointing: bool = True):
    """An unbuilt DALI pipeline yielding (images, labels) for one rank.

    Train: the reader shuffles through a buffer of `shuffle_buffer` samples and moves to the
    next shard each epoch (stick_to_shard=False), so ranks see other data every epoch. Val: no
    shuffle, each rank keeps its shard. Both pad the last batch (pad_last_batch=True) so that
    every rank runs the same number of batches; DaliLoader drops or masks the padding."""
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=num_threads or default_threads(shard),
                  device_id=shard.local_rank if device == "gpu" else None, seed=rank_seed(seed, shard.rank),
                  prefetch_queue_depth=prefetch_queue_depth, enable_checkpointing=enable_checkpointing,
                  enable_conditionals=train and augment.auto_augment is not None)
    def graph():
        jpegs, labels = source.dali_reader(
            name=READER_NAME, shard_id=shard.rank, num_shards=shard.world_size, random_shuffle=train,
            initial_fill=shuffle_buffer, pad_last_batch=True, stick_to_shard=not train)
        # Images and labels only: after a decode error the loader finds the culprit from the
        # reader's position (recovery.py), so the hot path carries no per-sample bookkeeping.
        return (train_augment if train else eval_augment)(jpegs, augment, device), labels

    return graph(checkpoint=checkpoint) if checkpoint else graph()


def default_threads(shard: Shard) -> int:
    """CPU threads per pipeline: the machine's cores shared by the ranks on this node."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(1, (os.cpu_count() or 1) // local_ranks)


def eval_pipeline(source: Source, *, batch_size: int, device: str = "cpu", num_threads: int | None = None,
                  image_size: int = 224):
    """A built single-rank val pipeline (the quickstart's epoch timer)."""
    pipe = build_pipeline(source, train=False, batch_size=batch_size, device=device, num_threads=num_threads,
                          augment=AugmentConfig(image_size=image_size), enable_checkpointing=False)
    pipe.build()
    return pipe


def run_epoch(pipe) -> tuple[int, int]:
    """Run one epoch of a built single-shard pipeline; returns (samples, batches run). The last
    batch is padded by the reader, so every sample is decoded once or (padding) more."""
    samples = pipe.reader_meta(READER_NAME)["epoch_size"]
    batches = -(-samples // pipe.max_batch_size)
    for _ in range(batches):
        pipe.run()
    return samples, batches
