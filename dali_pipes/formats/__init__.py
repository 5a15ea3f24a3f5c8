"""The format table: one module per storage format, all with the same entries.

A format module provides
    SHARDED                         bool: samples live in shard files that need an index
    sample_refs(source)             a SampleRef per sample, in storage order
    read_sample(ref)                the Sample a ref names (raises DatasetError if it is unreadable)
    dali_reader(source, args)       DALI reader nodes: (encoded images, labels)
    source_info(ref)                what DALI reports as the sample's source_info (elastic resume)
and, when SHARDED: check_shard, build_index, index_matches, count_samples, read_index, write_index,
split_source_info, verify_shard (readable refs and problems of one shard, without decoding), rewrite_without.
A new format costs one module and one entry below, not edits across the package.
"""

from __future__ import annotations

from types import ModuleType

from dali_pipes.formats import image_files, tfrecord, webdataset
from dali_pipes.samples import Sample, SampleRef

FORMATS: dict[str, ModuleType] = {
    "folder": image_files,
    "file_list": image_files,
    "tfrecord": tfrecord,
    "webdataset": webdataset,
}
KINDS = tuple(FORMATS)
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
