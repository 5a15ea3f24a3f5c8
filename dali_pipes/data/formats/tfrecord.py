"""TFRecord shards: framing, tf.train.Example encoding, scanning, DALI index files, and the TFRecord
format's entries in the format table (samples, the DALI reader, verification, exclusion).

A TFRecord file is a sequence of records, each framed as
    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
(little-endian). `data` is a serialized `tf.train.Example` protobuf. The index that DALI's
TFRecord reader needs holds one line per record: "<byte offset> <framed size>".

Everything here is written from the TFRecord and protobuf specifications, so that records
written by TensorFlow read here and records written here parse in TensorFlow.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Protocol

import google_crc32c

from dali_pipes.data.labels import EXCLUDED_LABEL, check_label, dali_checked_labels, label_bound, stored_to_label
from dali_pipes.data.protobuf import as_bytes, fields, read_varint
from dali_pipes.data.samples import Sample, SampleRef, SourceRecord, TFRecordKeys, required
from dali_pipes.errors import DatasetError, IndexMismatchError
from dali_pipes.storage.files import atomic_write
from dali_pipes.storage.remote_urls import ObjectInfo

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
# tf.train.Example, encoded and decoded by hand (wire format of example.proto / feature.proto).
# ---------------------------------------------------------------------------------------------

def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 negatives are 10-byte two's complement varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(value: bytes | str | int | float | list) -> bytes:
    values: list = value if isinstance(value, list) else [value]  # one kind of value, as `first`'s
    first = values[0] if values else b""
    if isinstance(first, (bytes, str)):  # BytesList = 1, repeated bytes value = 1
        items = [v.encode() if isinstance(v, str) else v for v in values]
        return _field(1, b"".join(_field(1, v) for v in items))
    if isinstance(first, float):  # FloatList = 2, packed float value = 1
        return _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)))
    return _field(3, _field(1, b"".join(_varint(int(v)) for v in values)))  # Int64List = 3, packed


def encode_example(features: dict[str, bytes | str | int | float | list]) -> bytes:
    """Serialize a tf.train.Example. bytes/str -> BytesList, int -> Int64List, float -> FloatList."""
    entries = b"".join(
        _field(1, _field(1, key.encode()) + _field(2, _feature(value)))  # map entry: key=1, value=2
        for key, value in sorted(features.items())  # sorted: same bytes every time
    )
    return _field(1, entries)  # Example.features = 1; Features.feature (map) = 1


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _decode_feature(buf: bytes) -> list:
    values: list = []
    for kind, _, payload in fields(buf):
        for number, _, item in fields(as_bytes(payload)):
            if number != 1:
                continue
            if kind == 1:
                values.append(item)
            elif kind == 2:  # floats: packed (wire 2) or one by one (wire 5)
                floats = as_bytes(item)
                values.extend(struct.unpack(f"<{len(floats) // 4}f", floats))
            elif kind == 3 and isinstance(item, int):  # wire 0: one varint
                values.append(_signed64(item))
            elif kind == 3:  # packed varints
                packed, pos = as_bytes(item), 0
                while pos < len(packed):
                    value, pos = read_varint(packed, pos)
                    values.append(_signed64(value))
    return values


def decode_example(data: bytes) -> dict[str, list]:
    """Parse a serialized tf.train.Example into {key: [values]}. Raises ValueError if malformed."""
    features: dict[str, list] = {}
    for number, _, feats in fields(data):
        if number != 1:
            continue
        for _, _, entry in fields(as_bytes(feats)):
            key, value = "", b""
            for n, _, item in fields(as_bytes(entry)):
                if n == 1:
                    key = as_bytes(item).decode()
                elif n == 2:
                    value = as_bytes(item)
            features[key] = _decode_feature(value)
    return features


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


SHARD_NAME = "a TFRecord shard"  # in messages
SHUFFLES_LIST = False  # its reader keeps storage order; only the shuffle buffer mixes (reader.ReaderModel)
PYTHON_FED = False  # read by a DALI reader (dali_reader)
SNIFF_BYTES = HEADER_BYTES


def sniff_name(name: str) -> bool:
    """TFRecord shards have no fixed extension: only their first bytes tell (sniff_head)."""
    return False


def sniff_head(head: bytes) -> bool:
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


def build_index_stream(f: BinaryIO, where: str, index_path: str, label_ext: str = "cls") -> None:
    """The index of a remote shard, from one sequential read of it."""
    write_tfrecord_index(scan_tfrecord_stream(f, where), index_path)


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


def remote_index_matches(info: ObjectInfo, index_path: str, spot_checks: int = 16) -> bool:
    """tfrecord_index_matches for a cached index of a remote shard: the same checks against the listed object
    (its size; its record headers by ranged reads, pinned to the listed version)."""
    try:
        entries = read_tfrecord_index(index_path)
    except (OSError, ValueError):
        return False
    from dali_pipes.storage.transfer import read_range
    return entries_fit(entries, info.size) and headers_fit(entries, lambda at: read_range(info, at, HEADER_BYTES),
                                                           spot_checks)


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


# ---------------------------------------------------------------------------------------------
# The format table's entries (see formats/__init__.py).
# ---------------------------------------------------------------------------------------------

SHARDED = True
MISSING_LABEL = -2_147_483_000  # the reader's default for a missing label key (int32 range: DALI constants)
index_matches = tfrecord_index_matches


def build_index(shard: str, index_path: str, label_ext: str = "cls", damaged: list | None = None) -> None:
    write_tfrecord_index(build_tfrecord_index(shard, damaged), index_path)


def count_samples(index_path: str) -> int:
    return len(read_tfrecord_index(index_path))


read_index, write_index = read_tfrecord_index, write_tfrecord_index  # one (offset, size) entry per record


def source_info(ref: SampleRef) -> str:
    """What DALI 2.4's TFRecord reader reports as a sample's source_info."""
    return f"{ref.path} at index {ref.offset}"


def split_source_info(info: str) -> tuple[str, int]:
    """(shard path, byte offset) from source_info; ValueError if it has another form."""
    path, _, offset = info.rpartition(" at index ")
    return path, int(offset)


def check_shard(shard: str) -> None:
    """Refuse what DALI cannot read before an index is built: compressed shards."""
    compression = sniff_compression(shard)
    if compression:
        raise compressed_error(shard, compression)


def sample_refs(source: SourceRecord) -> list[SampleRef]:
    return [SampleRef("tfrecord", shard, i, str(i), offset, size, extra=(source.keys,))
            for shard, idx in zip(source.files, required(source.index_files, source, "index_files"))
            for i, (offset, size) in enumerate(read_tfrecord_index(idx))]


def read_sample(ref: SampleRef) -> Sample:
    """One record, its CRCs and keys checked. Raises DatasetError naming shard#record."""
    (keys,) = ref.extra
    where = f"{ref.path}#{ref.index}"
    from dali_pipes.storage.transfer import read_range
    frame = read_range(ref.path, ref.offset, ref.size)
    if len(frame) != ref.size:
        raise DatasetError(where, f"truncated record (byte {ref.offset})")
    if not header_fits(frame[:HEADER_BYTES], ref.size):  # the header is intact where the index is right
        raise IndexMismatchError(where, f"no record header of a {ref.size}-byte record at byte {ref.offset}, where "
                                 f"the shard's index puts one: the index does not describe the shard")
    data = frame[HEADER_BYTES:-FOOTER_BYTES]
    if struct.unpack("<I", frame[-FOOTER_BYTES:])[0] != masked_crc32c(data):
        raise DatasetError(where, "data CRC mismatch (the record's bytes are corrupt)")
    try:
        example = decode_example(data)
    except ValueError as e:
        raise DatasetError(where, f"not a tf.train.Example ({e})") from None
    missing = [k for k in (keys.image, keys.label) if k not in example]
    if missing:
        raise DatasetError(where, f"no feature {missing[0]!r}; keys present: {', '.join(sorted(example))}")
    return Sample(where, example[keys.image][0], stored_to_label(example[keys.label][0], where, keys.label_offset))


def dali_reader(source: SourceRecord, reader_args: dict):
    """(encoded images, labels) from DALI's TFRecord reader; labels shifted by label_offset and checked."""
    from nvidia.dali import fn
    from nvidia.dali import tfrecord as tfrec
    keys = source.keys
    features = {keys.image: tfrec.FixedLenFeature([], tfrec.string, ""),
                keys.label: tfrec.FixedLenFeature([1], tfrec.int64, MISSING_LABEL)}
    # DALI returns the features as a dict by key; its stub (DALI 2.4) types the reader's output as nodes
    out: Any = fn.readers.tfrecord(path=source.files, index_path=required(source.index_files, source, "index_files"),
                                   features=features, **reader_args)
    # A record without the label key gets MISSING_LABEL, negative: like a label out of range it fails
    # its batch (labels.dali_checked_labels) rather than train on it, so the bad-sample search names the
    # record. A record without the image key fails in the decoder (its default is empty), found the same way.
    return out[keys.image], dali_checked_labels(out[keys.label][0], keys.label_offset, label_bound(source)[0])


def check_source(source: SourceRecord, keys: TFRecordKeys) -> None:
    """The first record of the first and last shards has the image and label keys (check_keys): one
    ranged read each, local or s3://, from the index."""
    num_classes, classes_from = label_bound(source)
    index_files = required(source.index_files, source, "index_files")
    for i in sorted({0, len(source.files) - 1}):
        entries = read_tfrecord_index(index_files[i])
        if entries:  # an empty shard is named by the empty-file check
            label = check_keys(source.files[i], keys, first_frame=entries[0])
            check_label(label - keys.label_offset, f"{source.files[i]}#0", offset=keys.label_offset,
                        num_classes=num_classes, classes_from=classes_from)


def check_keys(shard: str, keys: TFRecordKeys, first_frame: tuple[int, int] | None = None) -> int:
    """DALI returns uninitialised memory as labels when asked for keys the records lack: check
    the first record before DALI ever sees the shard; returns its stored label. `first_frame` (offset, size)
    from the index reads just that record (an s3:// shard: one ranged GET)."""
    records: Iterator[tuple[int, int, bytes | None, RecordProblem | None]]
    if first_frame is not None:
        from dali_pipes.storage.transfer import read_range
        frame = read_range(shard, *first_frame)
        records = iter([(0, len(frame), frame[HEADER_BYTES:-FOOTER_BYTES], None)])
    else:
        records = walk_records(shard)
    for _, _, data, problem in records:
        if problem:
            raise DatasetError(shard, f"record {problem.index} (byte {problem.offset}): {problem.message}")
        assert data is not None  # walk_records(read_data=True) reads every intact record's data
        try:
            example = decode_example(data)
        except ValueError as e:
            raise DatasetError(f"{shard}#0", f"not a tf.train.Example ({e})") from e
        present = ", ".join(sorted(example)) or "none"
        for key, kind in ((keys.image, bytes), (keys.label, int)):
            if key not in example:
                raise DatasetError(f"{shard}#0", f"no feature {key!r}; keys present: {present}",
                                   "Pass the right key (TFRecordKeys / --image-key / --label-key)")
            values = example[key]
            if len(values) != 1 or not isinstance(values[0], kind):
                raise DatasetError(f"{shard}#0", f"feature {key!r} should hold one {kind.__name__} value, "
                                   f"holds {len(values)} value(s) of another type")
        return example[keys.label][0]
    raise DatasetError(shard, "empty TFRecord file (0 records)")


def verify_shard(shard: str, keys: TFRecordKeys, label_ext: str) -> tuple[list[SampleRef], list[DatasetError]]:
    """Walk the framing (headers only): readable records become refs for the per-sample checks,
    broken frames become problems (nothing after a broken frame can be trusted)."""
    check_shard(shard)
    refs, problems = [], []
    for i, (offset, size, _, problem) in enumerate(walk_records(shard, read_data=False)):
        if problem:
            problems.append(DatasetError(f"{shard}#{problem.index}", f"{problem.message} (byte {offset})"))
        else:
            refs.append(SampleRef("tfrecord", shard, i, str(i), offset, size, extra=(keys,)))
    return refs, problems


def rewrite_without(shard: str, index_path: str, target: str, bad: set[str], jpeg: bytes, source: SourceRecord) -> None:
    """Copy `shard` to `target` with the records numbered in `bad` replaced by a placeholder
    record (the placeholder image, label PADDING_LABEL), and write the copy's index."""
    keys = source.keys
    stand_in = frame_record(encode_example({keys.image: jpeg, keys.label: EXCLUDED_LABEL}))  # reads as PADDING_LABEL
    entries, offset = [], 0
    from dali_pipes.storage.transfer import local_copy
    with local_copy(shard) as local, open(local, "rb") as f, atomic_write(target, "wb") as out:
        for i, (start, size) in enumerate(read_tfrecord_index(index_path)):  # the indexed (readable) records
            f.seek(start)
            frame = stand_in if str(i) in bad else f.read(size)
            out.write(frame)
            entries.append((offset, len(frame)))
            offset += len(frame)
    write_tfrecord_index(entries, target + ".idx")
