"""What this rank has delivered this epoch, sample by sample, named by DALI itself.

The pipeline's third output is the reader's per-sample `source_info` (a file's path, "<shard> at index
<byte offset>" for TFRecord, "<tar>:<data offset>:<member>" for WebDataset; checked on DALI 2.4.0),
padded to a dense uint8 row (data/reader.identity_rows). `IdentityTable` maps it back to the sample's index in storage
order, and `DeliveryRecord` keeps the epoch's bitmap of delivered samples: an elastic resume skips them
(elastic.py), the sharding check compares the ranks' bitmaps (sharding.py).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from dali_pipes.data.formats import format_of_ref, sharded_format_of
from dali_pipes.data.samples import required
from dali_pipes.data.source import Source

IDENTITY_CHECKED_DALI = "2.4.0"  # the source_info formats below were read off this DALI version


# ---------------------------------------------------------------------------------------------



def identity(ref) -> str:
    """The source_info DALI reports for the sample `ref` names (the format module knows its form)."""
    return format_of_ref(ref).source_info(ref)


def split_identity(kind: str, key: str) -> tuple[str, int]:
    """(shard path, byte offset) of a sharded format's source_info; ("", -1) if it has another form
    (not as on DALI 2.4.0: counted as unidentified, never a crash mid-training)."""
    try:
        return sharded_format_of(kind).split_source_info(key)
    except ValueError:  # sharded_format_of's too: an image kind has no (shard, offset) form
        return "", -1


class IdentityTable:
    """source_info -> storage-order index, for one source, kept small for ImageNet-sized data:
    files by a sorted array of their hashes, shards by their sample offsets (read per shard when
    first met). Repeated identities (a file listed twice, the placeholders of excluded samples)
    resolve to the first of their indices not yet marked."""

    def __init__(self, source: Source) -> None:
        self._source, self._sharded = source, source.format.SHARDED  # read once: mark runs every batch
        if self._sharded:
            self._shard_of = {path: i for i, path in enumerate(source.files)}
            self._starts = np.cumsum([0] + required(source.counts, source, "counts"))
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
        find = self._find_shard_samples if self._sharded else self._find_files
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
            source = self._source
            one = dataclasses.replace(source, files=[source.files[shard]],
                                      index_files=[required(source.index_files, source, "index_files")[shard]],
                                      counts=[required(source.counts, source, "counts")[shard]])
            offsets = np.array([ref.offset for ref in one.refs()], np.int64)
            order = np.argsort(offsets, kind="stable")
            self._offsets[shard] = offsets[order], order
        return self._offsets[shard]


class DeliveryRecord:
    """Which samples this rank has delivered in the current epoch: a bitmap over storage order, marked from
    DALI's own sample identities. What an elastic resume must skip, and what the sharding check compares."""

    def __init__(self, num_samples: int) -> None:
        self.delivered = np.zeros(num_samples, bool)
        self.complete = True  # False once a delivered sample could not be identified
        self._table: IdentityTable | None = None
        self._table_of: Source | None = None

    def bind(self, source: Source) -> None:
        """Identify samples of `source` from now on (a new table after bad samples were excluded)."""
        if self._table_of is not source:
            self._table, self._table_of = IdentityTable(source), source

    def add(self, ids, count: int) -> None:
        """Mark the first `count` rows of a batch's sample_ids output as delivered."""
        rows = ids.cpu().numpy() if hasattr(ids, "cpu") else np.asarray(ids)
        assert self._table is not None, "bind(source) comes first"  # RankPipeline binds at every build
        missing = self._table.mark([row.tobytes().rstrip(b"\0").decode() for row in rows[:count]], self.delivered)
        if missing and self.complete:
            warnings.warn(f"elastic resume: cannot identify delivered sample {missing[0]!r} (DALI's source_info "
                          f"format was checked on DALI {IDENTITY_CHECKED_DALI}); this epoch's state can only "
                          f"resume on the same world size", stacklevel=1)  # about the run, not a caller
        self.complete = self.complete and not missing

    def repeated(self) -> np.ndarray:
        """Samples of the bound source whose identity another shares (IdentityTable.repeated)."""
        return self._table.repeated() if self._table is not None else np.zeros(len(self.delivered), bool)

    def end_epoch(self) -> None:
        """Start the next epoch's record."""
        self.delivered[:] = False
        self.complete = True

    def state(self, epoch_done: bool) -> dict:
        """The record for the loader's state. After an epoch's last batch the state names the next
        epoch, which has delivered nothing yet."""
        delivered = np.zeros_like(self.delivered) if epoch_done else self.delivered
        return {"delivered": pack(delivered), "delivered_complete": epoch_done or self.complete}

    def restore(self, state: dict, num_samples: int) -> None:
        """Take back what state() gave (resume.upgrade says where older states leave completeness unsaid)."""
        self.delivered = unpack(state["delivered"], num_samples) if state.get("delivered") else \
            np.zeros(num_samples, bool)
        self.complete = state.get("delivered_complete", False)

    @staticmethod
    def merged(states: list[dict], num_samples: int) -> np.ndarray:
        """What every old rank's record (state()) delivered together: an elastic resume's base."""
        union = np.zeros(num_samples, bool)
        for state in states:
            union |= unpack(state["delivered"], num_samples)
        return union


def pack(bitmap: np.ndarray) -> bytes:
    return np.packbits(bitmap).tobytes()


def unpack(data: bytes, num_samples: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(data, np.uint8), count=num_samples).astype(bool)
