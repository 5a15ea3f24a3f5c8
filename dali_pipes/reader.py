"""The reader step: a Source's DALI reader nodes, (encoded images, int64 labels), for one rank.

The format module (formats/) makes the reader; this step adds what every format shares: the shard
of the data this rank reads, shuffling, padding, and labels as int64 scalars per sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dali_pipes.formats import format_of
from dali_pipes.samples import SourceRecord

if TYPE_CHECKING:
    from nvidia.dali.data_node import DataNode


READER_NAME = "Reader"


def dali_reader(source: SourceRecord, *, name: str = READER_NAME, shard_id: int = 0, num_shards: int = 1,
                random_shuffle: bool = False, initial_fill: int = 1024, seed: int = -1, pad_last_batch: bool = False,
                stick_to_shard: bool = False, prefetch_queue_depth: int = 1, max_pixels: int | None = None,
                **reader_args) -> tuple["DataNode", "DataNode"]:
    """Reader nodes for use inside a DALI pipeline definition: (encoded images, int64 labels).

    Labels come out as int64 scalars per sample (shape ()), already shifted by label_offset.
    DALI cuts the data into `num_shards` contiguous slices in storage order; this rank reads
    slice `shard_id`. With `max_pixels`, a batch holding an image whose header claims more pixels
    fails before any decoder sees it (see guard_pixels)."""
    from nvidia.dali import fn, types
    args = dict(name=name, shard_id=shard_id, num_shards=num_shards, random_shuffle=random_shuffle,
                initial_fill=initial_fill, seed=seed, pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
                prefetch_queue_depth=prefetch_queue_depth, **reader_args)
    images, labels = format_of(source.kind).dali_reader(source, args)
    if max_pixels is not None:
        images = guard_pixels(images, max_pixels)
    return images, fn.reshape(fn.cast(labels, dtype=types.INT64), shape=[])


def guard_pixels(images: "DataNode", max_pixels: int) -> "DataNode":
    """The encoded images, unchanged, or a failed batch when a header claims more than `max_pixels`:
    a decompression bomb would make the decoder allocate it (60,000 x 60,000 x 3 = 10.8 GB). The
    header is parsed on the CPU (peek_image_shape reads no pixels), and the failure is a reshape to
    a wrong volume, which DALI checks before the decoder, fed by it, runs. Reshape passes the bytes
    through without a copy, so the hot path pays a few tiny per-sample ops. The loader's bad-sample
    search then names the image (and, with skip_bad, excludes it)."""
    from nvidia.dali import fn, types
    shape = fn.peek_image_shape(images, dtype=types.INT64)
    too_big = fn.cast(shape[0] * shape[1] > max_pixels, dtype=types.INT64)
    return fn.reshape(images, shape=images.shape(dtype=types.INT64) * (1 - too_big))
