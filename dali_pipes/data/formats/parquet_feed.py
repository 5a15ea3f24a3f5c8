"""The feed of a Parquet source: DALI has no Parquet reader, so ParquetFeed gives fn.external_source each batch
as reader.ReaderModel plans it, in the read order of a shuffled epoch (`read_order`: the slice's row groups in a
random order per (seed, epoch), cut into windows of about `shuffle_buffer` samples shuffled together), reading whole
row groups a window ahead in the process's reading threads (shared by its feeds: none start or linger per loader).
"""

from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from dali_pipes.data.formats.parquet_table import Columns, Group, columns_of, group_starts, read_group
from dali_pipes.data.labels import dali_checked_labels, label_bound
from dali_pipes.data.samples import ReadPlan, SourceRecord
from dali_pipes.storage import remote

GROUP_THREADS = 4  # row groups read at once, per process (pyarrow decompresses outside the GIL)


def index_arrays(index_path: str) -> tuple[np.ndarray, np.ndarray]:
    """(row groups, rows) of an index as arrays (the feed's and the read order's bulk form)."""
    with open(index_path) as f:
        f.readline()
        table = np.loadtxt(f, dtype=np.int64, ndmin=2)
    return (table[:, 0], table[:, 1]) if table.size else (np.zeros(0, np.int64), np.zeros(0, np.int64))


def read_order(blocks: np.ndarray, span: Sequence[int], seed: int, epoch: int, fill: int,
               shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
    """(storage indices of `span` in read order, the start of each window in that order).

    `blocks`: the storage index where each row group starts (sorted; row groups are read whole). Shuffled:
    the row groups of the span in a random order drawn from (seed, epoch), dealt into windows of at least
    `fill` samples, each window's rows shuffled together; else storage order, windows of whole groups."""
    lo, hi = (span[0], span[-1] + 1) if len(span) else (0, 0)
    cuts = np.unique(np.concatenate([[lo, hi], np.clip(blocks, lo, hi)]))
    bounds = list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))
    rng = np.random.default_rng([seed, epoch]) if shuffle else None
    if rng is not None:
        bounds = [bounds[i] for i in rng.permutation(len(bounds))]
    pieces, windows, size = [], [0], 0
    for start, stop in bounds:
        pieces.append(np.arange(start, stop, dtype=np.int64))
        size += stop - start
        if size - windows[-1] >= max(1, fill):
            windows.append(size)
    order = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    windows = [w for w in windows if w < len(order)] or [0]
    if rng is not None:
        for start, stop in zip(windows, windows[1:] + [len(order)]):
            order[start:stop] = order[start:stop][rng.permutation(stop - start)]
    return order, np.asarray(windows, np.int64)


@dataclass(frozen=True)
class SampleTable:
    """Where each storage-order sample of a source lives: its file, row group and row, and where each row
    group begins in storage order (read_order's blocks)."""
    files: list[str]
    file: np.ndarray
    group: np.ndarray
    row: np.ndarray

    @classmethod
    def of(cls, source: SourceRecord) -> "SampleTable":
        parts = [index_arrays(idx) for idx in source.index_files or []]
        empty = [np.zeros(0, np.int64)]
        file = np.concatenate([np.full(len(g), i, np.int64) for i, (g, _) in enumerate(parts)] or empty)
        group = np.concatenate([g for g, _ in parts] or empty)
        row = np.concatenate([r for _, r in parts] or empty)
        return cls(list(source.files), file, group, row)

    def blocks(self) -> np.ndarray:
        """The storage index at which each run of one (file, row group) starts."""
        change = (np.diff(self.file) != 0) | (np.diff(self.group) != 0)
        return np.concatenate([[0], np.flatnonzero(change) + 1]).astype(np.int64)


def order_model(source: SourceRecord, seed: int, fill: int) -> Callable[[int, Sequence[int]], Sequence[int]]:
    """reader.ReaderModel's `order` of a shuffled reader: (epoch, slice) -> the slice in read order. The
    source's index is read at the first call (a bad-sample search), not now."""
    blocks: list[np.ndarray] = []

    def order(epoch: int, span: Sequence[int]) -> Sequence[int]:
        if not blocks:
            blocks.append(SampleTable.of(source).blocks())
        return read_order(blocks[0], span, seed, epoch, fill, True)[0].tolist()
    return order


@dataclass
class _Epoch:
    order: np.ndarray    # storage indices, padded to whole batches with the last one repeated
    windows: np.ndarray  # where each window starts in `order`
    batches: int
    groups: dict[int, np.ndarray]  # window -> the row groups it reads (ids), found when first needed


class ParquetFeed:
    """The external source's callback: batch `iteration` of the pipeline's epoch `epoch_idx` as (encoded images,
    stored labels[, identities]), exactly as `plan` (a reader.ReaderModel) says this rank reads it; StopIteration
    after the epoch's last batch. A pure function of (epoch, iteration), so a DALI checkpoint resumes it. Row
    groups are read in threads, the next window's (the next epoch's first, at an epoch's last) while this one's
    batches go out; only those two windows' groups are held."""

    def __init__(self, source: SourceRecord, plan: ReadPlan, seed: int, shuffle: bool, with_ids: bool) -> None:
        self.table, self.plan, self.seed, self.shuffle, self.with_ids = SampleTable.of(source), plan, seed, shuffle, \
            with_ids
        self.columns = [columns_of(path, source.keys) for path in self.table.files]
        self._blocks = self.table.blocks()
        keys, self._gid = np.unique(self.table.file * (1 << 32) + self.table.group, return_inverse=True)
        self._groups = [(int(k >> 32), int(k & 0xFFFFFFFF)) for k in keys.tolist()]  # id -> (file, row group)
        firsts = [group_starts(self.table.files[f])[g] for f, g in self._groups]
        self._at = self.table.row - np.asarray(firsts, np.int64)[self._gid]  # row within its group
        self._epochs: dict[int, _Epoch] = {}
        self._loaded: dict[int, Future] = {}
        weakref.finalize(self, _cancel, self._loaded)  # a dropped feed's reads not yet begun are not made
        self._options = remote.current_options()  # the loader's retries, for reads in the pool's threads

    def __call__(self, info) -> tuple:
        epoch = self._plan_of(info.epoch_idx)
        if info.iteration >= epoch.batches:
            raise StopIteration
        size = self.plan.batch_size
        picks = epoch.order[info.iteration * size:(info.iteration + 1) * size]
        self._keep(info.epoch_idx, int(np.searchsorted(epoch.windows, info.iteration * size, side="right") - 1))
        gids = self._gid[picks].tolist()
        groups = {g: self._loaded[g].result() for g in set(gids)}
        at = self._at[picks].tolist()
        images = [groups[g].data[groups[g].starts[j]:groups[g].ends[j]] for g, j in zip(gids, at)]
        empty = [k for k, data in enumerate(images) if not len(data)]
        if empty:  # never given to DALI: its decoder crashes the process on empty buffers
            t, i = self.table, int(picks[empty[0]])
            raise NoImage(f"{t.files[t.file[i]]}#{t.row[i]}: no image to decode (a null or empty cell, or a "
                          f"file its path names that cannot be read)")
        labels = np.fromiter((groups[g].labels[j] for g, j in zip(gids, at)), np.int64, len(at))
        if not self.with_ids:
            return images, labels
        t = self.table
        ids = [np.frombuffer(f"{t.files[t.file[i]]}#{t.row[i]}".encode(), np.uint8) for i in picks.tolist()]
        return images, labels, ids

    def _plan_of(self, epoch: int) -> _Epoch:
        if epoch not in self._epochs:
            span = self.plan.slice(self.plan.shard_of(epoch))
            order, windows = read_order(self._blocks, span, self.seed, epoch, self.plan.shuffle_buffer, self.shuffle)
            batches = -(-self.plan.longest() // self.plan.batch_size)
            padded = np.concatenate([order, np.full(batches * self.plan.batch_size - len(order), order[-1])])
            self._epochs = {e: p for e, p in self._epochs.items() if e in (epoch - 1, epoch)}
            self._epochs[epoch] = _Epoch(padded.astype(np.int64), windows, batches, {})
        return self._epochs[epoch]

    def _window_groups(self, epoch: int, window: int) -> np.ndarray:
        plan = self._plan_of(epoch)
        if window not in plan.groups:
            bounds = [*plan.windows.tolist(), len(plan.order)]
            plan.groups[window] = np.unique(self._gid[plan.order[bounds[window]:bounds[window + 1]]])
        return plan.groups[window]

    def _keep(self, epoch: int, window: int) -> None:
        """Row groups of this window and the next (the next epoch's first) read or being read; others let go."""
        following = (epoch, window + 1) if window + 1 < len(self._plan_of(epoch).windows) else (epoch + 1, 0)
        wanted = np.concatenate([self._window_groups(epoch, window), self._window_groups(*following)]).tolist()
        for g in wanted:
            if g not in self._loaded:
                file, group = self._groups[g]
                self._loaded[g] = _group_pool().submit(_read_group_with, self._options, self.table.files[file],
                                                       group, self.columns[file])
        keep = set(wanted)
        for g in [g for g in self._loaded if g not in keep]:
            del self._loaded[g]


class NoImage(RuntimeError):
    """A row the feed met with no image to decode, raised in DALI's place: a pipeline failure, so that the
    bad-sample search names the row (and skip_bad excludes it)."""


_POOLS: dict[int, ThreadPoolExecutor] = {}  # by process id: a forked worker makes its own
_POOLS_LOCK = threading.Lock()


def _group_pool() -> ThreadPoolExecutor:
    """The process's row-group readers, shared by its feeds: threads that live with the process, as DALI's and
    pyarrow's do, so that none start or linger per loader."""
    with _POOLS_LOCK:
        if os.getpid() not in _POOLS:
            _POOLS[os.getpid()] = ThreadPoolExecutor(GROUP_THREADS, thread_name_prefix="dali_pipes-parquet")
        return _POOLS[os.getpid()]


def _cancel(loaded: dict[int, Future]) -> None:
    for future in list(loaded.values()):
        future.cancel()


def _read_group_with(options: Any, path: str, group: int, columns: Columns) -> Group:
    """read_group under the loader's retries (`options`), in a feed's thread."""
    with remote.options_in_force(options):
        return read_group(path, group, columns)


class _FeedHandle:
    """What DALI's external_source holds of a ParquetFeed: a weak reference. DALI's operator graph is a reference
    cycle (DataNodes and operator instances refer to each other, DALI 2.4) that outlives its pipeline until the
    cycle collector runs; a feed held there kept its threads and row groups as long (4 threads and ~15 MB per
    dropped loader). The pipeline owns the feed instead, and frees it with itself."""

    def __init__(self, feed: ParquetFeed) -> None:
        self._feed = weakref.ref(feed)

    def __call__(self, info) -> tuple:
        feed = self._feed()
        if feed is None:  # only a pipeline already freed can ask
            raise StopIteration
        return feed(info)


def python_reader(source: SourceRecord, plan: ReadPlan, seed: int, shuffle: bool, with_ids: bool) -> tuple:
    """(encoded images, int64 labels, identity rows or None) inside a pipeline definition, from ParquetFeed
    through fn.external_source; labels less label_offset and checked in the graph (labels.dali_checked_labels)."""
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline
    outputs = 3 if with_ids else 2
    feed = ParquetFeed(source, plan, seed, shuffle, with_ids)
    owner = Pipeline.current()  # the pipeline being defined owns its feeds (see _FeedHandle): an attribute of ours
    owner._dali_pipes_feeds = [*getattr(owner, "_dali_pipes_feeds", []), feed]
    nodes = fn.external_source(_FeedHandle(feed), num_outputs=outputs, batch=True, batch_info=True,
                               dtype=[types.DALIDataType.UINT8, types.DALIDataType.INT64,
                                      types.DALIDataType.UINT8][:outputs])
    labels = dali_checked_labels(nodes[1], source.keys.label_offset, label_bound(source)[0])
    ids = fn.pad(nodes[2], axes=(0,), fill_value=0) if with_ids else None
    return nodes[0], labels, ids
