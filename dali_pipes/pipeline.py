"""Wire one Source to one graph for one rank as a DALI pipeline."""

from __future__ import annotations

import os

from dali_pipes.augment import eval_augment
from dali_pipes.sources import Source

READER_NAME = "Reader"


def eval_pipeline(source: Source, *, batch_size: int, device: str = "cpu", num_threads: int | None = None,
                  image_size: int = 224, shard_id: int = 0, num_shards: int = 1, device_id: int = 0,
                  seed: int = 0):
    """A built DALI pipeline yielding (images float32 NCHW, labels int64) for one shard, in order."""
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=num_threads or os.cpu_count() or 1,
                  device_id=device_id if device == "gpu" else None, seed=seed)
    def graph():
        jpegs, labels = source.dali_reader(name=READER_NAME, shard_id=shard_id, num_shards=num_shards,
                                           pad_last_batch=True)
        return eval_augment(jpegs, image_size=image_size, device=device), labels

    pipe = graph()
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
