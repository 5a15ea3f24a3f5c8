"""TFRecord shards as a format: tf.train.Example encoding, and the TFRecord format's entries in the format table
(samples, the DALI reader, verification, exclusion). The file layer under them (frames, compression, walking
records, DALI's index files) is tfrecord_framing.py.

A TFRecord file is a sequence of records, each framed as
    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
(little-endian). `data` is a serialized `tf.train.Example` protobuf. The index that DALI's
TFRecord reader needs holds one line per record: "<byte offset> <framed size>".

Everything here is written from the TFRecord and protobuf specifications, so that records
written by TensorFlow read here and records written here parse in TensorFlow.
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO, Iterator

from dali_pipes.data.formats.tfrecord_framing import (
    FOOTER_BYTES,
    HEADER_BYTES,
    RecordProblem,
    build_tfrecord_index,
    compressed_error,
    entries_fit,
    frame_record,
    header_fits,
    header_looks_like_tfrecord,
    headers_fit,
    masked_crc32c,
    read_tfrecord_index,
    scan_tfrecord_stream,
    sniff_compression,
    tfrecord_index_matches,
    walk_records,
    write_tfrecord_index,
)
from dali_pipes.data.labels import EXCLUDED_LABEL, check_label, dali_checked_labels, label_bound, stored_to_label
from dali_pipes.data.protobuf import as_bytes, fields, read_varint
from dali_pipes.data.samples import Sample, SampleKeys, SampleRef, SourceRecord, required
from dali_pipes.errors import DatasetError, IndexMismatchError
from dali_pipes.storage.files import atomic_write
from dali_pipes.storage.remote_urls import ObjectInfo

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
# The format table's entries (see formats/__init__.py).
# ---------------------------------------------------------------------------------------------

SHARDED = True
SHARD_NAME = "a TFRecord shard"  # in messages
SHUFFLES_LIST = False  # its reader keeps storage order; only the shuffle buffer mixes (reader.ReaderModel)
PYTHON_FED = False  # read by a DALI reader (dali_reader)
SNIFF_BYTES = HEADER_BYTES


def sniff_name(name: str) -> bool:
    """TFRecord shards have no fixed extension: only their first bytes tell (sniff_head)."""
    return False


def sniff_head(head: bytes) -> bool:
    return header_looks_like_tfrecord(head)


def build_index_stream(f: BinaryIO, where: str, index_path: str, label_ext: str = "cls") -> None:
    """The index of a remote shard, from one sequential read of it."""
    write_tfrecord_index(scan_tfrecord_stream(f, where), index_path)


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


def check_source(source: SourceRecord, keys: SampleKeys) -> None:
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


def check_keys(shard: str, keys: SampleKeys, first_frame: tuple[int, int] | None = None) -> int:
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
                                   "Pass the right key (SampleKeys / --image-key / --label-key)")
            values = example[key]
            if len(values) != 1 or not isinstance(values[0], kind):
                raise DatasetError(f"{shard}#0", f"feature {key!r} should hold one {kind.__name__} value, "
                                   f"holds {len(values)} value(s) of another type")
        return example[keys.label][0]
    raise DatasetError(shard, "empty TFRecord file (0 records)")


def verify_shard(shard: str, keys: SampleKeys, label_ext: str) -> tuple[list[SampleRef], list[DatasetError]]:
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
