"""Objects in S3 (or any S3-compatible store): URLs, listing, metadata, whole and ranged reads.

Everything goes through one boto3 client per process (`s3_client`), configured from the standard
AWS chain: credentials, region, profile and endpoint (AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3, which
botocore >= 1.31 reads itself) come from the environment and ~/.aws files, never from here. The
client has explicit connect/read timeouts (`s3_timeout`) and every request is tried up to `s3_attempts`
times (`retrying`), backing off with jitter, so that no call hangs and a short outage is ridden out:
the defaults wait at least 30 s in all before a request fails (`configure` sets both for the process;
the flags --s3-attempts / --s3-timeout reach it through DaliLoader).

Failures come back as built-in exception types with a message that names the bucket, the key, the
endpoint and the fix (botocore's own messages name none of the three):
    FileNotFoundError   missing bucket, missing object, no object matches a glob, object deleted
    PermissionError     no credentials found, access denied (403)
    ConnectionError     endpoint unreachable or timing out after the bounded retries
    DatasetError        an object that changed since it was listed, a truncated download

`ObjectInfo` is what a listing returns and what every read checks against: reads send
If-Match: <etag> and count bytes, so a shard replaced or cut short mid-epoch is an error, not
silently different data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import hashlib
import io
import itertools
import logging
import os
import posixpath
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

from dali_pipes.errors import DatasetError
from dali_pipes.storage.files import private_tmp

SCHEME = "s3://"
WILDCARDS = "*?["
CHUNK_BYTES = 1 << 20  # streaming reads: large enough for throughput, small enough to stop promptly
DOWNLOAD_ATTEMPTS = 3  # whole-object retries after a cut-off body (botocore retries requests, not bodies)
ENDPOINT_HINT = "check AWS_ENDPOINT_URL (or endpoint_url in the AWS config) and that the server is up"
RETRY_HINT = "--s3-attempts / --s3-timeout (DaliLoader's s3_attempts / s3_timeout) set how long to keep trying"
BACKOFF_BASE_S, BACKOFF_CAP_S = 1.0, 16.0  # waits 1, 2, 4, 8, 16, 16 ... s, each times a jitter in [0.5, 1)
RETRIED_STATUSES = (500, 502, 503, 504)  # a store restarting or throttling: worth another try
RETRIED_CODES = ("SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "Throttling")
log = logging.getLogger("dali_pipes")
T = TypeVar("T")


@dataclass(frozen=True)
class S3Url:
    """A parsed s3://bucket/key URL; `key` may be "" (the bucket) or end in "/" (a prefix)."""
    bucket: str
    key: str = ""

    @classmethod
    def parse(cls, url: str) -> "S3Url":
        """Split "s3://bucket/key"; ValueError names the URL when it is not one."""
        if not is_remote(url):
            raise ValueError(f"{url!r}: not an S3 URL; expected s3://bucket/key")
        bucket, _, key = str(url)[len(SCHEME):].partition("/")
        if not bucket:
            raise ValueError(f"{url!r}: no bucket name; expected s3://bucket/key")
        return cls(bucket, key)

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}"

    def join(self, *parts: str) -> "S3Url":
        """The URL of `parts` below this one ("a/" + "b" -> "a/b"; no "..", keys are not paths)."""
        return S3Url(self.bucket, posixpath.join(self.key, *parts) if self.key else posixpath.join(*parts))


def is_remote(location: object) -> bool:
    """True for s3:// URLs (str or S3Url); local paths, PathLikes and lists are not remote."""
    return isinstance(location, S3Url) or (isinstance(location, str) and location.startswith(SCHEME))


def join(base: str, relative: str) -> str:
    """`relative` resolved against the prefix `base` (a file list's entries are relative to its folder)."""
    return str(S3Url.parse(base).join(relative))


def dirname(url: str) -> str:
    """The prefix that holds `url`, with a trailing "/" (s3://b/x/list.txt -> s3://b/x/)."""
    parsed = S3Url.parse(url)
    folder = posixpath.dirname(parsed.key)
    return str(S3Url(parsed.bucket, folder + "/" if folder else ""))


def relative_to(url: str, base: str) -> str:
    """The key of `url` relative to the prefix `base`; ValueError when it is not below it."""
    target, prefix = S3Url.parse(url), S3Url.parse(base)
    start = prefix.key if not prefix.key or prefix.key.endswith("/") else prefix.key + "/"
    if target.bucket != prefix.bucket or not target.key.startswith(start):
        raise ValueError(f"{url} is not below {base}")
    return target.key[len(start):]


@dataclass(frozen=True)
class ObjectInfo:
    """One object as listed: its URL, size in bytes, ETag (quotes included, as S3 sends it) and
    last-modified time (POSIX seconds). Two infos are equal only if the object did not change."""
    url: str
    size: int
    etag: str
    last_modified: float

    @property
    def version(self) -> str:
        """A short key of (url, size, etag, last_modified): a changed object gets a new one, so
        caches of shards and indexes keyed by it are never read stale."""
        text = f"{self.url}\0{self.size}\0{self.etag}\0{self.last_modified!r}"
        return hashlib.sha1(text.encode()).hexdigest()[:20]


# ---------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ClientOptions:
    """Timeouts and retries of the one S3 client; the AWS chain still decides endpoint and credentials.
    botocore tries each request once: `retrying` tries it `attempts` times with backoff, so that the
    total wait is known (the defaults: at least 31.5 s over 8 attempts) and the error says it."""
    connect_timeout: float = 5.0  # seconds per connection attempt (at most `timeout`)
    read_timeout: float = 20.0  # seconds without a byte from the server: --s3-timeout
    attempts: int = 8  # tries per request: --s3-attempts
    max_pool_connections: int = 32  # >= parallel downloads, else they queue for a connection

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.read_timeout <= 0:
            raise ValueError(f"s3_attempts must be >= 1 and s3_timeout > 0, "
                             f"got {self.attempts} and {self.read_timeout}")

    def min_wait(self) -> float:
        """The least time, in seconds, spent waiting between tries before a request fails."""
        return sum(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** k) / 2 for k in range(self.attempts - 1))


_options = ClientOptions()


def configure(attempts: int | None = None, timeout: float | None = None) -> ClientOptions:
    """This process's S3 retries (`attempts` tries per request) and timeout (seconds to connect, capped at
    5, or to wait for the next bytes); None keeps the current value. Returns the options now in force."""
    global _options
    changes: dict[str, Any] = {k: v for k, v in (("attempts", attempts), ("read_timeout", timeout)) if v is not None}
    if changes:
        options = dataclasses.replace(_options, **changes)
        _options = dataclasses.replace(options, connect_timeout=min(5.0, options.read_timeout))
    return _options


def current_options() -> ClientOptions:
    return _options


def backoff_delays(attempts: int, rng: random.Random | None = None) -> Iterator[float]:
    """The waits between `attempts` tries: 1, 2, 4, 8, 16, 16 ... s, each times a jitter in [0.5, 1)
    (ranks that lost the store together do not come back in step)."""
    draw = (rng or random).random
    for k in range(attempts - 1):
        yield min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** k) * (0.5 + draw() / 2)


# Variables that select the endpoint or identity: a client made under other values is not reused.
_CHAIN_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
                    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                    "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


def s3_client(options: ClientOptions | None = None):
    """The process's boto3 S3 client for these options (default: `configure`'s) and the current AWS environment.

    boto3 clients are thread-safe but not fork-safe and slow to make (~50 ms): one per
    (process, options, AWS variables)."""
    environment = tuple(os.environ.get(name) for name in _CHAIN_VARIABLES)
    return _cached_client(os.getpid(), options or _options, environment)


@functools.lru_cache(maxsize=8)
def _cached_client(pid: int, options: ClientOptions, environment: tuple):
    try:
        import boto3
        from botocore.config import Config
    except ImportError as e:
        raise ImportError("s3:// locations need boto3: pip install 'dali_pipes[s3]'") from e
    config = Config(connect_timeout=options.connect_timeout, read_timeout=options.read_timeout,
                    retries={"total_max_attempts": 1, "mode": "standard"},  # `retrying` retries
                    max_pool_connections=options.max_pool_connections)
    # A fresh session per client: the default session caches credentials across env changes.
    return boto3.session.Session().client("s3", config=config)


def endpoint_of(client) -> str:
    return client.meta.endpoint_url


# ---------------------------------------------------------------------------------------------
# Errors: botocore's exceptions -> built-in types whose message names the object, endpoint, fix
# ---------------------------------------------------------------------------------------------

def _error_code(error: Exception) -> tuple[str, int]:
    response = getattr(error, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    return code, int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def translate_error(error: Exception, url: str, client, expected: ObjectInfo | None = None) -> Exception:
    """The clear exception for a botocore failure on `url`; the original error itself when it is
    none of the known kinds (the caller raises the result `from error`)."""
    from botocore import exceptions as bx
    endpoint = endpoint_of(client)
    if isinstance(error, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return PermissionError(
            f"{url}: no AWS credentials found for endpoint {endpoint}. Set AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with a profile in ~/.aws/credentials")
    if isinstance(error, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError,
                          bx.ConnectionClosedError)):
        return ConnectionError(f"{url}: cannot reach the S3 endpoint {endpoint} ({error}); {ENDPOINT_HINT}")
    code, status = _error_code(error)
    bucket = S3Url.parse(url).bucket
    if code == "NoSuchBucket":
        return FileNotFoundError(f"{url}: bucket {bucket!r} does not exist at {endpoint}; check the bucket "
                                 f"name, and AWS_ENDPOINT_URL / the region if it exists elsewhere")
    if code in ("NoSuchKey", "404") or status == 404:
        if expected is not None:
            return FileNotFoundError(f"{url}: the object disappeared after it was listed (size {expected.size}, "
                                     f"ETag {expected.etag}); the dataset changed while being read: "
                                     f"restore it, or list it again and rebuild its indexes")
        return FileNotFoundError(f"{url}: no such object at {endpoint}; check the key")
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled") \
            or status == 403:
        return PermissionError(f"{url}: access denied by {endpoint} ({code or status}); the credentials in use "
                               f"need s3:ListBucket on bucket {bucket!r} and s3:GetObject on its objects")
    if code == "PreconditionFailed" or status == 412:
        return changed_error(url, expected, "its ETag no longer matches (If-Match failed)")
    return error


class ObjectChangedError(DatasetError):
    """An object replaced after it was listed: reading on would mix two versions of a shard."""


class TruncatedDownloadError(DatasetError):
    """Fewer bytes arrived than the object holds: the connection closed early."""


def changed_error(url: str, expected: ObjectInfo | None, how: str) -> ObjectChangedError:
    was = f" (listed with size {expected.size}, ETag {expected.etag})" if expected else ""
    return ObjectChangedError(f"{url}: the object changed after it was listed{was}: {how}. The dataset must not "
                        f"change while it is read: restore it, or list it again and rebuild its indexes")


@contextlib.contextmanager
def _translated(url: str, client, expected: ObjectInfo | None = None) -> Iterator[None]:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError
    try:
        yield
    except (BotoCoreError, ClientError, S3UploadFailedError) as error:
        # s3transfer wraps the ClientError of a failed upload; translate the one inside
        cause = error.__context__ if isinstance(error, S3UploadFailedError) and error.__context__ else error
        clear = translate_error(cause, url, client, expected)
        if clear is cause:
            raise
        raise clear from error


class UnreachableError(ConnectionError):
    """A request that failed on every one of its attempts: the store is down or unreachable."""


def retryable(error: BaseException) -> bool:
    """A network fault or a store that is restarting or throttling (5xx): another try may succeed.
    Missing objects, denied access and changed objects are not: they would not come back."""
    if isinstance(error, ConnectionError):
        return True
    from botocore.exceptions import ClientError
    if isinstance(error, ClientError):
        code, status = _error_code(error)
        return status in RETRIED_STATUSES or code in RETRIED_CODES
    return False


def retrying(url: str, client, call: Callable[[], T], expected: ObjectInfo | None = None) -> T:
    """call() under `_translated`, tried up to `configure`'s attempts while it fails retryably, with
    backoff_delays between; then ConnectionError naming the object, the endpoint and the flags."""
    delays, started = backoff_delays(_options.attempts), time.monotonic()
    for attempt in itertools.count(1):
        try:
            with _translated(url, client, expected):
                return call()
        except Exception as error:
            delay = next(delays, None) if retryable(error) else None
            if delay is None and retryable(error):
                raise UnreachableError(
                    f"{url}: cannot reach the S3 endpoint {endpoint_of(client)} after {attempt} attempts in "
                    f"{time.monotonic() - started:.0f} s ({error.__cause__ or error}); {ENDPOINT_HINT}; "
                    f"{RETRY_HINT}") from error
            if delay is None:
                raise
            if attempt == 1:
                log.warning("%s; trying again, %d attempts in all", error, _options.attempts)
            time.sleep(delay)
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------
# Listing and metadata
# ---------------------------------------------------------------------------------------------

def has_wildcard(text: str) -> bool:
    return any(c in text for c in WILDCARDS)


def _glob_matches(key: str, pattern: str) -> bool:
    """Local-glob semantics on keys: a wildcard never crosses "/" (train-* does not match train-x/y)."""
    keys, patterns = key.split("/"), pattern.split("/")
    return len(keys) == len(patterns) and all(fnmatch.fnmatchcase(k, p) for k, p in zip(keys, patterns))


def _info(bucket: str, key: str, size: int, etag: str, modified) -> ObjectInfo:
    return ObjectInfo(f"{SCHEME}{bucket}/{key}", int(size), str(etag), float(modified.timestamp()))


def _list_prefix(client, bucket: str, prefix: str, url: str, page_size: int) -> Iterator[ObjectInfo]:
    """Every object under `prefix`, recursively, in key order (S3 lists in UTF-8 binary order); each
    page is one request, retried on its own."""
    token: dict = {}
    while True:
        # this page's call, its token bound now
        page = retrying(url, client, functools.partial(client.list_objects_v2, Bucket=bucket, Prefix=prefix,
                                                       MaxKeys=page_size, **token))
        for item in page.get("Contents", []):
            if not item["Key"].endswith("/"):  # "folder" marker objects made by consoles
                yield _info(bucket, item["Key"], item["Size"], item["ETag"], item["LastModified"])
        if not page.get("IsTruncated"):
            return
        token = {"ContinuationToken": page["NextContinuationToken"]}


def list_objects(url_or_glob: str, client=None, page_size: int = 1000) -> list[ObjectInfo]:
    """The objects a location names, sorted by key:
      * s3://b/prefix/ or s3://b: every object below it (recursively);
      * s3://b/key: that object if it exists, else every object below s3://b/key/;
      * s3://b/a/train-*-of-01024: keys matching the glob (local semantics: no "/" crossing),
        listing only below the literal prefix before the first wildcard.
    FileNotFoundError when the bucket is missing or nothing matches. `page_size`: keys per
    ListObjectsV2 call (1000 is S3's maximum)."""
    client = client or s3_client()
    parsed = S3Url.parse(url_or_glob)
    if has_wildcard(parsed.key):
        literal = parsed.key[:min(parsed.key.index(c) for c in WILDCARDS if c in parsed.key)]
        found = [o for o in _list_prefix(client, parsed.bucket, literal, url_or_glob, page_size)
                 if _glob_matches(S3Url.parse(o.url).key, parsed.key)]
        searched = literal
    elif not parsed.key or parsed.key.endswith("/"):
        found = list(_list_prefix(client, parsed.bucket, parsed.key, url_or_glob, page_size))
        searched = parsed.key
    else:
        below = list(_list_prefix(client, parsed.bucket, parsed.key, url_or_glob, page_size))
        exact = [o for o in below if o.url == str(parsed)]
        found = exact or [o for o in below if S3Url.parse(o.url).key.startswith(parsed.key + "/")]
        searched = parsed.key
    if not found:
        raise FileNotFoundError(
            f"{url_or_glob}: no objects match at {endpoint_of(client)} (searched below "
            f"s3://{parsed.bucket}/{searched}); check the prefix and the pattern")
    return found


def head(url: str, client=None) -> ObjectInfo:
    """The current size, ETag and last-modified of one object; FileNotFoundError names whether
    the bucket or the key is missing (HEAD answers a bare 404 for both)."""
    client = client or s3_client()
    parsed = S3Url.parse(url)
    try:
        reply = retrying(url, client, lambda: client.head_object(Bucket=parsed.bucket, Key=parsed.key))
    except FileNotFoundError:
        _check_bucket(client, parsed.bucket, url)
        raise
    return _info(parsed.bucket, parsed.key, reply["ContentLength"], reply["ETag"], reply["LastModified"])


def _check_bucket(client, bucket: str, url: str) -> None:
    try:
        retrying(url, client, lambda: client.head_bucket(Bucket=bucket))
    except FileNotFoundError as error:  # translated from a bare 404, which names no bucket
        cause = error.__cause__
        raise translate_error(_no_such_bucket(cause), url, client) from cause


def _no_such_bucket(error: Any) -> Exception:  # a botocore ClientError (botocore ships no types)
    """HEAD replies carry no error body: give a bare 404 on a bucket the code a GET would have."""
    error.response.setdefault("Error", {})["Code"] = "NoSuchBucket"
    return error


# ---------------------------------------------------------------------------------------------
# Reads and writes
# ---------------------------------------------------------------------------------------------

def read_range(where: ObjectInfo | str, start: int, length: int, client=None) -> bytes:
    """Bytes [start, start + length) of `where`, the one ranged read of the package: a listed object
    (ObjectInfo; DatasetError if it changed since, If-Match, or the reply is short), an s3:// URL (its
    current version: a HEAD, then a ranged GET) or a local file."""
    if isinstance(where, str):
        if not is_remote(where):
            with open(where, "rb") as f:
                f.seek(start)
                return f.read(length)
        client = client or s3_client()
        where = head(where, client)
    info = where
    if start < 0 or length < 0 or start + length > info.size:
        raise ValueError(f"{info.url}: range [{start}, {start + length}) outside the object's {info.size} bytes")
    if length == 0:
        return b""
    client = client or s3_client()
    parsed = S3Url.parse(info.url)

    def get() -> bytes:
        reply = client.get_object(Bucket=parsed.bucket, Key=parsed.key, IfMatch=info.etag,
                                  Range=f"bytes={start}-{start + length - 1}")
        return reply["Body"].read()
    data = retrying(info.url, client, get, info)
    if len(data) != length:
        raise truncated_error(info, len(data), expected=length)
    return data


def read_bytes(url: str, client=None) -> bytes:
    """A whole small object (a file list, classes.json), checked against its listed size."""
    client = client or s3_client()
    info = head(url, client)
    return b"".join(iter_chunks(info, client=client))


def truncated_error(info: ObjectInfo, got: int, expected: int | None = None) -> TruncatedDownloadError:
    expected = info.size if expected is None else expected
    return TruncatedDownloadError(f"{info.url}: download cut short: {got} of {expected} bytes arrived "
                        f"(the connection closed early). Retry; if it repeats, check the network or proxy "
                        f"between here and the S3 endpoint")


class Cancelled(Exception):
    """A streaming read stopped because its `stop` event was set (a cache closing)."""


def iter_chunks(info: ObjectInfo, *, client=None, stop: threading.Event | None = None,
                chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The object's bytes in order, as chunks; raises DatasetError when it changed since `info`
    was taken (If-Match) or when fewer than info.size bytes arrive, Cancelled when `stop` is set."""
    from botocore.exceptions import IncompleteReadError, ResponseStreamingError
    client = client or s3_client()
    parsed = S3Url.parse(info.url)
    got = 0
    reply = retrying(info.url, client, lambda: client.get_object(Bucket=parsed.bucket, Key=parsed.key,
                                                                 IfMatch=info.etag), info)
    with _translated(info.url, client, info):
        if reply.get("ETag", info.etag) != info.etag:  # stores that ignore If-Match
            raise changed_error(info.url, info, f"its ETag is now {reply['ETag']}")
        body = reply["Body"]
        try:
            for chunk in body.iter_chunks(chunk_bytes):
                if stop is not None and stop.is_set():
                    raise Cancelled(info.url)
                got += len(chunk)
                yield chunk
        except (IncompleteReadError, ResponseStreamingError) as error:
            raise truncated_error(info, got) from error
        finally:
            body.close()
    if got != info.size:
        raise truncated_error(info, got)


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


def open_object(info: ObjectInfo, *, client=None, buffer_bytes: int = CHUNK_BYTES) -> io.BufferedReader:
    """The object as a sequential binary file (read, no seek), streamed once: for building an
    index from a remote shard (tarfile.open(fileobj=..., mode="r|"), a record scanner) without
    storing it. Reading to the end raises the same errors as iter_chunks (changed, cut short)."""
    return io.BufferedReader(_ChunkReader(iter_chunks(info, client=client)), buffer_bytes)


def download(info: ObjectInfo, path: str, *, client=None, stop: threading.Event | None = None,
             attempts: int = DOWNLOAD_ATTEMPTS, on_bytes: Callable[[int], None] | None = None) -> str:
    """Fetch the whole object to `path`: written to a temporary file beside it, checked against
    info.size and info.etag, then renamed into place, so `path` never holds a partial or a changed
    object. A body cut off or stalled midway is retried `attempts` times in all (each GET itself is
    `retrying`'s); a changed or deleted object is not (it would not come back). Returns `path`."""
    for attempt in range(1, attempts + 1):
        try:
            return _download_once(info, path, client or s3_client(), stop, on_bytes)
        except (TruncatedDownloadError, ConnectionError) as error:
            if isinstance(error, UnreachableError):
                raise  # its GET was tried `configure`'s attempts already
            if attempt == attempts:
                if not isinstance(error, TruncatedDownloadError):
                    raise
                raise TruncatedDownloadError(f"{error} ({attempts} attempts)") from error
    raise ValueError(f"attempts must be >= 1, got {attempts}")


def _download_once(info: ObjectInfo, path: str, client, stop, on_bytes) -> str:
    temporary = private_tmp(path)
    try:
        with open(temporary, "wb") as out:
            for chunk in iter_chunks(info, client=client, stop=stop):
                out.write(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
        os.replace(temporary, path)  # atomic: readers see nothing or the whole checked object
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
    return path


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
    """`path` itself when local; for an s3:// URL, a checked download of its current version in a
    temporary file, removed on exit (rewriting a remote shard without its bad records)."""
    if not is_remote(path):
        yield path
        return
    import tempfile
    handle, temporary = tempfile.mkstemp(prefix="dali_pipes-", suffix="-" + posixpath.basename(path))
    os.close(handle)
    try:
        yield download(head(path), temporary)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)


def upload(path: str, url: str, client=None) -> ObjectInfo:
    """Upload a local file (multipart when large) and return the stored object's info."""
    client = client or s3_client()
    parsed = S3Url.parse(url)
    retrying(url, client, lambda: client.upload_file(path, parsed.bucket, parsed.key))
    info = head(url, client)
    if info.size != os.path.getsize(path):
        raise DatasetError(f"{url}: stored {info.size} bytes but {path} has {os.path.getsize(path)}; upload again")
    return info


def delete(url: str, client=None) -> None:
    """Delete one object (a conversion's old set, replaced with --overwrite); a missing one is no error."""
    client = client or s3_client()
    parsed = S3Url.parse(url)
    retrying(url, client, lambda: client.delete_object(Bucket=parsed.bucket, Key=parsed.key))
