"""A remote object as a read-only, seekable file over ranged reads, for a reader that seeks: pyarrow's Parquet
reader reads the footer, then each column chunk it needs, one ranged GET each, never the whole object
(data/formats/parquet.py opens remote files here). Every read is pinned to the version listed once a process."""

from __future__ import annotations

import functools
import io
from typing import Any, Callable

from dali_pipes.storage import remote, remote_urls, transfer


class RangedFile(io.RawIOBase):
    """A read-only, seekable file over an object store's ranged reads: pyarrow reads the footer, then each
    column chunk it needs, one ranged GET each (never the whole object). `where` is what read_range takes: the
    object as listed (remote_urls.ObjectInfo), so a read is one request, pinned to that version."""

    def __init__(self, where: Any, size: int, read_range: Callable[[Any, int, int], bytes]) -> None:
        self.where, self.size, self._read_range, self._at = where, size, read_range, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._at = {0: offset, 1: self._at + offset, 2: self.size + offset}[whence]
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, size: int = -1) -> bytes:
        size = self.size - self._at if size is None or size < 0 else min(size, self.size - self._at)
        data = self._read_range(self.where, self._at, size) if size > 0 else b""
        self._at += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)



def open_ranged(url: str) -> RangedFile:
    """A remote file as pyarrow reads it: its size and version once a process (a HEAD), then one ranged read per
    footer and column chunk, each under the retries in force now (pyarrow calls them from its own IO threads,
    which have none of ours), each failing rather than reading another version of the object."""
    options, info = remote.current_options(), object_info(url)

    def read_range(where: Any, start: int, length: int) -> bytes:
        with remote.options_in_force(options):
            return transfer.read_range(where, start, length)
    return RangedFile(info, info.size, read_range)


@functools.lru_cache(maxsize=1024)
def object_info(url: str) -> remote_urls.ObjectInfo:
    """The object as listed now (size, ETag, version), asked once a process: the reads of it are pinned to it."""
    return remote.head(url)
