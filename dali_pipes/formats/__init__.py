"""The format table: one module per storage format, all with the same entries.

A format module provides
    SHARDED                         bool: samples live in shard files that need an index
    sample_refs(source)             a SampleRef per sample, in storage order
    read_sample(ref)                the Sample a ref names (raises DatasetError if it is unreadable)
    dali_reader(source, args)       DALI reader nodes: (encoded images, labels)
    source_info(ref)                what DALI reports as the sample's source_info (elastic resume)
    SHUFFLES_LIST                   bool: its DALI reader shuffles its list once in train (reader.ReaderModel)
and, when SHARDED: SHARD_NAME, SNIFF_BYTES, sniff_name(name), sniff_head(head), check_shard, build_index, index_matches, count_samples, read_index, write_index,
split_source_info, verify_shard (readable refs and problems of one shard, without decoding), rewrite_without.
A new format costs one module and one entry below, not edits across the package.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

from dali_pipes.formats import image_files, tfrecord, webdataset
from dali_pipes.samples import Sample, SampleRef

FORMATS: dict[str, ModuleType] = {
    "folder": image_files,
    "file_list": image_files,
    "tfrecord": tfrecord,
    "webdataset": webdataset,
}
KINDS = tuple(FORMATS)
SHARD_KINDS = ("tfrecord", "webdataset")
UNNAMED_SHARD_KIND = "tfrecord"  # the kind whose shards no name tells: an unreadable (empty) one is taken for it
SNIFF_BYTES = max(FORMATS[k].SNIFF_BYTES for k in SHARD_KINDS)  # the head a shard's kind is told from
_BY_REF_KIND = {"file": image_files, "tfrecord": tfrecord, "webdataset": webdataset}


def format_of(kind: str) -> ModuleType:
    try:
        return FORMATS[kind]
    except KeyError:
        raise ValueError(f"unknown dataset kind {kind!r}; known: {', '.join(FORMATS)}") from None


def format_of_ref(ref: SampleRef) -> ModuleType:
    return _BY_REF_KIND[ref.kind]


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
