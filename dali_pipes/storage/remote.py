"""Remote objects of every scheme through one layer: the clients, their retries, listing, metadata.

    s3://bucket/key                  boto3 (object_store.py: s3fs would pin a botocore older than boto3's)
    gs://bucket/key                  gcsfs; STORAGE_EMULATOR_HOST, else Google's default credentials
    az://container/key, abfs://...   adlfs; AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with
                                     AZURE_STORAGE_ACCOUNT_KEY, else Azure's default credential
    hf://datasets/ORG/NAME/path      huggingface_hub's HfFileSystem; HF_TOKEN, HF_ENDPOINT; NAME@REVISION for a
                                     branch, tag or commit (NAME@refs/convert/parquet too); read-only
    http(s)://host/path              fsspec's HTTPFileSystem; read-only, never listed: give URLs or a list of them

The per-scheme code (a `Backend`, in object_store.py and fs.py) is only what differs: making the client
with its credentials, mapping an object's metadata to `ObjectInfo`, pinning a read to the listed version,
and telling its errors apart. Everything else is here and the same for every scheme:
  * listing with local-glob semantics (a wildcard never crosses "/"), sorted by key;
  * every request tried up to `attempts` times with jittered backoff, under explicit timeouts
    (`ClientOptions`): a short outage is ridden out, a long one is ConnectionError naming the endpoint;
  * failures as built-in types whose one-line message names the URL, what failed and the fix:
        FileNotFoundError   missing bucket, missing object, nothing matches, object deleted since listing
        PermissionError     no credentials, access denied
        ConnectionError     endpoint unreachable or timing out after the bounded retries (UnreachableError);
                            a download not done within its deadline (DownloadTooSlowError: never retried)
        DatasetError        an object changed since it was listed, a truncated download
        ImportError         the scheme's backend is not installed: names the extra (errors.install_hint)
  * every download (and ranged read) has an overall deadline (`ClientOptions.deadline`, --download-deadline):
    a store that keeps sending, too slowly for any read timeout to fire, is warned of at a quarter of it and
    ends at it; a server that ignores Range requests (answers 200 with the whole body) is read from the
    whole object it sent;
  * ObjectInfo (size, ETag, generation) keys the shard cache and the index cache, and every read is
    checked against it.

The layer's other rooms: remote_urls.py names objects (the table of schemes, URL parsing, globs, ObjectInfo) and
transfer.py reads and writes them (ranged reads, checked downloads, uploads, deletes).

Retries are per loader: `options_in_force(options)` sets them for the calls of one thread (a DaliLoader
opens its dataset under its own, and hands them to its shard cache's threads); `configure` sets the
process's default for calls made outside any loader.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import importlib
import itertools
import logging
import os
import random
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, TypeVar

from dali_pipes.errors import DatasetError, install_hint
from dali_pipes.storage import redact
from dali_pipes.storage.remote_urls import (
    SCHEMES,
    WILDCARDS,
    ObjectInfo,
    RemoteUrl,
    Scheme,
    bucket_noun,
    glob_matches,
    has_wildcard,
    identity,
    scheme_of,
)

RETRY_HINT = ("--storage-attempts / --storage-timeout (DaliLoader's storage_attempts / storage_timeout) "
              "set how long to keep trying")
DEADLINE_HINT = "--download-deadline (DaliLoader's download_deadline)"
SLOW_FRACTION = 0.25  # a download still running at this fraction of its deadline is warned of, with its progress
BACKOFF_BASE_S, BACKOFF_CAP_S = 1.0, 16.0  # waits 1, 2, 4, 8, 16, 16 ... s, each times a jitter in [0.5, 1)
log = logging.getLogger("dali_pipes")
T = TypeVar("T")
# ---------------------------------------------------------------------------------------------
# Retries and timeouts: per loader (a context variable), with a process default
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ClientOptions:
    """Timeouts and retries of the clients; each scheme's own chain still decides endpoint and credentials.
    The SDKs try each request once: `retrying` tries it `attempts` times with backoff, so that the
    total wait is known (the defaults: at least 31.5 s over 8 attempts) and the error says it."""
    connect_timeout: float = 5.0  # seconds per connection attempt (at most `timeout`)
    read_timeout: float = 20.0  # seconds without a byte from the server: --storage-timeout
    attempts: int = 8  # tries per request: --storage-attempts
    max_pool_connections: int = 32  # >= parallel downloads, else they queue for a connection
    # seconds one whole download (or one ranged read, its retries included) may take: --download-deadline. A
    # store sending a few bytes a second never trips the read timeout; this ends it (10 min: 1 GB at 1.7 MB/s)
    deadline: float = 600.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.read_timeout <= 0:
            raise ValueError(f"storage_attempts must be >= 1 and storage_timeout > 0, got {self.attempts} and "
                             f"{self.read_timeout}")
        if not self.deadline > 0:
            raise ValueError(f"download_deadline must be > 0 seconds, got {self.deadline}")

    @classmethod
    def of(cls, attempts: int | None = None, timeout: float | None = None,
           base: "ClientOptions | None" = None, deadline: float | None = None) -> "ClientOptions":
        """`base` (default: the process's) with these attempts, timeout (seconds to connect, capped at 5,
        or to wait for the next bytes) and deadline (seconds per download); None keeps its value."""
        options = base or _default_options
        if deadline is not None:
            options = dataclasses.replace(options, deadline=deadline)
        if attempts is not None:
            options = dataclasses.replace(options, attempts=attempts)
        if timeout is not None:
            options = dataclasses.replace(options, read_timeout=timeout, connect_timeout=min(5.0, timeout))
        return options

    def min_wait(self) -> float:
        """The least time, in seconds, spent waiting between tries before a request fails."""
        return sum(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** k) / 2 for k in range(self.attempts - 1))


_default_options = ClientOptions()
_active: contextvars.ContextVar[ClientOptions | None] = contextvars.ContextVar("dali_pipes_store_options",
                                                                              default=None)


def configure(attempts: int | None = None, timeout: float | None = None,
              deadline: float | None = None) -> ClientOptions:
    """The process's default retries, timeout and download deadline, for calls made outside a loader's
    `options_in_force`; None keeps the current value. Returns the default now in force."""
    global _default_options
    _default_options = ClientOptions.of(attempts, timeout, _default_options, deadline)
    return _default_options


def current_options() -> ClientOptions:
    """The options of this thread's calls: its loader's (`options_in_force`), else the process's default."""
    return _active.get() or _default_options


@contextlib.contextmanager
def options_in_force(options: ClientOptions | None) -> Iterator[ClientOptions]:
    """Run the block's remote calls (this thread's) under `options`; None: the current ones."""
    token = _active.set(options or current_options())
    try:
        yield current_options()
    finally:
        _active.reset(token)


def backoff_delays(attempts: int, rng: random.Random | None = None) -> Iterator[float]:
    """The waits between `attempts` tries: 1, 2, 4, 8, 16, 16 ... s, each times a jitter in [0.5, 1)
    (ranks that lost the store together do not come back in step)."""
    draw = (rng or random).random
    for k in range(attempts - 1):
        yield min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** k) * (0.5 + draw() / 2)


# ---------------------------------------------------------------------------------------------
# What each scheme provides
# ---------------------------------------------------------------------------------------------

class Backend(Protocol):
    """One scheme's client under one ClientOptions. Its calls raise the SDK's own errors; `translate` turns
    them into the clear ones above. `retrying` (here) tries each call; a backend never retries itself."""
    service: str  # "S3", "GCS", ...: "cannot reach the GCS endpoint ..."
    endpoint_hint: str  # how to point the scheme at another endpoint ("check STORAGE_EMULATOR_HOST ...")

    def endpoint(self, url: str = "") -> str:
        """Where requests for `url` go (the server of an http URL), for messages."""
        ...
    def list_prefix(self, bucket: str, prefix: str, url: str, page_size: int) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, recursively; may call `retrying` per page."""
        ...
    def head(self, url: RemoteUrl) -> ObjectInfo: ...
    def read(self, info: ObjectInfo, start: int, end: int, deadline: "Deadline | None" = None) -> bytes:
        """Bytes [start, end) of the object, pinned to info's version where the store can; a request still
        running at the deadline ends in its error."""
        ...
    def stream(self, info: ObjectInfo, chunk_bytes: int, deadline: "Deadline") -> Iterator[bytes]:
        """The whole object in order (each request tried by `retrying`) by the deadline; checks are the caller's."""
        ...
    def upload(self, path: str, url: RemoteUrl) -> None: ...
    def delete(self, url: RemoteUrl) -> None: ...
    def bucket_exists(self, url: RemoteUrl) -> bool: ...
    def translate(self, error: Exception, url: str, expected: ObjectInfo | None) -> Exception:
        """The clear exception for an SDK failure on `url`; `error` itself when it is none of the known kinds."""
        ...
    def retryable(self, error: Exception) -> bool:
        """Whether an untranslated error (a 5xx, a throttle) may succeed on another try."""
        ...


class MissingBackendError(ImportError):
    """A URL whose scheme's SDK is not installed."""


def backend_for(url: str | RemoteUrl, options: ClientOptions | None = None) -> Backend:
    """The backend of the URL's scheme under `options` (default: this thread's), made once per
    (process, scheme, options, environment): clients are slow to make and not fork-safe."""
    scheme = scheme_of(url)
    if scheme is None:
        raise ValueError(f"{url!r}: not a remote URL")
    entry = SCHEMES[scheme]
    return _cached_backend(os.getpid(), entry, options or current_options(), _environment())


# Variables that select an endpoint or identity: a client made under other values is not reused.
ENV_PREFIXES = ("AWS_", "STORAGE_EMULATOR_HOST", "GOOGLE_", "GCSFS_", "AZURE_", "HF_", "DALI_GCS_")


def _environment() -> tuple:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)))


@functools.lru_cache(maxsize=16)
def _cached_backend(pid: int, entry: Scheme, options: ClientOptions, environment: tuple) -> Backend:
    try:
        module = importlib.import_module(entry.module)
        return getattr(module, entry.backend)(options)
    except ImportError as error:
        raise MissingBackendError(
            f"{entry.backend.removesuffix('Backend')} URLs need a package that is not installed "
            f"({error.name or error}): {install_hint(entry.extra)}") from error


def prepare_native(url: str, options: ClientOptions | None = None) -> dict[str, str]:
    """Set, where unset, the variables DALI's own reader of `url`'s scheme needs to reach the store this layer
    reaches (a backend's `native_environment`: gs:// DALI_GCS_*); DALI is configured by nothing else, and reads
    them when its client is first made in a process. Returns those set now."""
    wanted: dict[str, str] = getattr(backend_for(url, options), "native_environment", dict)()
    added = {name: value for name, value in wanted.items() if name not in os.environ}
    os.environ.update(added)
    if added:
        log.info("for DALI's own %s:// reader: %s", scheme_of(url), " ".join(f"{k}={v}" for k, v in added.items()))
    return added


# ---------------------------------------------------------------------------------------------
# Errors and retries
# ---------------------------------------------------------------------------------------------

class ObjectChangedError(DatasetError):
    """An object replaced after it was listed: reading on would mix two versions of a shard."""


class TruncatedDownloadError(DatasetError):
    """Fewer bytes arrived than the object holds: the connection closed early."""


class UnreachableError(ConnectionError):
    """A request that failed on every one of its attempts: the store is down or unreachable."""


class DownloadTooSlowError(UnreachableError):
    """A download (or ranged read) not done by its deadline: a store that answers, too slowly. Never retried."""


class Cancelled(Exception):
    """A streaming read stopped because its `stop` event was set (a cache closing)."""


class Deadline:
    """When one download (or ranged read, its retries included) must be done, and how far it got: a request
    still running then is cancelled (every fsspec scheme) or its connection shut (s3: object_store.cut_at),
    and ends in DownloadTooSlowError naming the object and the flag. `warn`: a timer logs a download still
    running at SLOW_FRACTION of the deadline, with its progress."""

    def __init__(self, info: ObjectInfo, seconds: float | None = None, *, warn: bool = False) -> None:
        self.info, self.seconds = info, current_options().deadline if seconds is None else seconds
        self.started = time.monotonic()
        self.until, self.got = self.started + self.seconds, 0
        self._timer: threading.Timer | None = None
        if warn:
            self._timer = threading.Timer(self.seconds * SLOW_FRACTION, self._warn)
            self._timer.daemon = True
            self._timer.start()

    def left(self) -> float:
        """Seconds left; DownloadTooSlowError once none are."""
        left = self.until - time.monotonic()
        if left <= 0:
            raise self.error()
        return left

    def passed(self) -> bool:
        return time.monotonic() >= self.until

    def error(self) -> DownloadTooSlowError:
        return DownloadTooSlowError(
            f"{self.info.url}: not downloaded within {self.seconds:g} s ({self.got} of {self.info.size} bytes had "
            f"arrived): the store or the network is too slow. Check them, or raise {DEADLINE_HINT} for objects "
            f"this large")

    def _warn(self) -> None:
        elapsed = time.monotonic() - self.started
        log.warning("%s: slow download: %d of %d bytes in %.0f s (%.1f KB/s); it fails at %g s (%s)", self.info.url,
                    self.got, self.info.size, elapsed, self.got / elapsed / 1e3, self.seconds, DEADLINE_HINT)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def changed_error(url: str, expected: ObjectInfo | None, how: str) -> ObjectChangedError:
    was = f" (listed with size {expected.size}, ETag {expected.etag})" if expected else ""
    return ObjectChangedError(f"{url}: the object changed after it was listed{was}: {how}. The dataset must not "
                              f"change while it is read: restore it, or list it again and rebuild its indexes")


def disappeared_error(url: str, expected: ObjectInfo) -> FileNotFoundError:
    return FileNotFoundError(f"{url}: the object disappeared after it was listed (size {expected.size}, "
                             f"ETag {expected.etag}); the dataset changed while being read: "
                             f"restore it, or list it again and rebuild its indexes")


_ignores_range: set[str] = set()  # URLs already warned of


def ranged_reply(info: ObjectInfo, start: int, end: int, data: bytes) -> bytes:
    """Bytes [start, end) of a ranged read's reply `data`. A server that ignores Range requests (python -m
    http.server) answers 200 with the whole object, which holds them: warned of once per URL (every read fetches
    it all), never "cut short"; more bytes than asked for that are not the whole object is a DatasetError."""
    if len(data) <= end - start:
        return data
    if len(data) != info.size:
        raise DatasetError(info.url, f"a ranged read of {end - start} bytes got {len(data)}, neither the range nor "
                                     f"the listed object ({info.size} bytes): the server ignores Range requests "
                                     f"and the object changed since it was listed",
                           "Serve it with a server that honours Range requests, and do not change it while read")
    if info.url not in _ignores_range:
        _ignores_range.add(info.url)
        log.warning("%s: the server ignores Range requests (it answered with the whole object, %d bytes): every "
                    "read of it fetches all of it; serve it with one that honours Range (nginx, a bucket)",
                    info.url, info.size)
    return data[start:end]


def truncated_error(info: ObjectInfo, got: int, expected: int | None = None) -> TruncatedDownloadError:
    expected = info.size if expected is None else expected
    return TruncatedDownloadError(f"{info.url}: download cut short: {got} of {expected} bytes arrived "
                                  f"(the connection closed early). Retry; if it repeats, check the network or "
                                  f"proxy between here and the store")


def retrying(url: str, backend: Backend, call: Callable[[], T], expected: ObjectInfo | None = None) -> T:
    """call(), its errors translated, tried up to the current attempts while it fails retryably (a
    ConnectionError, or what backend.retryable says), with backoff_delays between; then UnreachableError
    naming the object, the endpoint and the flags. What it raises or logs names no secret (redact.clean): an
    SDK's error may quote a signed URL whole."""
    attempts = current_options().attempts
    delays, started = backoff_delays(attempts), time.monotonic()
    for attempt in itertools.count(1):
        try:
            return call()
        except Exception as raw:
            mine = isinstance(raw, (DatasetError, Cancelled, DownloadTooSlowError))
            clear = raw if mine else backend.translate(raw, url, expected)
            # The finished frames below keep no locals, nor this frame the error: an error held by a frame in its
            # own traceback (fsspec's sync holds the error it raises) is a reference cycle that pins every caller's
            # frame, a loader's too, until the cycle collector runs (an expected miss, a HEAD of classes.json)
            traceback.clear_frames(raw.__traceback__)
            failure: BaseException | None = None
            try:
                again = not mine and (isinstance(clear, ConnectionError) or backend.retryable(raw))
                delay = next(delays, None) if again else None
                if delay is None:
                    failure = _cleaned(UnreachableError(
                        f"{url}: cannot reach the {backend.service} endpoint {backend.endpoint(url)} after {attempt} "
                        f"attempts in {time.monotonic() - started:.0f} s ({clear}); {backend.endpoint_hint}; "
                        f"{RETRY_HINT}") if again else clear, raw)
                    raise failure from failure.__cause__
                if attempt == 1:
                    log.warning("%s; trying again, %d attempts in all", redact.scrub(str(clear)), attempts)
            finally:
                del clear, failure  # the error goes on up; this frame keeps none of it
            time.sleep(delay)
    raise AssertionError("unreachable")


def _cleaned(error: BaseException, cause: BaseException) -> BaseException:
    """`error`, with `cause` as its cause, unless either names a secret (then redact.clean's error)."""
    if error is not cause:
        error.__cause__ = cause
    return redact.clean(error)


# ---------------------------------------------------------------------------------------------
# Listing and metadata
# ---------------------------------------------------------------------------------------------
def _key(info: ObjectInfo) -> str:
    return RemoteUrl.parse(info.url).key


def list_objects(url_or_glob: str, client: Backend | None = None, page_size: int = 1000) -> list[ObjectInfo]:
    """The objects a location names, sorted by key:
      * scheme://b/prefix/ or scheme://b: every object below it (recursively);
      * scheme://b/key: that object if it exists, else every object below scheme://b/key/;
      * scheme://b/a/train-*-of-01024: keys matching the glob (local semantics: no "/" crossing),
        listing only below the literal prefix before the first wildcard.
    An http(s) URL is never listed: one URL is that object (HEAD), a prefix or glob is an error.
    FileNotFoundError when the bucket is missing or nothing matches. `page_size`: keys per request."""
    parsed = RemoteUrl.parse(url_or_glob)
    url_or_glob = identity(url_or_glob)  # what messages name
    backend = client or backend_for(parsed)
    if not SCHEMES[parsed.scheme].listing:
        return [_unlisted(url_or_glob, parsed, backend)]
    pattern = has_wildcard(parsed.key)
    searched = parsed.key[:min(parsed.key.index(c) for c in WILDCARDS if c in parsed.key)] if pattern else parsed.key
    try:
        below = sorted(backend.list_prefix(parsed.bucket, searched, url_or_glob, page_size), key=_key)
    except FileNotFoundError:
        below = []  # a missing bucket (or folder, to some stores): told apart below
    if pattern:
        found = [o for o in below if glob_matches(_key(o), parsed.key)]
    elif not parsed.key or parsed.key.endswith("/"):
        found = below
    else:
        found = [o for o in below if o.url == str(parsed)] or [o for o in below if _key(o).startswith(parsed.key + "/")]
    if not found:
        check_bucket(backend, parsed, url_or_glob)
        raise FileNotFoundError(
            f"{url_or_glob}: no objects match at {backend.endpoint(url_or_glob)} (searched below "
            f"{parsed.scheme}://{parsed.bucket}/{searched}); check the prefix and the pattern")
    return found


def _unlisted(url: str, parsed: RemoteUrl, backend: Backend) -> ObjectInfo:
    if has_wildcard(parsed.key) or not parsed.key or parsed.key.endswith("/"):
        raise DatasetError(url, f"{parsed.scheme}:// servers cannot be listed, so a prefix or a pattern names "
                                f"nothing", "Give the objects' URLs as a list, or a text file that lists them")
    return head(url, backend)


def check_bucket(backend: Backend, parsed: RemoteUrl, url: str) -> None:
    """FileNotFoundError naming the bucket when it is missing (a listing or a HEAD cannot tell)."""
    if not retrying(url, backend, lambda: backend.bucket_exists(parsed)):
        raise FileNotFoundError(
            f"{url}: {bucket_noun(parsed.scheme)} {parsed.bucket!r} does not exist at "
            f"{backend.endpoint(url)}; check the name, and {backend.endpoint_hint.removeprefix('check ')}")


def head(url: str, client: Backend | None = None) -> ObjectInfo:
    """The current size, ETag and version of one object; FileNotFoundError names whether the bucket or
    the key is missing."""
    parsed, url = RemoteUrl.parse(url), identity(url)
    backend = client or backend_for(parsed)
    try:
        return retrying(url, backend, lambda: backend.head(parsed))
    except FileNotFoundError:
        check_bucket(backend, parsed, url)
        raise


def heads(urls: list[str]) -> list[ObjectInfo]:
    """head() of each URL, 16 at a time (a list of shards or images on a server that cannot list)."""
    from concurrent.futures import ThreadPoolExecutor
    if not urls:
        return []
    context = contextvars.copy_context()  # the pool's threads run under this thread's options
    with ThreadPoolExecutor(min(16, len(urls))) as pool:
        return list(pool.map(lambda u: context.copy().run(head, u), urls))
