"""The TFRecord file layer: record frames and their CRCs, compression sniffing, walking a shard's records, and the
index files DALI's TFRecord reader needs (built from a file or a stream, read, written, checked against the shard).
tfrecord.py, the format's room, reads shards through these.

A frame is  uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
(little-endian); an index holds one line per record: "<byte offset> <framed size>".
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Protocol

import google_crc32c

from dali_pipes.errors import DatasetError
from dali_pipes.storage.files import atomic_write

HEADER_BYTES = 12  # uint64 length + uint32 crc of the length
FOOTER_BYTES = 4  # uint32 crc of the data
_MASK_DELTA = 0xA282EAD8
GZIP_MAGIC = b"\x1f\x8b"


def masked_crc32c(data: bytes) -> int:
    """TFRecord's CRC: CRC32C rotated right by 15 bits plus a constant (so CRCs of CRCs differ)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One TFRecord frame around `data`, exactly as TensorFlow's TFRecordWriter writes it."""
    length = struct.pack("<Q", len(data))
    return b"".join(
        (length, struct.pack("<I", masked_crc32c(length)), data, struct.pack("<I", masked_crc32c(data)))
    )


# ---------------------------------------------------------------------------------------------
# Reading shards: compression sniffing, record walking, index files.
# ---------------------------------------------------------------------------------------------

def sniff_compression(path: str) -> str | None:
    """'GZIP' or 'ZLIB' if the file is a compressed TFRecord (DALI cannot read those), else None."""
    with open(path, "rb") as f:
        return compression_of_header(f.read(HEADER_BYTES))  # zlib: only if the length CRC also fails


def looks_like_tfrecord(path: str) -> bool:
    """True if the file starts with a TFRecord header whose length CRC checks (or is compressed)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError:
        return False
    return header_looks_like_tfrecord(head)


def header_looks_like_tfrecord(head: bytes) -> bool:
    """looks_like_tfrecord on a file's first HEADER_BYTES bytes (a remote shard's ranged read)."""
    if len(head) == HEADER_BYTES and struct.unpack("<I", head[8:])[0] == masked_crc32c(head[:8]):
        return True
    return compression_of_header(head) is not None


def compression_of_header(head: bytes) -> str | None:
    """sniff_compression on a file's first HEADER_BYTES bytes."""
    if head[:2] == GZIP_MAGIC:
        return "GZIP"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        if len(head) < HEADER_BYTES or struct.unpack("<I", head[8:12])[0] != masked_crc32c(head[:8]):
            return "ZLIB"
    return None


class RecordStream(Protocol):
    """What walk_records reads records from: a file, a GzipFile or a _ZlibReader."""
    def read(self, size: int, /) -> bytes: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: Any) -> Any: ...


def open_decompressed(path: str, compression: str | None) -> RecordStream:
    if compression == "GZIP":
        return gzip.open(path, "rb")
    if compression == "ZLIB":
        return _ZlibReader(path)
    return open(path, "rb")


class _ZlibReader:
    """A read()-only stream over a ZLIB-compressed file (TensorFlow's 'ZLIB' TFRecord option)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "rb")
        self._inflate = zlib.decompressobj()
        self._buffer = b""

    def read(self, size: int) -> bytes:
        while len(self._buffer) < size:
            chunk = self._file.read(1 << 20)
            if not chunk:
                self._buffer += self._inflate.flush()
                break
            self._buffer += self._inflate.decompress(chunk)
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "_ZlibReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class RecordProblem:
    """Something wrong with one record of a shard; `index` is the record's position in the shard."""
    path: str
    index: int
    offset: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}: record {self.index} (byte {self.offset}): {self.message}"


def walk_records(path: str, *, read_data: bool = True, check_data_crc: bool = True,
                 compression: str | None = None) -> Iterator[tuple[int, int, bytes | None, RecordProblem | None]]:
    """Yield (offset, framed size, data or None, problem or None) for each record of a shard.

    A broken frame (bad length CRC, length past the end of the file) ends the walk with a
    problem, since nothing after it can be trusted. With read_data=False only the headers are
    read (seek over the data): that is how an index is built quickly.
    """
    size = os.path.getsize(path) if compression is None else None
    with open_decompressed(path, compression) as f:
        offset, index = 0, 0
        while True:
            if compression is None and hasattr(f, "seek"):
                f.seek(offset)
            header = f.read(HEADER_BYTES)
            if not header:
                return
            problem = _check_header(path, index, offset, header, size)
            if problem:
                yield offset, 0, None, problem
                return
            length = struct.unpack("<Q", header[:8])[0]
            framed = HEADER_BYTES + length + FOOTER_BYTES
            data = None
            if read_data or compression is not None:
                body = f.read(length + FOOTER_BYTES)
                if len(body) < length + FOOTER_BYTES:
                    yield offset, 0, None, RecordProblem(
                        path, index, offset, f"truncated: record needs {framed} bytes, file ends first")
                    return
                data = body[:length]
                if check_data_crc and struct.unpack("<I", body[length:])[0] != masked_crc32c(data):
                    yield offset, framed, data, RecordProblem(
                        path, index, offset, "data CRC mismatch (the record's bytes are corrupt)")
                    offset, index = offset + framed, index + 1
                    continue
            yield offset, framed, data, None
            offset, index = offset + framed, index + 1


def _check_header(path: str, index: int, offset: int, header: bytes, size: int | None) -> RecordProblem | None:
    if len(header) < HEADER_BYTES:
        return RecordProblem(path, index, offset, f"truncated: {len(header)}-byte record header at the end of the file")
    length = struct.unpack("<Q", header[:8])[0]
    if struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]):
        return RecordProblem(path, index, offset, "length CRC mismatch (not a TFRecord frame, or corrupt)")
    if size is not None and offset + HEADER_BYTES + length + FOOTER_BYTES > size:
        return RecordProblem(path, index, offset,
                             f"truncated: record of {length} bytes runs past the end of the file ({size} bytes)")
    return None


def build_tfrecord_index(path: str, damaged: list[DatasetError] | None = None) -> list[tuple[int, int]]:
    """[(offset, framed size)] for every record, reading only headers. Raises DatasetError on a bad
    shard; with a `damaged` list, a broken record (a truncated last record, a frame cut short) is
    recorded there instead and the intact records before it are indexed. Nothing after a broken
    frame can be trusted, and a shard with no intact record still raises."""
    compression = sniff_compression(path)
    if compression:
        raise compressed_error(path, compression)
    entries: list[tuple[int, int]] = []
    for offset, framed, _, problem in walk_records(path, read_data=False):
        if problem:
            error = DatasetError(path, f"record {problem.index} (byte {problem.offset}): {problem.message}",
                                 f"Re-create the shard, or check it with: python scripts/verify_dataset.py {path} "
                                 f"(dali-pipes verify)")
            if damaged is None or not entries:
                raise error
            damaged.append(DatasetError(f"{path}#{problem.index}", f"byte {problem.offset}: {problem.message}; "
                                        f"the {len(entries)} records before it are read"))
            break
        entries.append((offset, framed))
    if not entries:
        raise DatasetError(path, "empty TFRecord file (0 records)")
    return entries


def scan_tfrecord_stream(f: BinaryIO, where: str) -> list[tuple[int, int]]:
    """build_tfrecord_index over a sequential stream (a remote shard read once, transfer.open_object):
    every header's length CRC is checked, the data is read past, not kept. Raises DatasetError."""
    head = f.read(HEADER_BYTES)
    compression = compression_of_header(head)
    if compression:
        raise compressed_error(where, compression)
    entries: list[tuple[int, int]] = []
    offset = 0
    while head:
        problem = _check_header(where, len(entries), offset, head, None)
        if problem:
            raise DatasetError(where, f"record {problem.index} (byte {offset}): {problem.message}",
                               "Re-create the shard")
        length = struct.unpack("<Q", head[:8])[0]
        rest = length + FOOTER_BYTES
        while rest:
            got = len(f.read(min(rest, 1 << 20)))
            if not got:
                raise DatasetError(where, f"record {len(entries)} (byte {offset}): truncated: record of {length} "
                                   f"bytes runs past the end of the object", "Re-create the shard")
            rest -= got
        entries.append((offset, HEADER_BYTES + length + FOOTER_BYTES))
        offset += HEADER_BYTES + length + FOOTER_BYTES
        head = f.read(HEADER_BYTES)
    if not entries:
        raise DatasetError(where, "empty TFRecord file (0 records)")
    return entries


def compressed_error(path: str, compression: str) -> DatasetError:
    return DatasetError(path, f"{compression}-compressed TFRecord; DALI reads only uncompressed TFRecords",
                        f"Write uncompressed copies with: python scripts/to_tfrecord.py "
                        f"{os.path.dirname(path) or '.'} OUT --decompress (or: dali-pipes convert decompress ...)")


def write_tfrecord_index(entries: list[tuple[int, int]], index_path: str) -> None:
    """Write DALI's TFRecord index format ("offset size" per line), atomically."""
    _atomic_write_text(index_path, "".join(f"{offset} {size}\n" for offset, size in entries))


def read_tfrecord_index(index_path: str) -> list[tuple[int, int]]:
    with open(index_path) as f:
        return [(int(a), int(b)) for a, b in (line.split() for line in f if line.strip())]


def tfrecord_index_matches(path: str, index_path: str, spot_checks: int = 16) -> bool:
    """True if the index describes this shard: contiguous entries that end exactly at the file's
    size (a shorter index would make DALI drop records silently) and record headers where it
    says. Spot checks keep this cheap; an index older than its shard gets a full check."""
    try:
        entries = read_tfrecord_index(index_path)
    except (OSError, ValueError):  # UnicodeDecodeError (a file of garbage) is a ValueError
        return False
    if not entries_fit(entries, os.path.getsize(path)):
        return False
    full = os.path.getmtime(index_path) < os.path.getmtime(path)
    with open(path, "rb") as f:
        def header_at(offset: int) -> bytes:
            f.seek(offset)
            return f.read(HEADER_BYTES)
        return headers_fit(entries, header_at, len(entries) if full else spot_checks)


def entries_fit(entries: list[tuple[int, int]], size: int) -> bool:
    """Entries of whole frames, contiguous from byte 0 and ending exactly at `size`."""
    if not entries or entries[0][0] != 0 or any(s < HEADER_BYTES + FOOTER_BYTES for _, s in entries):
        return False
    if any(a + s != b for (a, s), (b, _) in zip(entries, entries[1:])):
        return False
    return entries[-1][0] + entries[-1][1] == size


def headers_fit(entries: list[tuple[int, int]], header_at, spot_checks: int) -> bool:
    """A record header (its length CRC) at `spot_checks` evenly spread entries and the last, giving each
    entry's framed size. `header_at(offset)` reads HEADER_BYTES there."""
    step = max(1, len(entries) // max(1, spot_checks))
    picks = set(range(0, len(entries), step)) | {len(entries) - 1}
    return all(header_fits(header_at(entries[i][0]), entries[i][1]) for i in sorted(picks))


def header_fits(header: bytes, framed: int) -> bool:
    """Whether `header` is a record header (length CRC intact) of a record `framed` bytes long in all."""
    if len(header) < HEADER_BYTES or struct.unpack("<I", header[8:HEADER_BYTES])[0] != masked_crc32c(header[:8]):
        return False
    return HEADER_BYTES + struct.unpack("<Q", header[:8])[0] + FOOTER_BYTES == framed


def _atomic_write_text(path: str, text: str) -> None:
    with atomic_write(path, "w") as f:
        f.write(text)
