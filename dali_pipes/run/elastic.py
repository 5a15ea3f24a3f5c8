"""Elastic resume: finish an interrupted epoch on a different number of ranks, each sample at most once.

Every rank records which samples it has delivered in the current epoch, as storage-order indices
(0..N-1 over `source.refs()`), in a bitmap that goes into the loader's state (delivery.py). Resuming on
a new world size:
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
from dataclasses import dataclass

import numpy as np

from dali_pipes.data.samples import required
from dali_pipes.data.source import Source
from dali_pipes.run.dist import Shard
from dali_pipes.run.pipeline import PipelineSpec


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
    subset: Source | None = None  # the subset source of the build in progress (inputs), removed by cleanup

    def inputs(self, source: Source, spec: PipelineSpec) -> tuple[Source, PipelineSpec]:
        """What the rank's pipeline reads: this part of the rest, in order, as one slice of a subset source,
        seeded per rank (ranks must not draw the same crops)."""
        self.subset = subset_source(source, self.indices)
        return self.subset, dataclasses.replace(spec, shard=Shard(0, 1, spec.shard.local_rank),
                                                seed=self.seed + spec.shard.rank)

    def cleanup(self, source: Source) -> None:
        """After a build: DALI has read the subset's index files."""
        if self.subset is not None:
            remove_subset_indexes(self.subset, source)
            self.subset = None


def check_states(states: list[dict], identity: dict, records: list[dict] | None = None) -> int:
    """The interrupted epoch of the old ranks' states (their loader parts; `records` their delivery records,
    else in `states` too), after checking that they fit this loader (same data, batch size, seed, train flag)
    and each other. Raises ValueError naming the fix."""
    keys = ("version", "num_samples", "batch_size", "seed", "train")
    for rank, (state, record) in enumerate(zip(states, records if records is not None else states)):
        differ = {k: (state.get(k), identity[k]) for k in keys if state.get(k) != identity[k]}
        if differ:
            raise ValueError(f"loader state of old rank {rank} does not fit this loader: (saved, now) = {differ}; "
                             f"an elastic resume needs the same data, batch size, seed and train flag")
        if "delivered" not in record:
            raise ValueError(f"loader state of old rank {rank} has no record of delivered samples (written by an "
                             f"older dali_pipes); resume it on its own world size ({state.get('world_size')})")
        if not record.get("delivered_complete", False):
            raise ValueError(f"loader state of old rank {rank}: some delivered samples of epoch {state['epoch']} "
                             f"could not be identified; resume it on its own world size ({state.get('world_size')})")
    old_world = {s.get("world_size") for s in states}
    if old_world != {len(states)}:
        shown = sorted(old_world, key=lambda w: -1 if w is None else w)  # None: a state that names none
        raise ValueError(f"pass the state of every old rank, in rank order: got {len(states)} states with world "
                         f"sizes {shown}")
    epochs = {s["epoch"] for s in states}
    if len(epochs) != 1:
        raise ValueError(f"the old ranks' states are in different epochs {sorted(epochs)}: take them at the same "
                         f"step (train.py's checkpoints are)")
    return epochs.pop()


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
        return Remainder(epoch, base, np.sort(rest[order[rank * take:(rank + 1) * take]]).tolist(), take,
                         remainder_seed)
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
    from dali_pipes.storage.files import cache_root
    return os.path.join(cache_root(), "elastic")


def subset_source(source: Source, indices: list[int], folder: str | None = None) -> Source:
    """`source` restricted to the samples `indices` (storage-order indices, repeats allowed), read
    in that order. Files: a shorter file list. Shards: per shard an index listing only the chosen
    records (DALI reads records by offset and size, so gaps are fine), written under `folder`."""
    if not source.format.SHARDED:
        labels = required(source.labels, source, "labels")
        return dataclasses.replace(source, files=[source.files[i] for i in indices],
                                   labels=[labels[i] for i in indices])
    read, write = source.sharded_format.read_index, source.sharded_format.write_index
    index_files = required(source.index_files, source, "index_files")
    starts = np.cumsum([0] + required(source.counts, source, "counts"))
    runs: list[tuple[int, list[int]]] = []  # (shard number, positions in it), consecutive per shard
    for i in indices:
        shard = int(np.searchsorted(starts, i, side="right") - 1)
        if not runs or runs[-1][0] != shard:
            runs.append((shard, []))
        runs[-1][1].append(int(i - starts[shard]))
    folder = folder or subset_folder()
    os.makedirs(folder, exist_ok=True)
    files, subset_indexes, counts = [], [], []
    for shard, positions in runs:
        entries = read(index_files[shard])
        key = f"{os.path.abspath(index_files[shard])}|{positions}|{os.getpid()}"  # the process id: ranks on
        tag = hashlib.sha1(key.encode()).hexdigest()[:16]  # one machine never share (or delete) each other's files
        target = os.path.join(folder, f"{tag}-{os.path.basename(index_files[shard])}")
        if not os.path.exists(target):
            write([entries[p] for p in positions], target)
        files.append(source.files[shard])
        subset_indexes.append(target)
        counts.append(len(positions))
    return dataclasses.replace(source, files=files, index_files=subset_indexes, counts=counts)


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
