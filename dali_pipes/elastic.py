"""Elastic resume: finish an interrupted epoch on a different number of ranks, each sample at most once.

Every rank records which samples it has delivered in the current epoch, as storage-order indices
(0..N-1 over `source.refs()`), in a bitmap that goes into the loader's state. The identity of each
delivered sample comes from DALI itself: the pipeline's third output is the reader's per-sample
`source_info` (a file's path, "<shard> at index <byte offset>" for TFRecord, "<tar>:<data offset>:<member>"
for WebDataset; checked on DALI 2.4.0), padded to a dense uint8 row. Resuming on a new world size:
  1. the old ranks' bitmaps are OR-ed: what the interrupted epoch has delivered so far;
  2. the rest (R samples) is split over the new ranks: train gives each rank (R // world) // batch
     full batches (random slices, the tail that fills no batch is dropped), val gives each rank a
     slice padded to the same batch count (padding carries label -1);
  3. each rank reads only its slice, through a subset of the source (a file list, or subset index files
     for TFRecord / WebDataset, which DALI reads record by record): nothing delivered is read again;
  4. after that remainder epoch the loader runs the normal pipeline for the new world size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import warnings
from dataclasses import dataclass

import numpy as np

from dali_pipes.formats import format_of, format_of_ref
from dali_pipes.source import Source

IDENTITY_CHECKED_DALI = "2.4.0"  # the source_info formats below were read off this DALI version


# ---------------------------------------------------------------------------------------------
# Sample identities: in the graph, and back to storage-order indices in Python.
# ---------------------------------------------------------------------------------------------

def sample_ids(jpegs):
    """Inside a pipeline definition: the reader's source_info of each sample as uint8 rows, zero
    padded to the batch's longest (a dense output for DALIGenericIterator)."""
    from nvidia.dali import fn
    return fn.pad(fn.get_property(jpegs, key="source_info"), axes=(0,), fill_value=0)


def identity(ref) -> str:
    """The source_info DALI reports for the sample `ref` names (the format module knows its form)."""
    return format_of_ref(ref).source_info(ref)


def split_identity(kind: str, key: str) -> tuple[str, int]:
    """(shard path, byte offset) of a sharded format's source_info; ("", -1) if it has another form
    (not as on DALI 2.4.0: counted as unidentified, never a crash mid-training)."""
    try:
        return format_of(kind).split_source_info(key)
    except ValueError:
        return "", -1


class IdentityTable:
    """source_info -> storage-order index, for one source, kept small for ImageNet-sized data:
    files by a sorted array of their hashes, shards by their sample offsets (read per shard when
    first met). Repeated identities (a file listed twice, the placeholders of excluded samples)
    resolve to the first of their indices not yet marked."""

    def __init__(self, source: Source) -> None:
        self._source = source
        if source.format.SHARDED:
            self._shard_of = {path: i for i, path in enumerate(source.files)}
            self._starts = np.cumsum([0] + list(source.counts))
            self._offsets: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        else:
            hashes = np.fromiter(map(hash, source.files), np.int64, len(source.files))
            self._order = np.argsort(hashes, kind="stable")
            self._hashes = hashes[self._order]

    def repeated(self) -> np.ndarray:
        """Samples whose identity another sample shares (a file listed twice, the placeholders of excluded
        samples): which of them a rank delivered is not known, only how many (see mark)."""
        out = np.zeros(len(self._source.files) if not self._source.format.SHARDED else int(self._starts[-1]), bool)
        if not self._source.format.SHARDED and len(self._hashes) > 1:
            same = self._hashes[1:] == self._hashes[:-1]
            out[self._order[1:][same]] = True
            out[self._order[:-1][same]] = True
        return out

    def mark(self, keys: list[str], marked: np.ndarray) -> list[str]:
        """Mark the samples named by `keys` in `marked`; returns the keys not found."""
        find = self._find_shard_samples if self._source.format.SHARDED else self._find_files
        found, missing = [], []
        for key, index in zip(keys, find(keys, marked)):
            if index is None:
                missing.append(key)
            else:
                found.append(index)
        marked[found] = True
        return missing

    def _find_files(self, keys: list[str], marked: np.ndarray):
        table, order, files = self._hashes, self._order, self._source.files
        hashes = np.fromiter(map(hash, keys), np.int64, len(keys))
        by_hash = np.argsort(hashes)
        lows = np.empty_like(by_hash)
        lows[by_hash] = np.searchsorted(table, hashes[by_hash])  # sorted queries: fewer cache misses
        lows = np.minimum(lows, len(table) - 1)
        single = (table[np.minimum(lows + 1, len(table) - 1)] != table[lows]) | (lows + 1 == len(table))
        for key, low, first, one in zip(keys, lows.tolist(), order[lows].tolist(), single.tolist()):
            if one and files[first] == key:
                yield first  # the usual case: one file of that hash
                continue
            high = int(np.searchsorted(table, table[low], "right"))
            found = [i for i in order[low:high].tolist() if files[i] == key]
            index = next((i for i in found if not marked[i]), found[-1]) if found else None
            if index is not None:
                marked[index] = True  # at once: a repeat later in this batch takes the next of its indices
            yield index

    def _find_shard_samples(self, keys: list[str], marked: np.ndarray):
        parsed = [split_identity(self._source.kind, key) for key in keys]
        shards = np.array([self._shard_of.get(path, -1) for path, _ in parsed], np.int64)
        offsets = np.array([offset for _, offset in parsed], np.int64)
        found = np.full(len(keys), -1, np.int64)
        for shard in np.unique(shards[shards >= 0]).tolist():  # a batch comes from a few shards
            rows = np.flatnonzero(shards == shard)
            known, positions = self._shard_offsets(shard)
            at = np.minimum(np.searchsorted(known, offsets[rows]), len(known) - 1)
            hit = known[at] == offsets[rows]
            found[rows[hit]] = self._starts[shard] + positions[at[hit]]
        return [None if i < 0 else i for i in found.tolist()]

    def _shard_offsets(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """(sorted sample offsets, their positions in the shard) of one shard, from its index."""
        if shard not in self._offsets:
            one = dataclasses.replace(self._source, files=[self._source.files[shard]],
                                      index_files=[self._source.index_files[shard]],
                                      counts=[self._source.counts[shard]])
            offsets = np.array([ref.offset for ref in one.refs()], np.int64)
            order = np.argsort(offsets, kind="stable")
            self._offsets[shard] = offsets[order], order
        return self._offsets[shard]


class DeliveryRecord:
    """Which samples this rank has delivered in the current epoch (a bitmap over storage order);
    and, while the remainder epoch of an elastic resume runs, this rank's part of it (`remainder`)."""

    def __init__(self, num_samples: int) -> None:
        self.delivered = np.zeros(num_samples, bool)
        self.complete = True  # False once a delivered sample could not be identified
        self.remainder: Remainder | None = None
        self._table: IdentityTable | None = None
        self._table_of: Source | None = None

    def bind(self, source: Source) -> None:
        """Identify samples of `source` from now on (a new table after bad samples were excluded)."""
        if self._table_of is not source:
            self._table, self._table_of = IdentityTable(source), source

    def add(self, ids, count: int) -> None:
        """Mark the first `count` rows of a batch's sample_ids output as delivered."""
        rows = ids.cpu().numpy() if hasattr(ids, "cpu") else np.asarray(ids)
        missing = self._table.mark([row.tobytes().rstrip(b"\0").decode() for row in rows[:count]], self.delivered)
        if missing and self.complete:
            warnings.warn(f"elastic resume: cannot identify delivered sample {missing[0]!r} (DALI's source_info "
                          f"format was checked on DALI {IDENTITY_CHECKED_DALI}); this epoch's state can only "
                          f"resume on the same world size")
        self.complete = self.complete and not missing

    def repeated(self) -> np.ndarray:
        """Samples of the bound source whose identity another shares (IdentityTable.repeated)."""
        return self._table.repeated() if self._table is not None else np.zeros(len(self.delivered), bool)

    def end_epoch(self) -> bool:
        """Start the next epoch's record; True when the epoch that ended was a remainder epoch."""
        self.delivered[:] = False
        self.complete = True
        was_remainder, self.remainder = self.remainder is not None, None
        return was_remainder

    def state(self, epoch_done: bool) -> dict:
        """The record for the loader's state. After an epoch's last batch the state names the next
        epoch, which has delivered nothing yet."""
        delivered = np.zeros_like(self.delivered) if epoch_done else self.delivered
        base = self.remainder.base if self.remainder is not None and not epoch_done else None
        return {"delivered": pack(delivered), "delivered_complete": epoch_done or self.complete,
                "elastic_base": None if base is None else pack(base)}

    def restore(self, state: dict, num_samples: int) -> None:
        self.delivered = unpack(state["delivered"], num_samples) if state.get("delivered") else \
            np.zeros(num_samples, bool)
        self.complete = state.get("delivered_complete", state.get("position") == 0)  # older states: unknown


def pack(bitmap: np.ndarray) -> bytes:
    return np.packbits(bitmap).tobytes()


def unpack(data: bytes, num_samples: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(data, np.uint8), count=num_samples).astype(bool)


# ---------------------------------------------------------------------------------------------
# Planning the rest of an interrupted epoch over a new world size.
# ---------------------------------------------------------------------------------------------

@dataclass
class Remainder:
    """This rank's part of the rest of epoch `epoch`: `indices` in read order (val: padded by
    repeats at the end), of which the first `real` are real samples; `base` what was delivered
    before the remainder started (all old ranks together)."""
    epoch: int
    base: np.ndarray
    indices: list[int]
    real: int
    seed: int


def check_states(states: list[dict], identity: dict) -> int:
    """The interrupted epoch of the old ranks' states, after checking that they fit this loader
    (same data, batch size, seed, train flag) and each other. Raises ValueError naming the fix."""
    keys = ("version", "num_samples", "batch_size", "seed", "train")
    for rank, state in enumerate(states):
        differ = {k: (state.get(k), identity[k]) for k in keys if state.get(k) != identity[k]}
        if differ:
            raise ValueError(f"loader state of old rank {rank} does not fit this loader: (saved, now) = {differ}; "
                             f"an elastic resume needs the same data, batch size, seed and train flag")
        if "delivered" not in state:
            raise ValueError(f"loader state of old rank {rank} has no record of delivered samples (written by an "
                             f"older dali_pipes); resume it on its own world size ({state.get('world_size')})")
        if not state.get("delivered_complete", False):
            raise ValueError(f"loader state of old rank {rank}: some delivered samples of epoch {state['epoch']} "
                             f"could not be identified; resume it on its own world size ({state.get('world_size')})")
    old_world = {s.get("world_size") for s in states}
    if len(old_world) != 1 or old_world.pop() != len(states):
        raise ValueError(f"pass the state of every old rank, in rank order: got {len(states)} states with world "
                         f"sizes {sorted({s.get('world_size') for s in states})}")
    epochs = {s["epoch"] for s in states}
    if len(epochs) != 1:
        raise ValueError(f"the old ranks' states are in different epochs {sorted(epochs)}: take them at the same "
                         f"step (train.py's checkpoints are)")
    return epochs.pop()


def delivered_union(states: list[dict], num_samples: int) -> np.ndarray:
    union = np.zeros(num_samples, bool)
    for state in states:
        union |= unpack(state["delivered"], num_samples)
    return union


def plan_remainder(base: np.ndarray, *, epoch: int, rank: int, world_size: int, batch_size: int, train: bool,
                   seed: int, whole_batches: bool = True) -> Remainder | None:
    """This rank's part of the samples `base` lacks, or None when the rest yields no batch (train with
    `whole_batches`, DALI's DROP or drop_last: fewer than world_size * batch_size samples are left; they are
    dropped, as a tail). Train without it (DataLoader's drop_last=False) splits the rest as val does, in random
    slices: every sample is read, the last batches short."""
    rest = np.flatnonzero(~base)
    count = len(rest)
    remainder_seed = int(np.random.SeedSequence([seed, epoch, count, 0xE1A5]).generate_state(1)[0] & 0x7FFFFFFF)
    if train and whole_batches:
        batches = (count // world_size) // batch_size
        if batches == 0:
            return None
        order = np.random.default_rng(remainder_seed).permutation(count)  # random slices, read in storage order
        take = batches * batch_size
        mine = np.sort(rest[order[rank * take:(rank + 1) * take]])
        return Remainder(epoch, base, mine.tolist(), take, remainder_seed)
    if count == 0:
        return None
    longest = -(-count // world_size)
    if train:  # random slices, each read in storage order
        rest = rest[np.random.default_rng(remainder_seed).permutation(count)]
    mine = sorted(rest[rank * count // world_size:(rank + 1) * count // world_size].tolist())
    pad = mine[-1] if mine else int(rest[0])  # repeats keep every rank at the same batch count
    return Remainder(epoch, base, mine + [pad] * (longest - len(mine)), len(mine), remainder_seed)


# ---------------------------------------------------------------------------------------------
# A source restricted to a list of samples.
# ---------------------------------------------------------------------------------------------

def subset_folder() -> str:
    """Where subset index files go: beside the index cache, never beside the data."""
    from dali_pipes.indexes import cache_root
    return os.path.join(cache_root(), "elastic")


def subset_source(source: Source, indices: list[int], folder: str | None = None) -> Source:
    """`source` restricted to the samples `indices` (storage-order indices, repeats allowed), read
    in that order. Files: a shorter file list. Shards: per shard an index listing only the chosen
    records (DALI reads records by offset and size, so gaps are fine), written under `folder`."""
    if not source.format.SHARDED:
        return dataclasses.replace(source, files=[source.files[i] for i in indices],
                                   labels=[source.labels[i] for i in indices])
    read, write = source.format.read_index, source.format.write_index
    starts = np.cumsum([0] + list(source.counts))
    runs: list[tuple[int, list[int]]] = []  # (shard number, positions in it), consecutive per shard
    for i in indices:
        shard = int(np.searchsorted(starts, i, side="right") - 1)
        if not runs or runs[-1][0] != shard:
            runs.append((shard, []))
        runs[-1][1].append(int(i - starts[shard]))
    folder = folder or subset_folder()
    os.makedirs(folder, exist_ok=True)
    files, index_files, counts = [], [], []
    for shard, positions in runs:
        entries = read(source.index_files[shard])
        key = f"{os.path.abspath(source.index_files[shard])}|{positions}|{os.getpid()}"  # the process id: ranks on
        tag = hashlib.sha1(key.encode()).hexdigest()[:16]  # one machine never share (or delete) each other's files
        target = os.path.join(folder, f"{tag}-{os.path.basename(source.index_files[shard])}")
        if not os.path.exists(target):
            write([entries[p] for p in positions], target)
        files.append(source.files[shard])
        index_files.append(target)
        counts.append(len(positions))
    return dataclasses.replace(source, files=files, index_files=index_files, counts=counts)


def remove_subset_indexes(subset: Source, source: Source) -> None:
    """Delete the subset index files of `subset` (DALI reads indexes when it builds a pipeline)."""
    if subset is source or not subset.index_files:
        return
    own = set(source.index_files or [])
    for path in subset.index_files:
        if path not in own and os.path.dirname(path) == subset_folder():
            try:
                os.remove(path)
            except OSError:
                pass
