"""Reads and writes of remote objects, every scheme alike, through remote.py's backends and retries: ranged reads
(the one ranged read of the package), whole small objects, streamed chunks, checked downloads (written beside
their path, checked against the listed size and version, renamed into place), uploads and deletes."""

from __future__ import annotations

import contextlib
import io
import os
import threading
from typing import Callable, Iterator

from dali_pipes.errors import DatasetError
from dali_pipes.storage.files import private_tmp
from dali_pipes.storage.remote import (
    Backend,
    Cancelled,
    Deadline,
    TruncatedDownloadError,
    UnreachableError,
    backend_for,
    changed_error,
    check_bucket,
    disappeared_error,
    head,
    ranged_reply,
    retrying,
    truncated_error,
)
from dali_pipes.storage.remote_urls import ObjectInfo, RemoteUrl, basename, identity, is_remote

CHUNK_BYTES = 1 << 20  # streaming reads: large enough for throughput, small enough to stop promptly
DOWNLOAD_ATTEMPTS = 3  # whole-object retries after a cut-off body (requests are retried, bodies are not)


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
        check_bucket(backend, parsed, url)
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
