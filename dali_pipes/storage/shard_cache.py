"""A bounded local cache of remote shards (any scheme of remote.py), fetched whole and ahead of the reader
that consumes them.

DALI's native s3:// reading sends one HTTP range request per record, so at 20 ms per request a
reader thread waits 20 ms per image. Fetching whole shards (one GET each, many in parallel) into
a local folder and letting DALI read local files removes the per-record round trip.

The consumer (one rank's loader) names the shards it will read, in order, as a *stream* of
positions: position i is the i-th shard read, and the same shard may come back at a later
position (the next epoch). Contract:
  * `local_path(i)` is where position i's shard will be, known before it is fetched, so a DALI
    reader can be built over the local paths at once (DALI opens a file only when it gets to it);
  * `path(i)` blocks until that file is complete and checked (size and ETag), and returns it;
  * `release(i)` says the consumer is done with position i; a file no unreleased position needs
    is deleted at once;
  * the shards of up to `prefetch` positions past the highest one asked for are fetched in
    parallel, in stream order, whenever they fit;
  * the bytes on disk (complete files plus downloads in progress, counted at their full size
    from their start) never exceed `max_bytes`: a download waits until releases make room, a
    shard larger than the bound is refused at once, and a consumer that asks for a shard that
    cannot fit beside the ones it still holds gets an error instead of a hang;
  * files are named by ObjectInfo.version (url, size, ETag, last-modified) and the end of the object's name
    (never a query string: remote_urls.identity), short for any file system: an object changed
    since listing gets a new name, and the download itself fails rather than fetch a changed
    object (If-Match);
  * each cache owns a private folder under `folder`, removed by close(); folders of dead
    processes on this host are removed at start (a SIGKILLed run leaves no shards behind).
One consumer thread calls path/release; downloads run on the cache's own daemon threads.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from tqdm import tqdm

from dali_pipes.storage import remote, remote_urls, transfer
from dali_pipes.storage.files import moved_by, pid_alive
from dali_pipes.storage.remote import ClientOptions
from dali_pipes.storage.remote_urls import ObjectInfo

CACHE_FLAG = "--cache-dir (another disk; DaliLoader's cache_dir) or a smaller --cache-bytes"

DEFAULT_MAX_BYTES = 8 << 30  # 8 GiB: dozens of typical 100-500 MB shards, small beside a dataset
DEFAULT_PREFETCH = 4  # shards ahead of the reader; with parallel GETs this hides request latency
MAX_WORKERS = 16  # parallel downloads at most, whatever the prefetch depth
NAME_TAIL = 40  # characters of an object's name in its file's: 4-byte UTF-8 and the temp suffix stay below 255 bytes


def default_cache_folder() -> str:
    """shards/ under the cache root ($DALI_PIPES_CACHE, else $XDG_CACHE_HOME or ~/.cache, /dali_pipes)."""
    from dali_pipes.storage.files import cache_root
    return os.path.join(cache_root(), "shards")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


class ShardTooLargeError(ValueError):
    """A shard bigger than the whole cache: it could never be fetched."""


class CacheTooSmallError(ValueError):
    """The consumer holds so many unreleased shards that the next one it asks for cannot fit."""


@dataclass
class _Entry:
    """One cached file: fetched once, shared by every position of the stream that names it."""
    info: ObjectInfo
    path: str
    held: int  # bytes counted against the bound: the full size from the download's start, 0 if it failed
    refs: int = 0  # scheduled positions not yet released
    state: str = "downloading"  # -> "ready" | "failed"
    error: BaseException | None = None


@dataclass
class _State:
    """Everything the download threads touch, apart from the ShardCache object itself, so that
    a cache dropped without close() is still garbage-collected (and its finaliser stops them)."""
    folder: str
    max_bytes: int
    prefetch: int
    client: remote.Backend | None  # None: the backend of each shard's scheme under `options`
    options: ClientOptions  # the retries and timeouts of the loader that made the cache
    progress: tqdm
    lock: threading.Condition = field(default_factory=lambda: threading.Condition(threading.Lock()))
    stop: threading.Event = field(default_factory=threading.Event)
    stream: list[ObjectInfo] = field(default_factory=list)
    released: list[bool] = field(default_factory=list)
    scheduled: dict[int, str] = field(default_factory=dict)  # position -> entry key, while unreleased
    entries: dict[str, _Entry] = field(default_factory=dict)
    queue: list[str] = field(default_factory=list)  # keys waiting for a worker, in stream order
    next_position: int = 0  # the first position not yet scheduled
    wanted: int = -1  # the highest position passed to path()
    used_bytes: int = 0  # complete files + downloads in progress (at full size)
    peak_bytes: int = 0
    downloads: int = 0
    downloaded_bytes: int = 0
    waited_s: float = 0.0  # time the consumer spent blocked in path(): the cache's share of data wait
    threads: list[threading.Thread] = field(default_factory=list)


class ShardCache:
    """Remote shards fetched ahead of a consumer into a bounded local folder (see module doc)."""

    def __init__(self, shards: Sequence[ObjectInfo] = (), *, folder: str | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES, prefetch: int = DEFAULT_PREFETCH,
                 workers: int | None = None, client: remote.Backend | None = None, progress: bool = False,
                 options: ClientOptions | None = None) -> None:
        """`options`: the retries and timeouts of the downloads (default: the calling thread's)."""
        if max_bytes < 1 or prefetch < 1:
            raise ValueError(f"max_bytes and prefetch must be >= 1, got {max_bytes} and {prefetch}")
        shards = list(shards)
        _check_sizes(shards, max_bytes)  # before any thread or folder exists
        root = folder or default_cache_folder()
        os.makedirs(root, exist_ok=True)
        _remove_dead_owners(root)
        private = tempfile.mkdtemp(dir=root, prefix=f"{_owner_prefix(os.getpid())}")
        bar = tqdm(desc="shard cache", unit="B", unit_scale=True, file=sys.stderr,
                   disable=None if progress else True)
        self._state = _State(private, max_bytes, prefetch, client, options or remote.current_options(), bar)
        self._finalizer = weakref.finalize(self, _shutdown, self._state)
        for i in range(workers or min(prefetch, MAX_WORKERS)):
            thread = threading.Thread(target=_worker, args=(self._state,), name=f"shard-cache-{i}", daemon=True)
            thread.start()
            self._state.threads.append(thread)
        self.extend(shards)

    @property
    def folder(self) -> str:
        """This cache's private folder (inside the `folder` it was given)."""
        return self._state.folder

    def __len__(self) -> int:
        return len(self._state.stream)

    def extend(self, shards: Iterable[ObjectInfo]) -> None:
        """Append shards to the stream (the next epoch's order, say). ShardTooLargeError, before
        anything is fetched, for a shard larger than max_bytes."""
        shards = list(shards)
        state = self._state
        _check_sizes(shards, state.max_bytes)
        with state.lock:
            state.stream.extend(shards)
            state.released.extend([False] * len(shards))
            _schedule(state)

    def local_path(self, position: int) -> str:
        """Where position's shard is (or will be) stored; does not fetch or wait."""
        return _entry_path(self._state, self._info(position))

    def path_for(self, info: ObjectInfo) -> str:
        """Where this cache stores `info`'s shard, whether or not it is in the stream: a DALI reader
        gets the whole dataset's list, and opens only the files of its own rank's range."""
        return _entry_path(self._state, info)

    def path(self, position: int, timeout: float | None = None) -> str:
        """The local path of position's shard once it is complete and checked; fetches it (and
        `prefetch` more) if needed. Raises the download's error (FileNotFoundError, DatasetError,
        PermissionError, ConnectionError), CacheTooSmallError, or TimeoutError after `timeout`."""
        state = self._state
        info = self._info(position)
        with state.lock:
            if state.released[position]:
                raise ValueError(f"position {position} ({info.url}) was released already")
            state.wanted = max(state.wanted, position)
            _schedule(state)
            started = time.monotonic()
            ready = state.lock.wait_for(lambda: _settled(state, position), timeout)
            state.waited_s += time.monotonic() - started
            if not ready:
                raise TimeoutError(f"{info.url}: not fetched within {timeout} s")
            if state.stop.is_set():
                raise RuntimeError("the shard cache is closed")
            entry = state.entries[state.scheduled[position]]
            self.check_folder()  # a download into a deleted folder fails too: name the folder, not the file
            if entry.state == "failed":
                assert entry.error is not None, "_finish sets both"
                raise entry.error
            return entry.path

    def check_folder(self) -> None:
        """FileNotFoundError naming the cache's folder and the flag if it was deleted while in use (a clean-up
        of the cache root): the shards fetched went with it, and DALI's reader fails on the next one it opens."""
        if not os.path.isdir(self._state.folder):
            raise FileNotFoundError(
                f"{self._state.folder}: the shard cache folder was deleted while the loader read from it (with the "
                f"shards fetched into it). Keep it while a loader runs, or give the loader a folder of its own with "
                f"--cache-dir (DaliLoader's cache_dir); a new loader makes the folder again and downloads anew")

    def release(self, position: int) -> None:
        """The consumer is done with position; its file goes once no unreleased position needs
        it. Releasing a position not yet fetched skips it (a resumed epoch)."""
        state = self._state
        self._info(position)
        with state.lock:
            if state.released[position]:
                return
            state.released[position] = True
            key = state.scheduled.pop(position, None)
            if key is not None:
                _drop_reference(state, key)
            _schedule(state)
            state.lock.notify_all()

    def stats(self) -> dict[str, float]:
        """downloads, downloaded_bytes, used_bytes now, peak_bytes since start, and waited_s: the
        seconds the consumer spent blocked in path()."""
        state = self._state
        with state.lock:
            return {"downloads": state.downloads, "downloaded_bytes": state.downloaded_bytes,
                    "used_bytes": state.used_bytes, "peak_bytes": state.peak_bytes,
                    "waited_s": round(state.waited_s, 3)}

    def close(self) -> None:
        """Stop the downloads (in-flight ones stop at their next chunk), wait for the threads,
        delete the private folder. Idempotent; also run when the cache is garbage-collected."""
        self._finalizer()

    def __enter__(self) -> "ShardCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _info(self, position: int) -> ObjectInfo:
        if not 0 <= position < len(self._state.stream):
            raise IndexError(f"position {position} outside the cache's stream of {len(self._state.stream)} shards")
        return self._state.stream[position]


def _check_sizes(shards: Sequence[ObjectInfo], max_bytes: int) -> None:
    for info in shards:
        if info.size > max_bytes:
            raise ShardTooLargeError(
                f"{info.url}: shard of {info.size} bytes ({_gib(info.size)}) is larger than the whole shard "
                f"cache ({max_bytes} bytes, {_gib(max_bytes)}); raise the cache size (max_bytes / cache_bytes) "
                f"above the largest shard, or write smaller shards")


class ReadAheadGate:
    """Keeps the shards a sequential reader is about to open local, and lets go of those it has
    passed. For a DALI reader over `cache.local_path` files, which opens a file only when it gets
    to it and reads at most `read_ahead` samples past what the consumer has taken (shuffle buffer
    plus prefetched batches).

    `counts[i]` is the number of samples the reader takes from stream position i. Call
    `advance(consumed)` before taking samples past `consumed`: it blocks until every position
    holding samples [0, consumed + read_ahead) is local, and releases every position whose samples
    all lie before `consumed` (the reader is past them: it has read at least what was consumed)."""

    def __init__(self, cache: ShardCache, counts: Sequence[int], read_ahead: int) -> None:
        if len(counts) > len(cache):
            raise ValueError(f"{len(counts)} sample counts for a cache stream of {len(cache)} shards")
        self.cache, self.read_ahead = cache, read_ahead
        self._ends = list(itertools.accumulate(counts))
        self._fetched = 0  # positions [0, _fetched) were waited for
        self._released = 0  # positions [0, _released) were released

    def extend(self, counts: Sequence[int]) -> None:
        """Counts of positions appended to the cache's stream since (the next epoch's slice)."""
        if len(self._ends) + len(counts) > len(self.cache):
            raise ValueError(f"{len(self._ends) + len(counts)} sample counts for a cache stream of "
                             f"{len(self.cache)} shards")
        self._ends += list(itertools.accumulate(counts, initial=self._ends[-1] if self._ends else 0))[1:]

    def advance(self, consumed: int) -> None:
        self.fetch(consumed + self.read_ahead)
        while self._released < self._fetched and self._ends[self._released] <= consumed:
            self.cache.release(self._released)
            self._released += 1

    def fetch(self, need: int) -> None:
        """Block until every position holding samples [0, need) is local; release nothing (a DALI
        checkpoint restore replays its epoch from the start: those files must all be there)."""
        while self._fetched < len(self._ends) and self._start(self._fetched) < need:
            self.cache.path(self._fetched)
            self._fetched += 1

    def _start(self, position: int) -> int:
        return self._ends[position - 1] if position else 0


# ---------------------------------------------------------------------------------------------
# Scheduling, under state.lock
# ---------------------------------------------------------------------------------------------

def _entry_path(state: _State, info: ObjectInfo) -> str:
    """A name any file system takes: the version (a hash of the object's identity, which holds no query string,
    size and ETag) and at most NAME_TAIL characters of the object's name, for people reading the folder."""
    return os.path.join(state.folder, f"{info.version}-{remote_urls.basename(info.url)[-NAME_TAIL:]}")


def _schedule(state: _State) -> None:
    """Schedule positions in stream order up to `prefetch` past the highest wanted one; stop at
    the first whose shard does not fit (never skip ahead: the next shard needed goes first)."""
    horizon = state.wanted + state.prefetch
    while state.next_position < len(state.stream) and state.next_position <= horizon and not state.stop.is_set():
        position = state.next_position
        if not state.released[position]:
            info = state.stream[position]
            entry = state.entries.get(info.version)
            if entry is None:
                if state.used_bytes + info.size > state.max_bytes:
                    return  # wait for releases to make room
                entry = state.entries[info.version] = _Entry(info, _entry_path(state, info), held=info.size)
                state.used_bytes += info.size
                state.peak_bytes = max(state.peak_bytes, state.used_bytes)
                state.queue.append(info.version)
                state.lock.notify_all()
            entry.refs += 1
            state.scheduled[position] = info.version
        state.next_position += 1


def _settled(state: _State, position: int) -> bool:
    """path()'s wait condition: the position's file is ready or failed, or the cache stopped.
    Raises CacheTooSmallError when it can never settle: it is not scheduled for lack of room,
    nothing is downloading, and only the consumer (waiting here) could release the room."""
    if state.stop.is_set():
        return True
    key = state.scheduled.get(position)
    if key is not None:
        return state.entries[key].state != "downloading"
    if any(entry.state == "downloading" for entry in state.entries.values()):
        return False  # a failure would free room; a success changes nothing: re-check then
    held = sum(entry.held for entry in state.entries.values())
    info = state.stream[state.next_position]
    raise CacheTooSmallError(
        f"{info.url}: the shard cache cannot hold this shard ({info.size} bytes) beside the {held} bytes of "
        f"shards still in use ({len(state.scheduled)} unreleased); its bound is {state.max_bytes} bytes "
        f"({_gib(state.max_bytes)}). Raise the cache size (max_bytes / cache_bytes), or release shards sooner")


def _drop_reference(state: _State, key: str) -> None:
    entry = state.entries[key]
    entry.refs -= 1
    if entry.refs == 0 and entry.state != "downloading":  # a download in flight is dropped when done
        _evict(state, key)


def _evict(state: _State, key: str) -> None:
    entry = state.entries.pop(key)
    if entry.state == "ready":
        with contextlib.suppress(FileNotFoundError):
            os.remove(entry.path)
    state.used_bytes -= entry.held


# ---------------------------------------------------------------------------------------------
# Download threads
# ---------------------------------------------------------------------------------------------

def _worker(state: _State) -> None:
    """Take the next queued shard, download it outside the lock, publish the result."""
    while True:
        with state.lock:
            state.lock.wait_for(lambda: state.queue or state.stop.is_set())
            if state.stop.is_set():
                return
            entry = state.entries[state.queue.pop(0)]
        error = _fetch(state, entry)
        with state.lock:
            _finish(state, entry, error)


def _fetch(state: _State, entry: _Entry) -> BaseException | None:
    try:
        with moved_by(CACHE_FLAG, entry.path), remote.options_in_force(state.options):
            transfer.download(entry.info, entry.path, client=state.client, stop=state.stop,
                            on_bytes=state.progress.update)
        return None
    except Exception as error:  # handed to the consumer by path(), not lost in this thread
        return error


def _finish(state: _State, entry: _Entry, error: BaseException | None) -> None:
    if error is None:
        entry.state = "ready"
        state.downloads += 1
        state.downloaded_bytes += entry.info.size
    else:
        # The entry stays, so that path() raises its error, but holds no room: the temporary
        # file is gone.
        entry.state, entry.error = "failed", error
        state.used_bytes -= entry.held
        entry.held = 0
    if entry.refs == 0:  # every position that needed it was released while it downloaded
        _evict(state, entry.info.version)
    _schedule(state)
    state.lock.notify_all()


# ---------------------------------------------------------------------------------------------
# Lifetime
# ---------------------------------------------------------------------------------------------

def _shutdown(state: _State) -> None:
    state.stop.set()
    with state.lock:
        state.lock.notify_all()
    deadline = time.monotonic() + 30  # an in-flight chunk read ends within the client's read timeout
    for thread in state.threads:
        if thread is not threading.current_thread():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    state.progress.close()
    shutil.rmtree(state.folder, ignore_errors=True)


def _owner_prefix(pid: int) -> str:
    return f"{socket.gethostname()}-pid{pid}-"


def _remove_dead_owners(root: str) -> None:
    """Remove private folders left by processes of this host that no longer run."""
    host = f"{socket.gethostname()}-pid"
    for name in os.listdir(root):
        if not name.startswith(host):
            continue
        pid_text = name[len(host):].split("-", 1)[0]
        if pid_text.isdigit() and not pid_alive(int(pid_text)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)

