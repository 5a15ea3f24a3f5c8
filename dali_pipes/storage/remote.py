"""Remote objects of every scheme through one layer: URLs, listing, globs, ranged reads, checked downloads.

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

Retries are per loader: `options_in_force(options)` sets them for the calls of one thread (a DaliLoader
opens its dataset under its own, and hands them to its shard cache's threads); `configure` sets the
process's default for calls made outside any loader.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import fnmatch
import functools
import hashlib
import importlib
import io
import itertools
import logging
import os
import posixpath
import random
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, TypeVar

from dali_pipes.errors import DatasetError, install_hint
from dali_pipes.storage import redact
from dali_pipes.storage.files import private_tmp

WILDCARDS = "*?["
CHUNK_BYTES = 1 << 20  # streaming reads: large enough for throughput, small enough to stop promptly
DOWNLOAD_ATTEMPTS = 3  # whole-object retries after a cut-off body (requests are retried, bodies are not)
RETRY_HINT = ("--storage-attempts / --storage-timeout (DaliLoader's storage_attempts / storage_timeout) "
              "set how long to keep trying")
DEADLINE_HINT = "--download-deadline (DaliLoader's download_deadline)"
SLOW_FRACTION = 0.25  # a download still running at this fraction of its deadline is warned of, with its progress
BACKOFF_BASE_S, BACKOFF_CAP_S = 1.0, 16.0  # waits 1, 2, 4, 8, 16, 16 ... s, each times a jitter in [0.5, 1)
log = logging.getLogger("dali_pipes")
T = TypeVar("T")


@dataclass(frozen=True)
class Scheme:
    """One URL scheme: the module and class of its backend, the extra that installs it, and what it can do."""
    module: str
    backend: str
    extra: str
    listing: bool = True  # False: the server cannot list (http): locations are URLs or lists of them
    native: bool = False  # DALI 2.4 reads it itself (remote_feed="native")
    writable: bool = True  # False: convert cannot write there (hf: the Hub's own tools; http)


# The table of schemes; a new one costs a Backend class and one line here. Loaded by name, when first used,
# so that `pip install .` imports none of the SDKs.
SCHEMES = {
    "s3": Scheme("dali_pipes.storage.object_store", "S3Backend", "s3", native=True),
    "gs": Scheme("dali_pipes.storage.fs", "GcsBackend", "gcs", native=True),
    "az": Scheme("dali_pipes.storage.fs", "AzureBackend", "azure"),
    "abfs": Scheme("dali_pipes.storage.fs", "AzureBackend", "azure"),
    "hf": Scheme("dali_pipes.storage.fs", "HfBackend", "hf", writable=False),
    "http": Scheme("dali_pipes.storage.fs", "HttpBackend", "http", listing=False, writable=False),
    "https": Scheme("dali_pipes.storage.fs", "HttpBackend", "http", listing=False, writable=False),
}
HF_REPO_TYPES = ("datasets", "spaces", "models")


def scheme_of(location: object) -> str | None:
    """"s3", "gs", ... for a URL of a known scheme (str or RemoteUrl); None for anything else."""
    if isinstance(location, RemoteUrl):
        return location.scheme
    if not isinstance(location, str) or "://" not in location:
        return None
    scheme = location.split("://", 1)[0].lower()
    return scheme if scheme in SCHEMES else None


def is_remote(location: object) -> bool:
    """True for URLs of a known scheme (str or RemoteUrl); local paths, PathLikes and lists are not remote."""
    return scheme_of(location) is not None


@dataclass(frozen=True)
class RemoteUrl:
    """A parsed URL: scheme, bucket (an S3/GCS bucket, an Azure container, a Hub repo "datasets/ORG/NAME"
    with its revision if one is named, "datasets/ORG/NAME@v1.0", an HTTP host) and key (may be "" or end in
    "/": a prefix). An http(s) URL's query string and user info grant access, they do not name the object: they
    are kept aside (redact.identity) and only its request has them, so a RemoteUrl and its str hold no secret."""
    scheme: str
    bucket: str
    key: str = ""

    @classmethod
    def parse(cls, url: str) -> "RemoteUrl":
        """Split a URL; ValueError names it when it is none of the schemes or lacks a bucket."""
        scheme = scheme_of(url)
        if scheme is None:
            raise ValueError(f"{redact.identity(str(url))!r}: not a remote URL; expected one of "
                             f"{', '.join(s + '://' for s in SCHEMES)} followed by bucket/key")
        rest = redact.identity(str(url)).split("://", 1)[1]
        parts = rest.split("/")
        width = 3 if scheme == "hf" and parts[0] in HF_REPO_TYPES else 2 if scheme == "hf" else 1
        if scheme == "hf" and parts[width - 1].endswith("@refs") and len(parts) > width + 1:
            width += 2  # a Hub revision with slashes: NAME@refs/pr/1, NAME@refs/convert/parquet
        bucket, key = "/".join(parts[:width]), "/".join(parts[width:])
        if not bucket or not all(parts[:width]):
            raise ValueError(f"{redact.identity(str(url))!r}: no bucket name; expected "
                             f"{scheme}://{_bucket_word(scheme)}/key")
        return cls(scheme, bucket, key)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"

    def join(self, *parts: str) -> "RemoteUrl":
        """The URL of `parts` below this one ("a/" + "b" -> "a/b"; no "..", keys are not paths)."""
        return dataclasses.replace(self, key=posixpath.join(self.key, *parts) if self.key else posixpath.join(*parts))


def _bucket_word(scheme: str) -> str:
    return {"hf": "datasets/ORG/NAME", "http": "host", "https": "host", "az": "container",
            "abfs": "container"}.get(scheme, "bucket")


def _bucket_noun(scheme: str) -> str:
    return {"hf": "repository", "http": "host", "https": "host", "az": "container", "abfs": "container"}.get(
        scheme, "bucket")


def identity(url: str) -> str:
    """The name of `url` in every message, state and cache key: an http(s) URL without its query string and user
    info (kept aside for its requests: redact.py); any other location unchanged."""
    return redact.identity(url)


def join(base: str, relative: str) -> str:
    """`relative` resolved against the prefix `base` (a file list's entries are relative to its folder)."""
    return str(RemoteUrl.parse(base).join(relative))


def dirname(url: str) -> str:
    """The prefix that holds `url`, with a trailing "/" (s3://b/x/list.txt -> s3://b/x/)."""
    parsed = RemoteUrl.parse(url)
    folder = posixpath.dirname(parsed.key)
    return str(dataclasses.replace(parsed, key=folder + "/" if folder else ""))


def relative_to(url: str, base: str) -> str:
    """The key of `url` relative to the prefix `base`; ValueError when it is not below it."""
    target, prefix = RemoteUrl.parse(url), RemoteUrl.parse(base)
    start = prefix.key if not prefix.key or prefix.key.endswith("/") else prefix.key + "/"
    if (target.scheme, target.bucket) != (prefix.scheme, prefix.bucket) or not target.key.startswith(start):
        raise ValueError(f"{url} is not below {base}")
    return target.key[len(start):]


def basename(url: str) -> str:
    """The last segment of a URL's key (the name a downloaded copy keeps)."""
    return posixpath.basename(RemoteUrl.parse(url).key)


@dataclass(frozen=True)
class ObjectInfo:
    """One object as listed: its URL, size in bytes, ETag (as the store sends it, S3's with quotes),
    last-modified time (POSIX seconds) and generation (GCS's object generation, an Azure version id, a
    Hub file's blob id; "" where the store has none). Two infos are equal only if the object did not change."""
    url: str
    size: int
    etag: str
    last_modified: float
    generation: str = ""

    @property
    def version(self) -> str:
        """A short key of the fields: a changed object gets a new one, so caches of shards and indexes
        keyed by it are never read stale."""
        text = f"{self.url}\0{self.size}\0{self.etag}\0{self.last_modified!r}"
        text += f"\0{self.generation}" if self.generation else ""  # S3 keys stay as they were
        return hashlib.sha1(text.encode()).hexdigest()[:20]


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

def has_wildcard(text: str) -> bool:
    return any(c in text for c in WILDCARDS)


def glob_matches(key: str, pattern: str) -> bool:
    """Local-glob semantics on keys: a wildcard never crosses "/" (train-* does not match train-x/y)."""
    keys, patterns = key.split("/"), pattern.split("/")
    return len(keys) == len(patterns) and all(fnmatch.fnmatchcase(k, p) for k, p in zip(keys, patterns))


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
        _check_bucket(backend, parsed, url_or_glob)
        raise FileNotFoundError(
            f"{url_or_glob}: no objects match at {backend.endpoint(url_or_glob)} (searched below "
            f"{parsed.scheme}://{parsed.bucket}/{searched}); check the prefix and the pattern")
    return found


def _unlisted(url: str, parsed: RemoteUrl, backend: Backend) -> ObjectInfo:
    if has_wildcard(parsed.key) or not parsed.key or parsed.key.endswith("/"):
        raise DatasetError(url, f"{parsed.scheme}:// servers cannot be listed, so a prefix or a pattern names "
                                f"nothing", "Give the objects' URLs as a list, or a text file that lists them")
    return head(url, backend)


def _check_bucket(backend: Backend, parsed: RemoteUrl, url: str) -> None:
    """FileNotFoundError naming the bucket when it is missing (a listing or a HEAD cannot tell)."""
    if not retrying(url, backend, lambda: backend.bucket_exists(parsed)):
        raise FileNotFoundError(
            f"{url}: {_bucket_noun(parsed.scheme)} {parsed.bucket!r} does not exist at "
            f"{backend.endpoint(url)}; check the name, and {backend.endpoint_hint.removeprefix('check ')}")


def head(url: str, client: Backend | None = None) -> ObjectInfo:
    """The current size, ETag and version of one object; FileNotFoundError names whether the bucket or
    the key is missing."""
    parsed, url = RemoteUrl.parse(url), identity(url)
    backend = client or backend_for(parsed)
    try:
        return retrying(url, backend, lambda: backend.head(parsed))
    except FileNotFoundError:
        _check_bucket(backend, parsed, url)
        raise


def heads(urls: list[str]) -> list[ObjectInfo]:
    """head() of each URL, 16 at a time (a list of shards or images on a server that cannot list)."""
    from concurrent.futures import ThreadPoolExecutor
    if not urls:
        return []
    context = contextvars.copy_context()  # the pool's threads run under this thread's options
    with ThreadPoolExecutor(min(16, len(urls))) as pool:
        return list(pool.map(lambda u: context.copy().run(head, u), urls))


# ---------------------------------------------------------------------------------------------
# Reads and writes
# ---------------------------------------------------------------------------------------------

def read_range(where: ObjectInfo | str, start: int, length: int, client: Backend | None = None) -> bytes:
    """Bytes [start, start + length) of `where`, the one ranged read of the package: a listed object
    (ObjectInfo; DatasetError if it changed since, where the store pins reads, or the reply is short), a
    URL (its current version: a HEAD, then a ranged read) or a local file."""
    if isinstance(where, str):
        if not is_remote(where):
            with open(where, "rb") as f:
                f.seek(start)
                return f.read(length)
        where = head(where, client)
    info = where
    if start < 0 or length < 0 or start + length > info.size:
        raise ValueError(f"{info.url}: range [{start}, {start + length}) outside the object's {info.size} bytes")
    if length == 0:
        return b""
    backend = client or backend_for(info.url)
    deadline = Deadline(info)  # for the read and its retries
    data = retrying(info.url, backend, lambda: backend.read(info, start, start + length, deadline), info)
    data = ranged_reply(info, start, start + length, data)
    if len(data) != length:
        _check_unchanged(info, backend)  # a short reply of an unpinned store: a shorter object now?
        raise truncated_error(info, len(data), expected=length)
    return data


def read_bytes(url: str, client: Backend | None = None) -> bytes:
    """A whole small object (a file list, classes.json), checked against its listed size."""
    return b"".join(iter_chunks(head(url, client), client=client))


def iter_chunks(info: ObjectInfo, *, client: Backend | None = None, stop: threading.Event | None = None,
                chunk_bytes: int = CHUNK_BYTES, deadline: Deadline | None = None) -> Iterator[bytes]:
    """The object's bytes in order, as chunks; raises DatasetError when it changed since `info` was
    taken or when fewer than info.size bytes arrive, Cancelled when `stop` is set, DownloadTooSlowError when
    `deadline` (default: one of the options in force, from the first chunk asked for) passes first."""
    backend = client or backend_for(info.url)
    timed = deadline or Deadline(info, warn=True)
    chunks = backend.stream(info, chunk_bytes, timed)
    try:
        for chunk in chunks:
            if stop is not None and stop.is_set():
                raise Cancelled(info.url)
            timed.got += len(chunk)
            if timed.passed() and timed.got < info.size:
                raise timed.error()
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
        if deadline is None:
            timed.close()
    if timed.got != info.size:
        raise truncated_error(info, timed.got)


class _ChunkReader(io.RawIOBase):
    """A read-only, forward-only file over iter_chunks (so its checks apply at the end)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._pending = chunks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        n = min(len(buffer), len(self._pending))
        buffer[:n], self._pending = self._pending[:n], self._pending[n:]
        return n

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()  # a generator: closes the HTTP body early when the reader stops
        super().close()


def open_object(info: ObjectInfo, *, client: Backend | None = None,
                buffer_bytes: int = CHUNK_BYTES) -> io.BufferedReader:
    """The object as a sequential binary file (read, no seek), streamed once: for building an
    index from a remote shard (tarfile.open(fileobj=..., mode="r|"), a record scanner) without
    storing it. Reading to the end raises the same errors as iter_chunks (changed, cut short)."""
    return io.BufferedReader(_ChunkReader(iter_chunks(info, client=client)), buffer_bytes)


def download(info: ObjectInfo, path: str, *, client: Backend | None = None, stop: threading.Event | None = None,
             attempts: int = DOWNLOAD_ATTEMPTS, on_bytes: Callable[[int], None] | None = None) -> str:
    """Fetch the whole object to `path`: written to a temporary file beside it, checked against
    info.size and info's version, then renamed into place, so `path` never holds a partial or a changed
    object. A body cut off or stalled midway is retried `attempts` times in all (each request itself is
    `retrying`'s); a changed or deleted object is not (it would not come back), nor one past the deadline of
    the options in force (its attempts together: DownloadTooSlowError). Returns `path`."""
    deadline = Deadline(info, warn=True)
    try:
        for attempt in range(1, attempts + 1):
            try:
                return _download_once(info, path, client or backend_for(info.url), stop, on_bytes, deadline)
            except (TruncatedDownloadError, ConnectionError) as error:
                if isinstance(error, UnreachableError):
                    raise  # its request was tried the current attempts already (or the deadline passed)
                if attempt == attempts:
                    if not isinstance(error, TruncatedDownloadError):
                        raise
                    raise TruncatedDownloadError(f"{error} ({attempts} attempts)") from error
                deadline.got = 0  # the next attempt starts over
    finally:
        deadline.close()
    raise ValueError(f"attempts must be >= 1, got {attempts}")


def _download_once(info: ObjectInfo, path: str, backend: Backend, stop, on_bytes, deadline: Deadline) -> str:
    temporary = private_tmp(path)
    try:
        with open(temporary, "wb") as out:
            try:
                for chunk in iter_chunks(info, client=backend, stop=stop, deadline=deadline):
                    out.write(chunk)
                    if on_bytes is not None:
                        on_bytes(len(chunk))
            except TruncatedDownloadError:
                _check_unchanged(info, backend)  # an unpinned store's short body: a shorter object now?
                raise
        _check_unchanged(info, backend)
        os.replace(temporary, path)  # atomic: readers see nothing or the whole checked object
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
    return path


def _check_unchanged(info: ObjectInfo, backend: Backend) -> None:
    """For stores whose reads are not pinned to a version (`pins_reads` False): one HEAD after the
    download, so that a shard replaced while it was fetched is an error, not two versions mixed."""
    if not getattr(backend, "pins_reads", True):
        check_unchanged(info, backend)


def check_unchanged(info: ObjectInfo, client: Backend | None = None) -> None:
    """ObjectChangedError (FileNotFoundError: deleted) when the store's object is no longer the one listed as
    `info`: one HEAD, asked of the store (never a client's listing cache)."""
    try:
        now = head(info.url, client)
    except FileNotFoundError as error:
        raise disappeared_error(info.url, info) from error
    if now != info:
        raise changed_error(info.url, info, f"its ETag is now {now.etag} (size {now.size})")


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
    """`path` itself when local; for a URL, a checked download of its current version in a
    temporary file, removed on exit (rewriting a remote shard without its bad records)."""
    if not is_remote(path):
        yield path
        return
    import tempfile
    handle, temporary = tempfile.mkstemp(prefix="dali_pipes-", suffix="-" + basename(path))
    os.close(handle)
    try:
        yield download(head(path), temporary)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)


def upload(path: str, url: str, client: Backend | None = None) -> ObjectInfo:
    """Upload a local file (multipart when large) and return the stored object's info."""
    parsed, url = RemoteUrl.parse(url), identity(url)
    backend = client or backend_for(parsed)
    try:
        retrying(url, backend, lambda: backend.upload(path, parsed))
    except FileNotFoundError:
        _check_bucket(backend, parsed, url)
        raise
    info = head(url, backend)
    if info.size != os.path.getsize(path):
        raise DatasetError(f"{url}: stored {info.size} bytes but {path} has {os.path.getsize(path)}; upload again")
    return info


def delete(url: str, client: Backend | None = None) -> None:
    """Delete one object (a conversion's old set, replaced with --overwrite); a missing one is no error."""
    parsed, url = RemoteUrl.parse(url), identity(url)
    backend = client or backend_for(parsed)
    with contextlib.suppress(FileNotFoundError):
        retrying(url, backend, lambda: backend.delete(parsed))
