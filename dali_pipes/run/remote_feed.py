"""How a DALI reader gets the bytes of a remote source: the shard cache (default) or DALI's own reader.

    native  the reader gets the URLs; DALI reads each record with a ranged request. DALI 2.4 reads
            s3:// and gs:// itself (remote_urls.SCHEMES' `native`; gs:// configured from the layer's settings by
            remote.prepare_native); az://, hf:// and http(s):// have no native reader and always go
            through the cache.
    cache   the reader gets local paths in a ShardCache folder (shard_cache.py); whole shards are
            fetched in parallel ahead of it, and deleted once this rank has read past them.

Measured with 20 ms per request (dali_pipes_bench.s3_feed, 1 and 2 ranks): native reached
0.10-0.13x of local disk, the cache 0.84-1.21x. So "cache" is the default.

The cache works because DALI's TFRecord and file readers open a file only when they reach it: the
reader is built over `cache.path_for(info)` of every file, and before each batch `advance` makes
sure the files the reader may reach before the next batch are local. What the reader reaches is
DALI's contiguous slice of the data for this rank; in train mode (stick_to_shard=False) the slice
moves to the next rank's each epoch, counted from the pipeline's first epoch. The reader reads at
most `read_ahead` samples past what was consumed. Both come from reader.ReaderModel.

Restoring a DALI checkpoint mid-epoch replays the epoch from its start (DALI 2.4 re-reads the
samples before the checkpoint), so such a build needs the epoch's files up to the position local
at once: a cache too small for that raises CacheTooSmallError naming remote_feed="native".

Not fed by the cache, read natively instead: WebDataset tar shards (DALI's webdataset reader
opens every tar file when it is built) and an elastic resume's remainder epoch (a subset source). On a
scheme DALI cannot read, those are fetched whole into the cache first (`_whole`): it must hold them all.
"""

from __future__ import annotations

from dali_pipes.run.pipeline import PipelineSpec, reader_model
from dali_pipes.storage import remote, remote_urls
from dali_pipes.storage.remote import ClientOptions
from dali_pipes.storage.shard_cache import (
    DEFAULT_MAX_BYTES,
    DEFAULT_PREFETCH,
    CacheTooSmallError,
    ReadAheadGate,
    ShardCache,
)

FEEDS = ("cache", "native")
LAZY_KINDS = ("tfrecord", "folder", "file_list")  # DALI readers that open files only when they reach them


class RemoteFeed:
    """Turns a remote Source into what its DALI reader reads, and keeps the cache ahead of it."""

    def __init__(self, mode: str, spec: PipelineSpec, *, cache_dir: str | None = None,
                 cache_bytes: int = DEFAULT_MAX_BYTES, cache_prefetch: int = DEFAULT_PREFETCH,
                 options: ClientOptions | None = None) -> None:
        """`spec`: the rank's pipeline settings, its prefetch depth the deepest the pipeline may run (tuning).
        `options`: the loader's retries and timeouts, for the cache's downloads."""
        if mode not in FEEDS:
            raise ValueError(f"remote_feed must be one of {FEEDS}, got {mode!r}")
        self.mode, self.spec = mode, spec
        self.cache_dir, self.cache_bytes, self.cache_prefetch = cache_dir, cache_bytes, cache_prefetch
        self.options = options
        self.reader = reader_model(spec, 0, False)  # of the source, once dali_source sees it
        self.cache: ShardCache | None = None
        self._gate: ReadAheadGate | None = None
        self._first_epoch = 0  # loader epoch of the pipeline's reader epoch 0 (shard rotation)
        self._starts: dict[int, int] = {}  # loader epoch -> its first sample in the cache stream
        self._sizes: dict[int, int] = {}  # loader epoch -> samples the reader reads in it
        self._untouched = False  # a fresh build not yet advanced (see _renumber)
        self._pending_release: int | None = None  # consumed samples to release once a restore has replayed

    def dali_source(self, source, *, epoch: int, position: int, fresh: bool, subset: bool = False):
        """The source to build the reader over, for a build at (epoch, batch position).
        fresh: built without a checkpoint (its reader starts at reader epoch 0 now)."""
        self.close()
        if source.remote is None:
            return source
        native = _native(source)
        if self.mode == "native" and not native:
            raise ValueError(f"{source.location}: remote_feed='native' but DALI reads only "
                             f"{', '.join(s + '://' for s, e in remote_urls.SCHEMES.items() if e.native)} itself; "
                             f"use remote_feed='cache'")
        if self.mode == "native" or subset or source.kind not in LAZY_KINDS:
            if native:
                remote.prepare_native(source.remote[0].url, self.options)
                return source  # URLs that DALI reads itself
            return self._whole(source)
        if fresh:
            self._first_epoch = epoch
        self._untouched = fresh and not position
        self.cache = self._new_cache()
        try:
            return self._start(source, epoch, position)
        except BaseException as error:
            self.close()  # no download threads left behind by a loader that failed to build
            if not isinstance(error, CacheTooSmallError) or not position:
                raise
            raise CacheTooSmallError(f"{error}. A mid-epoch resume needs this epoch's shards up to the resumed "
                                     f"position in the cache at once (DALI replays the epoch): raise cache_bytes, "
                                     f"or use remote_feed='native'") from error

    def _new_cache(self) -> ShardCache:
        return ShardCache(folder=self.cache_dir, max_bytes=self.cache_bytes, prefetch=self.cache_prefetch,
                          options=self.options)

    def _whole(self, source):
        """The source over local copies of all its files, fetched now (a reader that opens every file
        when it is built, on a scheme DALI cannot read): the cache must hold them all."""
        import dataclasses
        self.cache = self._new_cache()
        try:
            self.cache.extend(source.remote)
            for position in range(len(source.remote)):
                self.cache.path(position)
        except BaseException:
            self.close()
            raise
        files = [self.cache.path_for(info) if path == info.url else path
                 for path, info in zip(source.files, source.remote)]
        return dataclasses.replace(source, files=files)

    def _start(self, source, epoch: int, position: int):
        """A new stream from (epoch, position), its first shards fetched; the source over cache paths."""
        import dataclasses
        self._source, self._starts, self._sizes = source, {}, {}
        self._counts = source.counts or [1] * len(source.files)
        self.reader = reader_model(self.spec, sum(self._counts), source.format.SHUFFLES_LIST)
        cache = self.cache
        assert cache is not None, "dali_source makes the cache first"
        self._gate = ReadAheadGate(cache, [], self.reader.read_ahead)
        self._extend(epoch)
        consumed = min(position * self.spec.batch_size, self._sizes[epoch])
        self._cover(consumed)
        # DALI replays a restored epoch from its start: hold it all until built() (a fresh one: nothing)
        self._gate.fetch(consumed + self.reader.read_ahead)
        self._pending_release = consumed if position else None
        # An excluded bad image was swapped for a local placeholder (recovery.py): it stays local.
        files = [cache.path_for(info) if path == info.url else path
                 for path, info in zip(source.files, source.remote)]
        return dataclasses.replace(source, files=files)

    def built(self) -> None:
        """After the pipeline is built (a restore has replayed): let go of what it passed."""
        if self._gate is not None and self._pending_release is not None:
            self._gate.advance(self._pending_release)
            self._pending_release = None

    def advance(self, epoch: int, position: int) -> None:
        """Before taking batch `position` of loader epoch `epoch`: keep the reader's reach local."""
        if self._gate is None:
            return
        self.built()
        if self._untouched and epoch != self._first_epoch and not position:
            self._renumber(epoch - self._first_epoch)
        self._untouched = False
        consumed = self._starts[epoch] + min(position * self.spec.batch_size, self._sizes[epoch])
        self._cover(consumed)
        self._gate.advance(consumed)

    def _renumber(self, shift: int) -> None:
        """A fresh pipeline built before the loader set its epoch (an elastic resume with nothing left
        of the old epoch): its reader epoch 0 is the loader's epoch now."""
        self._first_epoch += shift
        self._starts = {e + shift: v for e, v in self._starts.items()}
        self._sizes = {e + shift: v for e, v in self._sizes.items()}

    def _cover(self, consumed: int) -> None:
        """Extend the stream by whole epochs past what the reader may reach: it reads across epoch
        ends, past several epochs when an epoch is shorter than its read-ahead."""
        empty = 0  # a slice may be empty (fewer samples than ranks): stop after a whole rotation of them
        while sum(self._sizes.values()) <= consumed + self.reader.read_ahead and empty <= self.spec.shard.world_size:
            self._extend(max(self._starts) + 1)
            empty = empty + 1 if not self._sizes[max(self._starts)] else 0

    def _extend(self, epoch: int) -> None:
        """Append the shards the reader reads in `epoch` to the cache's stream."""
        taken = self.reader.files_of(self._counts, self.reader.shard_of(epoch - self._first_epoch))
        self._starts[epoch] = sum(self._sizes.values())
        self._sizes[epoch] = sum(n for _, n in taken)
        assert self.cache is not None and self._gate is not None, "_start makes them first"
        self.cache.extend([self._source.remote[i] for i, _ in taken])
        self._gate.extend([n for _, n in taken])

    def check_cache(self) -> None:
        """After a pipeline error: a shard cache folder deleted under the reader is named (FileNotFoundError),
        never searched for bad samples."""
        if self.cache is not None:
            self.cache.check_folder()

    def stats(self) -> dict | None:
        """The shard cache's figures (shard_cache.ShardCache.stats) and its folder, or None without a cache."""
        return {**self.cache.stats(), "folder": self.cache.folder} if self.cache is not None else None

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
        self.cache = self._gate = None


def _native(source) -> bool:
    """Whether DALI 2.4 reads the source's URLs itself."""
    return remote_urls.SCHEMES[remote_urls.scheme_of(source.remote[0].url) or "s3"].native
