"""The reader step: a Source's DALI reader nodes, (encoded images, int64 labels), for one rank,
and ReaderModel, the one model of what that reader does (which samples a rank reads, when).

The format module (formats/) makes the reader; this step adds what every format shares: the shard
of the data this rank reads, shuffling, padding, and labels as int64 scalars per sample. Recovery,
the remote feed, the epoch contract and elastic resume ask ReaderModel rather than restate DALI;
tests/test_reader.py checks it against DALI itself.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence, cast

from dali_pipes.data.formats import PythonFedFormat, format_of
from dali_pipes.data.samples import SourceRecord

if TYPE_CHECKING:
    from nvidia.dali.data_node import DataNode


READER_NAME = "Reader"
READER_QUEUE = 1  # the reader's own prefetch_queue_depth: dali_reader's default, which pipeline.py keeps


DALI_LIST_SEED = 524287  # kDaliDataloaderSeed: DALI's file reader shuffles its list with it (random_shuffle)
_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class ReaderModel:
    """DALI's reader as dali_reader configures it for one rank (checked on DALI 2.4.0, tests/test_reader.py).

    * List order: DALI's file reader (image folders, file lists) with random_shuffle=True (train) first
      shuffles its whole file list once, with a fixed seed, identically on every rank (std::shuffle
      over std::mt19937(524287)); `list_shuffled` says so. TFRecord and WebDataset readers keep storage
      order. Slices below are cut from this list order.
    * Slices: the N samples are cut into `world_size` contiguous slices of the list, slice k =
      [N*k // S, N*(k+1) // S); a reader never reads outside its slice in an epoch.
    * Rotation: val (stick_to_shard=True) reads slice `rank` every epoch; train (stick_to_shard=False)
      reads slice (rank + e) % S in the pipeline's epoch e, counted from the epoch it was built at.
    * Padding: pad_last_batch=True repeats the slice's last sample up to the longest slice's batch
      count (contract.py cuts it); in train the file reader reads that last sample when it builds.
    * Read-ahead: past the samples delivered, the reader may have read its shuffle buffer (train),
      the pipeline's prefetch queue, its own queue, the batch being assembled and one more batch the
      executor schedules: `read_ahead` samples, across an epoch's end into the next slice.
    * Python-fed formats (Parquet: formats/parquet.py) have no DALI reader: their source reads what this
      model says, slices, rotation and padding alike, in the order `order` gives a shuffled epoch (the
      format's own, drawn per epoch); their epoch has `batches()` batches."""
    num_samples: int
    rank: int = 0
    world_size: int = 1
    train: bool = False
    batch_size: int = 1
    shuffle_buffer: int = 0
    prefetch_queue_depth: int = 2
    list_shuffled: bool = False
    order: Callable[[int, Sequence[int]], Sequence[int]] | None = field(default=None, compare=False)

    def slice_size(self, shard_id: int) -> int:
        n, s = self.num_samples, self.world_size
        return n * (shard_id + 1) // s - n * shard_id // s

    def slice(self, shard_id: int) -> Sequence[int]:
        """Storage-order indices of the samples of slice `shard_id`, in the reader's list order."""
        span = self._span(shard_id)
        return dali_list_order(self.num_samples)[span.start:span.stop] if self.list_shuffled else span

    def _span(self, shard_id: int) -> range:
        """The positions in the reader's list of slice `shard_id`."""
        n, s = self.num_samples, self.world_size
        return range(n * shard_id // s, n * (shard_id + 1) // s)

    def read_order(self, shard_id: int, epoch: int) -> Sequence[int]:
        """Slice `shard_id` in the order the reader reads it in the pipeline's epoch `epoch`: the list order
        (a DALI reader's shuffle buffer mixes within read_ahead of it), or a Python-fed format's `order`."""
        span = self.slice(shard_id)
        return span if self.order is None else self.order(epoch, span)

    def batches(self, drop: bool) -> int:
        """Batches a Python-fed source's epoch gives, as DALI's iterator counts a reader's: with the DROP
        policy, full batches of the smallest slice's samples; else the longest slice's, padded."""
        if drop:
            return self.num_samples // self.world_size // self.batch_size
        return -(-self.longest() // self.batch_size)

    def shard_of(self, epoch: int) -> int:
        """The slice this rank reads in the pipeline's epoch `epoch` (0: the epoch it was built at)."""
        return (self.rank + epoch) % self.world_size if self.train else self.rank

    def longest(self) -> int:
        """Samples of the longest slice: every rank's padded epoch has ceil(longest / batch) batches."""
        return -(-self.num_samples // self.world_size)

    @property
    def read_ahead(self) -> int:
        """Samples the reader may have read beyond those delivered."""
        fill = self.shuffle_buffer if self.train else 0
        return fill + (self.prefetch_queue_depth + READER_QUEUE + 2) * self.batch_size

    def reach(self, position: int, epoch: int) -> list[Sequence[int]]:
        """Storage indices the reader can have read after `position` batches of the pipeline's epoch
        `epoch`, in read order: this epoch's slice up to the frontier and, in train, the start of the
        next epoch's slice (the pipeline prefetches across the boundary)."""
        current, following = self.shard_of(epoch), self.shard_of(epoch + 1)
        out = [self.read_order(current, epoch)[:position * self.batch_size + self.read_ahead]]
        if following == current and self.order is None:
            return out
        return out + [self.read_order(following, epoch + 1)[:self.read_ahead]]

    def window(self) -> int:
        """Samples one failed batch can have touched: the pipeline's queue and the reader's, in batches."""
        return (self.prefetch_queue_depth + READER_QUEUE + 1) * self.batch_size

    def files_of(self, counts: Sequence[int], shard_id: int) -> list[tuple[int, int]]:
        """(file index, samples taken) of the files slice `shard_id` reads, in read order, for files
        holding `counts` samples each: a reader never opens a file outside its slice."""
        if self.list_shuffled:  # a file reader's list: one sample per file
            return [(i, 1) for i in self.slice(shard_id)]
        span, out, start = self._span(shard_id), [], 0
        for index, count in enumerate(counts):
            taken = min(span.stop, start + count) - max(span.start, start)
            if taken > 0:
                out.append((index, taken))
            start += count
        return out


@functools.lru_cache(maxsize=4)
def dali_list_order(n: int) -> list[int]:
    """DALI's file reader list after its one shuffle: libstdc++'s std::shuffle of range(n) driven by
    std::mt19937(DALI_LIST_SEED), reproduced draw for draw: two swaps per draw while n*n fits in 32
    bits, one per draw beyond (ImageNet), each draw uniform_int_distribution's multiply-shift."""
    items, draw = list(range(n)), _mt19937(DALI_LIST_SEED)
    if n < 2:
        return items
    if _MASK32 // n < n:
        for i in range(1, n):
            j = _uniform(draw, i)
            items[i], items[j] = items[j], items[i]
        return items
    i = 1
    if n % 2 == 0:
        j = _uniform(draw, 1)
        items[i], items[j] = items[j], items[i]
        i += 1
    while i != n:
        span = i + 1
        x = _uniform(draw, span * (span + 1) - 1)
        for j in (x // (span + 1), x % (span + 1)):
            items[i], items[j] = items[j], items[i]
            i += 1
    return items


def _uniform(draw, high: int) -> int:
    """uniform_int_distribution(0, high) over a 32-bit generator, as libstdc++ draws it."""
    r = high + 1
    product = draw() * r
    if product & _MASK32 < r:
        threshold = ((1 << 32) - r) % r
        while product & _MASK32 < threshold:
            product = draw() * r
    return product >> 32


def _mt19937(seed: int):
    """std::mt19937(seed)'s outputs, one per call."""
    state = [seed & _MASK32]
    for i in range(1, 624):
        state.append((1812433253 * (state[-1] ^ (state[-1] >> 30)) + i) & _MASK32)
    index = [624]

    def draw() -> int:
        if index[0] == 624:
            for k in range(624):
                y = (state[k] & 0x80000000) | (state[(k + 1) % 624] & 0x7FFFFFFF)
                state[k] = state[(k + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            index[0] = 0
        y = state[index[0]]
        index[0] += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return (y ^ (y >> 18)) & _MASK32
    return draw


def dali_reader(source: SourceRecord, *, name: str = READER_NAME, shard_id: int = 0, num_shards: int = 1,
                random_shuffle: bool = False, initial_fill: int = 1024, seed: int = -1, pad_last_batch: bool = False,
                stick_to_shard: bool = False, prefetch_queue_depth: int = 1, max_pixels: int | None = None,
                with_ids: bool = False, **reader_args) -> tuple:
    """Reader nodes for use inside a DALI pipeline definition: (encoded images, int64 labels), and each
    sample's identity as uint8 rows (its source_info, zero padded) when `with_ids`.

    Labels come out as int64 scalars per sample (shape ()), already shifted by label_offset.
    DALI cuts the data into `num_shards` contiguous slices in storage order; this rank reads
    slice `shard_id`. With `max_pixels`, a batch holding an image whose header claims more pixels
    fails before any decoder sees it (see guard_pixels). A Python-fed format (PYTHON_FED) reads what
    ReaderModel plans for these arguments (python_plan)."""
    from nvidia.dali import fn, types
    fmt = format_of(source.kind)
    if fmt.PYTHON_FED:
        plan, seed = python_plan(source, shard_id, num_shards, random_shuffle, initial_fill, seed, stick_to_shard)
        images, labels, ids = cast(PythonFedFormat, fmt).python_reader(source, plan, seed, random_shuffle, with_ids)
    else:
        args = dict(name=name, shard_id=shard_id, num_shards=num_shards, random_shuffle=random_shuffle,
                    initial_fill=initial_fill, seed=seed, pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard,
                    prefetch_queue_depth=prefetch_queue_depth, **reader_args)
        images, labels = fmt.dali_reader(source, args)
        ids = identity_rows(images) if with_ids else None
    if max_pixels is not None:
        images = guard_pixels(images, max_pixels)
    labels = fn.reshape(fn.cast(labels, dtype=types.DALIDataType.INT64), shape=[])
    return (images, labels, ids) if with_ids else (images, labels)


def python_plan(source: SourceRecord, shard_id: int, num_shards: int, shuffle: bool, fill: int, seed: int,
                stick_to_shard: bool) -> tuple[ReaderModel, int]:
    """(the ReaderModel a Python-fed source reads by, its seed) inside the pipeline being defined: the batch
    size and depth are the pipeline's, the seed the pipeline's unless given (as a DALI reader's)."""
    from nvidia.dali.pipeline import Pipeline
    pipe = Pipeline.current()
    seed = pipe.seed if seed < 0 else seed
    fmt = cast(PythonFedFormat, format_of(source.kind))
    order = fmt.order_model(source, seed, fill) if shuffle else None
    total = sum(source.counts) if source.counts is not None else len(source.files)
    return ReaderModel(total, shard_id, num_shards, not stick_to_shard, pipe.max_batch_size, fill,
                       pipe.prefetch_queue_depth, order=order), seed


def identity_rows(jpegs: "DataNode") -> "DataNode":
    """Inside a pipeline definition: DALI's reader's source_info of each sample as uint8 rows, zero padded to
    the batch's longest (a dense output for DALIGenericIterator): what run/delivery.py maps back to samples."""
    from nvidia.dali import fn
    return fn.pad(fn.get_property(jpegs, key="source_info"), axes=(0,), fill_value=0)


def guard_pixels(images: "DataNode", max_pixels: int) -> "DataNode":
    """The encoded images, unchanged, or a failed batch when a header claims more than `max_pixels`:
    a decompression bomb would make the decoder allocate it (60,000 x 60,000 x 3 = 10.8 GB). The
    header is parsed on the CPU (peek_image_shape reads no pixels), and the failure is a reshape to
    a wrong volume, which DALI checks before the decoder, fed by it, runs. Reshape passes the bytes
    through without a copy, so the hot path pays a few tiny per-sample ops. The loader's bad-sample
    search then names the image (and, with skip_bad, excludes it)."""
    from nvidia.dali import fn, types
    shape = fn.peek_image_shape(images, dtype=types.DALIDataType.INT64)
    too_big = fn.cast(shape[0] * shape[1] > max_pixels, dtype=types.DALIDataType.INT64)
    return fn.reshape(images, shape=images.shape(dtype=types.DALIDataType.INT64) * (1 - too_big))
