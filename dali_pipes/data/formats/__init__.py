"""The format table: one module per storage format, each satisfying the `Format` protocol below.

A new format costs one module and one entry in FORMATS, not edits across the package. Sharded formats
(SHARDED) also provide the index and shard entries listed under `ShardedFormat`, and have an entry in
SHARDED_FORMATS; formats that DALI has no reader for (PYTHON_FED: Parquet) feed DALI from Python, with the
entries listed under `PythonFedFormat`. The tables are typed with the protocols, so the type checker (mypy, in
CI) holds every module to them.
"""

from __future__ import annotations

from typing import Any, BinaryIO, Callable, Protocol

from dali_pipes.data.formats import image_files, parquet, tfrecord, webdataset
from dali_pipes.data.samples import ReadPlan, Sample, SampleKeys, SampleRef, SourceRecord
from dali_pipes.errors import DatasetError
from dali_pipes.storage.remote_urls import ObjectInfo


class Format(Protocol):
    """What every format module provides."""
    SHARDED: bool  # samples live in shard files that need an index
    SHUFFLES_LIST: bool  # its DALI reader shuffles its list once in train (reader.ReaderModel)
    PYTHON_FED: bool  # no DALI reader: fed from Python through fn.external_source (PythonFedFormat)

    def sample_refs(self, source: SourceRecord) -> list[SampleRef]: ...  # a ref per sample, storage order
    def read_sample(self, ref: SampleRef) -> Sample: ...  # DatasetError if unreadable
    def dali_reader(self, source: SourceRecord, reader_args: dict) -> tuple: ...  # (encoded images, labels)
    def source_info(self, ref: SampleRef) -> str: ...  # DALI's source_info of the sample (elastic resume)
    def check_source(self, source: SourceRecord, keys: SampleKeys) -> None: ...  # before DALI sees it


class ShardedFormat(Format, Protocol):
    """What a SHARDED format module provides besides: recognising, indexing and rewriting its shards."""
    SHARD_NAME: str  # in messages: "a TFRecord shard"
    SNIFF_BYTES: int  # the head its shards are told by

    def sniff_name(self, name: str) -> bool: ...
    def sniff_head(self, head: bytes) -> bool: ...
    def check_shard(self, shard: str) -> None: ...
    def build_index(self, shard: str, index_path: str, label_ext: str = ..., damaged: list | None = ...) -> None: ...
    def build_index_stream(self, f: BinaryIO, where: str, index_path: str, label_ext: str = ...) -> None: ...
    def index_matches(self, path: str, index_path: str, spot_checks: int = ...) -> bool: ...
    # The same checks of a cached index of a remote shard, against the listed object (ranged reads).
    def remote_index_matches(self, info: ObjectInfo, index_path: str, spot_checks: int = ...) -> bool: ...
    def count_samples(self, index_path: str) -> int: ...
    # An index's entries: the format's own (TFRecord: (offset, size) per record; tar: members per sample).
    def read_index(self, index_path: str) -> list[Any]: ...
    def write_index(self, entries: list[Any], index_path: str, /) -> None: ...
    def split_source_info(self, info: str) -> tuple[str, int]: ...  # (shard, byte offset); ValueError
    def verify_shard(self, shard: str, keys: SampleKeys,
                     label_ext: str) -> tuple[list[SampleRef], list[DatasetError]]: ...
    def rewrite_without(self, shard: str, index_path: str, target: str, bad: set[str], jpeg: bytes,
                        source: SourceRecord) -> None: ...


class PythonFedFormat(ShardedFormat, Protocol):
    """What a PYTHON_FED format provides besides: its own DALI source, read as reader.ReaderModel plans it
    (`plan`), and the read order of a shuffled epoch for that model (`order_model`)."""

    def python_reader(self, source: SourceRecord, plan: ReadPlan, seed: int, shuffle: bool,
                      with_ids: bool) -> tuple: ...  # (encoded images, labels, identity rows or None)
    def order_model(self, source: SourceRecord, seed: int, fill: int) -> Callable: ...


SHARDED_FORMATS: dict[str, ShardedFormat] = {  # modules, read through the ShardedFormat protocol
    "tfrecord": tfrecord,
    "webdataset": webdataset,
    "parquet": parquet,
}
FORMATS: dict[str, Format] = {  # modules, read through the Format protocol
    "folder": image_files,
    "file_list": image_files,
    **SHARDED_FORMATS,
}
KINDS = tuple(FORMATS)
SHARD_KINDS = tuple(SHARDED_FORMATS)
UNNAMED_SHARD_KIND = "tfrecord"  # the kind whose shards no name tells: an unreadable (empty) one is taken for it
SNIFF_BYTES = max(f.SNIFF_BYTES for f in SHARDED_FORMATS.values())  # the head a shard's kind is told from
LEGACY_KINDS = {"file": "folder"}  # 0.2.0's SampleRef kind of an image file (in saved loader states)


def format_of(kind: str) -> Format:
    try:
        return FORMATS[LEGACY_KINDS.get(kind, kind)]
    except KeyError:
        raise ValueError(f"unknown dataset kind {kind!r}; known: {', '.join(FORMATS)}") from None


def sharded_format_of(kind: str) -> ShardedFormat:
    """The format of a shard kind ("tfrecord", "webdataset"); ValueError for another kind."""
    try:
        return SHARDED_FORMATS[kind]
    except KeyError:
        raise ValueError(f"{kind!r} is not a kind of shards; shard kinds: {', '.join(SHARD_KINDS)}") from None


def format_of_ref(ref: SampleRef) -> Format:
    return format_of(ref.kind)


def read_sample(ref: SampleRef) -> Sample:
    """Read one sample from its ref, in any process (converters and verification fan refs out)."""
    return format_of_ref(ref).read_sample(ref)


def shard_kind_by_name(name: str) -> str | None:
    """The shard kind a file name tells (".tar": webdataset), or None."""
    return next((k for k, f in SHARDED_FORMATS.items() if f.sniff_name(name)), None)


def shard_kind_of(name: str, read_head: Callable[[], bytes]) -> str | None:
    """The kind of a shard by its name, else by its first SNIFF_BYTES (read only then); None if no
    format recognises it. location.py asks this, locally and for s3:// objects alike."""
    kind = shard_kind_by_name(name)
    if kind is not None:
        return kind
    head = read_head()
    return next((k for k, f in SHARDED_FORMATS.items() if f.sniff_head(head)), None)


def not_a_shard() -> str:
    """'neither a TFRecord shard nor a .tar shard': what a message says of an unrecognised file."""
    return "neither " + " nor ".join(f.SHARD_NAME for f in SHARDED_FORMATS.values())
