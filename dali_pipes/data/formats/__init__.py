"""The format table: one module per storage format, each satisfying the `Format` protocol below.

A new format costs one module and one entry in FORMATS, not edits across the package. Sharded formats
(SHARDED) also provide the index and shard entries listed under `ShardedFormat`; formats that DALI has no
reader for (PYTHON_FED: Parquet) feed DALI from Python, with the entries listed under `PythonFedFormat`.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from dali_pipes.data.formats import image_files, parquet, tfrecord, webdataset
from dali_pipes.data.samples import ReadPlan, Sample, SampleRef, SourceRecord, TFRecordKeys


class Format(Protocol):
    """What every format module provides."""
    SHARDED: bool  # samples live in shard files that need an index
    SHUFFLES_LIST: bool  # its DALI reader shuffles its list once in train (reader.ReaderModel)
    PYTHON_FED: bool  # no DALI reader: fed from Python through fn.external_source (PythonFedFormat)

    def sample_refs(self, source: SourceRecord) -> list[SampleRef]: ...  # a ref per sample, storage order
    def read_sample(self, ref: SampleRef) -> Sample: ...  # DatasetError if unreadable
    def dali_reader(self, source: SourceRecord, reader_args: dict) -> tuple: ...  # (encoded images, labels)
    def source_info(self, ref: SampleRef) -> str: ...  # DALI's source_info of the sample (elastic resume)
    def check_source(self, source: SourceRecord, keys: TFRecordKeys) -> None: ...  # before DALI sees it
    def excluded_files(self, source: SourceRecord, bad_refs: list, placeholder: str) -> tuple: ...


class ShardedFormat(Format, Protocol):
    """What a SHARDED format module provides besides: recognising, indexing and rewriting its shards."""
    SHARD_NAME: str  # in messages: "a TFRecord shard"
    SNIFF_BYTES: int  # the head its shards are told by

    def sniff_name(self, name: str) -> bool: ...
    def sniff_head(self, head: bytes) -> bool: ...
    def check_shard(self, shard: str) -> None: ...
    def build_index(self, shard: str, target: str, label_ext: str, damaged: list | None) -> None: ...
    def build_index_stream(self, *args: Any) -> Any: ...
    def index_matches(self, shard: str, index: str) -> bool: ...
    def count_samples(self, index: str) -> int: ...
    def read_index(self, index: str) -> list: ...
    def write_index(self, entries: Sequence, index: str) -> None: ...
    def split_source_info(self, key: str) -> tuple[str, int]: ...
    def verify_shard(self, *args: Any) -> Any: ...
    def rewrite_without(self, shard: str, index_path: str, target: str, bad: set[str], jpeg: bytes,
                        source: SourceRecord) -> None: ...


class PythonFedFormat(ShardedFormat, Protocol):
    """What a PYTHON_FED format provides besides: its own DALI source, read as reader.ReaderModel plans it
    (`plan`), and the read order of a shuffled epoch for that model (`order_model`)."""

    def python_reader(self, source: SourceRecord, plan: ReadPlan, seed: int, shuffle: bool,
                      with_ids: bool) -> tuple: ...  # (encoded images, labels, identity rows or None)
    def order_model(self, source: SourceRecord, seed: int, fill: int) -> Callable: ...


FORMATS: dict[str, Format] = {  # modules, read through the Format protocol
    "folder": image_files,
    "file_list": image_files,
    "tfrecord": tfrecord,
    "webdataset": webdataset,
    "parquet": parquet,
}
KINDS = tuple(FORMATS)
SHARD_KINDS = ("tfrecord", "webdataset", "parquet")
UNNAMED_SHARD_KIND = "tfrecord"  # the kind whose shards no name tells: an unreadable (empty) one is taken for it
SNIFF_BYTES = max(FORMATS[k].SNIFF_BYTES for k in SHARD_KINDS)  # the head a shard's kind is told from
LEGACY_KINDS = {"file": "folder"}  # 0.2.0's SampleRef kind of an image file (in saved loader states)


def format_of(kind: str) -> Format:
    try:
        return FORMATS[LEGACY_KINDS.get(kind, kind)]
    except KeyError:
        raise ValueError(f"unknown dataset kind {kind!r}; known: {', '.join(FORMATS)}") from None


def format_of_ref(ref: SampleRef) -> Format:
    return format_of(ref.kind)


def read_sample(ref: SampleRef) -> Sample:
    """Read one sample from its ref, in any process (converters and verification fan refs out)."""
    return format_of_ref(ref).read_sample(ref)


def shard_kind_by_name(name: str) -> str | None:
    """The shard kind a file name tells (".tar": webdataset), or None."""
    return next((k for k in SHARD_KINDS if FORMATS[k].sniff_name(name)), None)


def shard_kind_of(name: str, read_head: Callable[[], bytes]) -> str | None:
    """The kind of a shard by its name, else by its first SNIFF_BYTES (read only then); None if no
    format recognises it. location.py asks this, locally and for s3:// objects alike."""
    kind = shard_kind_by_name(name)
    if kind is not None:
        return kind
    head = read_head()
    return next((k for k in SHARD_KINDS if FORMATS[k].sniff_head(head)), None)


def not_a_shard() -> str:
    """'neither a TFRecord shard nor a .tar shard': what a message says of an unrecognised file."""
    return "neither " + " nor ".join(FORMATS[k].SHARD_NAME for k in SHARD_KINDS)
