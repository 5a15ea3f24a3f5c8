"""The sharding check: at the end of the first whole epoch, the ranks compare what they delivered.

Train: no sample delivered by two ranks. Val: every sample exactly once across the ranks. What each
rank delivered is the loader's delivery record (elastic.py: a bitmap over the samples in storage
order), N/8 bytes per rank. A failure is a DatasetError naming the ranks and the likely cause: every
rank built with rank=0, LOCAL_RANK passed as the rank on several nodes, a world size that is not
the process group's.

The bitmaps go through the process group's key-value store (c10d's TCPStore), not a collective:
rank 0 gathers them and posts the verdict. A store wait has a timeout, so a loop that iterates a
loader on some ranks only (validation on rank 0 alone) ends in an error naming the fix instead of a
collective that hangs, and the process group stays usable either way. Once per loader, skipped
without an initialised process group and for a loader built with world_size=1 (each rank reads
everything, as a DataLoader without a DistributedSampler does); `sharding_check=False` turns it off.

Before that, when the loaders are built, the ranks compare what they opened (`check_listings`): the count and
a hash of the files' names, sizes and versions (the source's fingerprint). Ranks that listed a prefix at
different moments (an object added between their listings, no manifest) would build loaders of different
lengths, and a DDP loop would hang in its first collective past the shorter epoch; they are refused on every
rank, naming what differs, as soon as every rank has opened its data.
"""

from __future__ import annotations

import datetime
import json
import socket
from collections import Counter
from typing import Callable

import numpy as np

from dali_pipes.data import fingerprint
from dali_pipes.errors import DatasetError
from dali_pipes.run.dist import Shard
from dali_pipes.run.hooks import BatchHook, RankView

TIMEOUT_S = 300  # for the other ranks to end the same epoch (they run the same number of batches)
LISTING_TIMEOUT_S = 300  # for the other ranks to open their data (one may build indexes meanwhile)
_CALLS: Counter = Counter()  # per process: the n-th check of a loader with this key (ranks agree on n)


class ShardingCheck(BatchHook):
    """The check as a hook: once per loader, at the end of the first epoch it ran whole (from its first
    batch, on this world's own pipeline, not an elastic resume's remainder)."""

    def __init__(self, enabled: bool, *, every_sample: bool) -> None:
        self.enabled, self.every_sample = enabled, every_sample  # every_sample: val promises full cover
        self.whole_epoch = False

    def begin_epoch(self, rank: RankView, batches: int) -> None:
        self.whole_epoch = rank.position.batch == 0 and rank.remainder is None

    def end_epoch(self, rank: RankView) -> None:
        if self.enabled and self.whole_epoch:
            self.enabled = False  # once per run
            source = rank.source
            check_delivery(rank.record, rank.spec.shard, train=rank.spec.train, every_sample=self.every_sample,
                           location=source.location, excluded=len(rank.policy.bad_samples),
                           name_of=lambda i: str(source.refs()[i]))


def check_delivery(record, shard: Shard, *, train: bool, every_sample: bool, location: str, excluded: int,
                   name_of: Callable[[int], str] | None = None, timeout_s: float = TIMEOUT_S) -> None:
    """Raise DatasetError, on every rank, when the ranks' deliveries of the epoch overlap (or, in val
    when `every_sample` is promised, leave samples out). `excluded`: this rank's bad samples excluded
    so far (never delivered). Samples whose identity another shares (a file listed twice, the
    placeholders of excluded samples) are left out of the comparison: which of them a rank delivered
    is not known."""
    import torch.distributed as dist
    if shard.world_size < 2:  # built to read everything on each rank (DataLoader without a sampler): no shards
        return
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    store = _store()
    if store is None:
        return
    base = f"dali_pipes/sharding/{'train' if train else 'val'}"  # the same on every rank, whatever its data
    _CALLS[base] += 1
    key, me, world = f"{base}/{_CALLS[base]}", dist.get_rank(), dist.get_world_size()
    repeated = record.repeated()
    header = {"rank": shard.rank, "world_size": shard.world_size, "local_rank": shard.local_rank,
              "host": socket.gethostname(), "complete": bool(record.complete), "excluded": excluded,
              "location": location, "num_samples": len(record.delivered), "every_sample": every_sample}
    bits = np.packbits(record.delivered & ~repeated).tobytes()
    store.set(f"{key}/{me}", json.dumps(header).encode() + b"\n" + bits)
    wait = datetime.timedelta(seconds=timeout_s)
    if me == 0:
        names = [f"{key}/{r}" for r in range(world)]
        _wait(store, names, wait, "the other ranks")
        verdict = judge([_parse(store.get(k)) for k in names], train=train, location=location, name_of=name_of,
                        ignored=repeated)
        store.set(f"{key}/verdict", verdict.encode())
        for k in names:
            store.delete_key(k)
    else:
        _wait(store, [f"{key}/verdict"], wait, "rank 0")
        verdict = store.get(f"{key}/verdict").decode()
    if verdict:
        raise DatasetError(verdict)


def check_listings(source, shard: Shard, timeout_s: float = LISTING_TIMEOUT_S) -> None:
    """Raise DatasetError, on every rank, when the ranks opened different data (see the module doc): each rank
    posts its fingerprint's count, bytes and digest to the process group's store; where they differ, rank 0 and
    the first rank that differs post their whole fingerprints, so that every rank names the same difference."""
    import torch.distributed as dist
    mine = getattr(source, "fingerprint", None)
    if mine is None or shard.world_size < 2 or not (dist.is_available() and dist.is_initialized()) \
            or dist.get_world_size() < 2:
        return
    store = _store()
    if store is None:
        return
    _CALLS["dali_pipes/listing"] += 1
    key, me, world = f"dali_pipes/listing/{_CALLS['dali_pipes/listing']}", dist.get_rank(), dist.get_world_size()
    wait = datetime.timedelta(seconds=timeout_s)
    store.set(f"{key}/{me}", json.dumps({k: mine[k] for k in ("files", "bytes", "digest")}))
    summaries = [json.loads(v) for v in _listing_wait(store, [f"{key}/{r}" for r in range(world)], wait)]
    differs = next((r for r, summary in enumerate(summaries) if summary["digest"] != summaries[0]["digest"]), 0)
    if differs:
        if me in (0, differs):
            store.set(f"{key}/whole/{me}", json.dumps(mine))
        first, other = (json.loads(v) for v in _listing_wait(store, [f"{key}/whole/0", f"{key}/whole/{differs}"],
                                                               wait))
    if store.add(f"{key}/read", 1) == world:  # the last rank to read them clears the keys
        for name in [f"{key}/{r}" for r in range(world)] + [f"{key}/whole/0", f"{key}/whole/{differs}", f"{key}/read"]:
            store.delete_key(name)
    if differs:
        raise DatasetError(source.location, f"the ranks opened different data (rank 0: {first['files']} files of "
                                            f"{first['bytes']} bytes; rank {differs}: {other['files']} files of "
                                            f"{other['bytes']} bytes; {_difference(first, other, differs)}), so their "
                                            f"loaders would differ in length and a DDP loop would hang",
                           "Every rank must open the same data: do not add, remove or replace files while the ranks "
                           "list them, or name them in a file list (or a manifest) that every rank reads")


def _listing_wait(store, keys: list[str], timeout: datetime.timedelta) -> list[bytes]:
    _waited(store, keys, timeout, "comparing the ranks' data: the other ranks did not open theirs",
            "Is this loader built on some ranks only? Build it on every rank")
    return [store.get(k) for k in keys]


def _difference(first: dict, other: dict, rank: int) -> str:
    """What rank `rank` lists that rank 0 does not, and the reverse, in a few names."""
    if "entries" not in first or "entries" not in other:
        return fingerprint.changes(first, other) or "their names, sizes or versions differ"
    ours, theirs = ({row[0]: row[1:] for row in fp["entries"]} for fp in (first, other))
    added, gone = [n for n in theirs if n not in ours], [n for n in ours if n not in theirs]
    changed = [n for n in ours if n in theirs and ours[n] != theirs[n]]
    parts = ([f"only rank {rank} lists {_few(added)}"] if added else []) + \
        ([f"only rank 0 lists {_few(gone)}"] if gone else []) + \
        ([f"{_few(changed)} differ in size or version"] if changed else [])
    return "; ".join(parts) or "the order of their files differs"


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _store():
    """The default process group's store (c10d keeps it private; None where this torch has none)."""
    from torch.distributed import distributed_c10d
    getter = getattr(distributed_c10d, "_get_default_store", None)
    try:
        return getter() if getter is not None else None
    except RuntimeError:
        return None


def _wait(store, keys: list[str], timeout: datetime.timedelta, who: str) -> None:
    _waited(store, keys, timeout, f"sharding check: {who} did not end the same epoch",
            "Does the loop iterate this loader on some ranks only (validation on rank 0 alone)? Every rank reads its "
            "own part: iterate it on all ranks")


def _waited(store, keys: list[str], timeout: datetime.timedelta, problem: str, fix: str) -> None:
    """store.wait; its timeout a DatasetError: `problem` within the timeout, then `fix` and the ways out."""
    try:
        store.wait(keys, timeout)
    except RuntimeError as error:  # a timeout; the store and the process group stay usable
        raise DatasetError(
            f"{problem} within {timeout.total_seconds():.0f} s ({error}). {fix}, or build it with rank=0, "
            f"world_size=1 where only one reads, or pass sharding_check=False (--no-sharding-check)") from None


def _parse(payload: bytes) -> tuple[dict, np.ndarray]:
    header, bits = payload.split(b"\n", 1)
    header = json.loads(header)
    return header, np.unpackbits(np.frombuffer(bits, np.uint8), count=header["num_samples"]).astype(bool)


def judge(ranks: list[tuple[dict, np.ndarray]], *, train: bool, location: str,
          name_of: Callable[[int], str] | None = None, ignored: np.ndarray | None = None) -> str:
    """"" when the deliveries are a valid sharding, else the message (ranks in process-group order).
    `ignored`: samples left out of the comparison (shared identities). Processes built on fewer shards
    than the group has (data-parallel groups of a hybrid-parallel job: world_size < the group's) are
    compared one per shard."""
    headers = [header for header, _ in ranks]
    data = {(h["location"], h["num_samples"]) for h in headers}
    if len(data) > 1:
        seen = "; ".join(f"process {i}: {h['num_samples']} samples of {h['location']}" for i, h in enumerate(headers))
        return (f"sharding check ({'train' if train else 'val'}): the ranks opened different data ({seen}). "
                f"Every rank must open the same data (same files, same order)")
    if not all(h["complete"] for h in headers):
        return ""  # a rank could not identify some samples it delivered: nothing certain to compare
    sizes, procs = {h["world_size"] for h in headers}, list(range(len(ranks)))
    if len(sizes) == 1 and sizes.pop() < len(ranks) and len({h["rank"] for h in headers}) == headers[0]["world_size"]:
        firsts: dict[int, int] = {}  # {shard: the first process that reads it}
        for process, header in enumerate(headers):
            firsts.setdefault(header["rank"], process)
        procs = sorted(firsts.values())
        ranks = [ranks[p] for p in procs]  # one process per shard: the others are data-parallel replicas
    counts = np.zeros(len(ranks[0][1]), np.uint16)
    for _, delivered in ranks:
        counts += delivered
    twice = np.flatnonzero(counts > 1)
    missing = np.flatnonzero((counts == 0) & (~ignored if ignored is not None else True))
    excluded = sum(header["excluded"] for header, _ in ranks)
    if twice.size:
        first = int(twice[0])
        holders = [procs[r] for r, (_, delivered) in enumerate(ranks) if delivered[first]]
        sample = name_of(first) if name_of else f"sample {first}"
        problem = (f"ranks {_join(holders)} all delivered {sample}; {twice.size} samples went to more than one "
                   f"rank this epoch")
    elif not train and headers[0].get("every_sample", True) and missing.size > excluded:
        sample = name_of(int(missing[0])) if name_of else f"sample {int(missing[0])}"
        problem = f"no rank delivered {sample} ({missing.size} samples were left out of validation)"
    else:
        return ""
    return f"sharding check of {location} ({'train' if train else 'val'}): {problem}. {cause(ranks)}"


def cause(ranks: list[tuple[dict, np.ndarray]]) -> str:
    """The likely mistake, from what each process was built with against its place in the group."""
    headers = [header for header, _ in ranks]
    world = len(headers)
    built = Counter(h["rank"] for h in headers)
    same = [(r, [i for i, h in enumerate(headers) if h["rank"] == r]) for r, c in built.items() if c > 1]
    sizes = sorted({h["world_size"] for h in headers})
    if same:
        r, procs = same[0]
        as_local = all(h["rank"] == h["local_rank"] for h in headers) and any(
            h["local_rank"] != i for i, h in enumerate(headers))
        if as_local:
            hint = ("each was built with its LOCAL_RANK as the rank, which repeats on every node: the rank is "
                    "RANK, the global one (rank=int(os.environ['RANK']), or leave rank unset)")
        elif r == 0 and len(procs) == world:
            hint = "every rank was built with rank=0: pass rank=int(os.environ['RANK']) (or leave rank unset)"
        else:
            hint = "each process must be built with its own global rank (RANK)"
        return (f"Likely cause: processes {_join(procs)} of the process group were all built with rank={r} "
                f"(world_size {sizes}); {hint}.")
    if sizes != [world]:
        return (f"Likely cause: the loaders were built with world_size {sizes} but the process group has {world} "
                f"processes: pass world_size=int(os.environ['WORLD_SIZE']) (or leave it unset).")
    return ("The ranks were built with distinct ranks and the right world size, so their datasets differ: every "
            "rank must open the same data (same files, same order).")


def _join(items: list[int]) -> str:
    shown = ", ".join(str(i) for i in items[:8])
    return shown + (f" and {len(items) - 8} more" if len(items) > 8 else "")
