"""Sources: one entry point from a location to checked (encoded image, label) samples.

`open_source(location)` recognises the location (location.py), lists and checks it with its format
module (formats/), builds missing indexes (indexes.py) and returns a `Source`: the files or shards,
their indexes and sample counts. It checks before DALI builds anything, because DALI's own failures
on bad input are C++ asserts, silent record drops or uninitialised labels. A Source then gives DALI
reader nodes for a pipeline (`reader.dali_reader`) or plain Python samples (`iter_samples`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Iterator

from dali_pipes import indexes
from dali_pipes.errors import DatasetError
from dali_pipes.formats import format_of, image_files, read_sample, tfrecord
from dali_pipes.location import Location, classify, describe
from dali_pipes.samples import Sample, SampleRef, TFRecordKeys


@dataclass
class Source:
    """A checked dataset location. `files` are image paths (folder, file_list) or shards."""
    kind: str
    location: str
    files: list[str]
    labels: list[int] | None = None  # per image, for folder and file_list
    index_files: list[str] | None = None  # per shard, for tfrecord and webdataset
    counts: list[int] | None = None  # samples per shard
    classes: list[str] | None = None
    keys: TFRecordKeys = field(default_factory=TFRecordKeys)
    label_ext: str = "cls"
    # Damage found while opening with skip_bad=True: (ref of a sample to exclude in place, or None
    # when the damaged sample is simply not in the index; what is wrong). BadSamplePolicy takes it.
    damaged: list[tuple[SampleRef | None, DatasetError]] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return len(self.files) if self.counts is None else sum(self.counts)

    @property
    def format(self):
        """The format module of this source's kind (formats/)."""
        return format_of(self.kind)

    def dali_reader(self, **reader_args):
        """Reader nodes inside a DALI pipeline definition (see reader.dali_reader)."""
        from dali_pipes.reader import dali_reader
        return dali_reader(self, **reader_args)

    def refs(self) -> list[SampleRef]:
        """A picklable handle per sample, in storage order; `formats.read_sample(ref)` reads it in
        any process. Converters and verification fan these out to worker processes."""
        return self.format.sample_refs(self)

    def iter_samples(self) -> Iterator[Sample]:
        """Every sample, in storage order, read in Python (converters, verification, tests)."""
        for ref in self.refs():
            yield read_sample(ref)


def open_source(location: Location, *, keys: TFRecordKeys | None = None, label_ext: str = "cls",
                index_cache_dir: str | None = None, build_indexes: bool = True, progress: bool = True,
                check_keys: bool = True, skip_bad: bool = False) -> Source:
    """Recognise what `location` is, check it, build missing indexes, and return a Source.

    Raises FileNotFoundError for paths that do not exist and DatasetError (a ValueError) for
    anything DALI could not read correctly, each naming the file and the fix. With skip_bad=True,
    damage confined to samples (a zero-byte image, a truncated last record or tar member, an
    incomplete tar sample) is listed in `source.damaged` instead; damage that leaves nothing
    readable (a compressed or foreign shard) still raises."""
    keys = keys or TFRecordKeys()
    kind, shards = classify(location)
    if kind == "folder":
        source = folder_source(str(location))
    elif kind == "file_list":
        source = file_list_source(str(location))
    else:
        source = _shard_source(kind, describe(location), shards, keys, label_ext, index_cache_dir,
                               build_indexes, progress, skip_bad)
        if kind == "tfrecord" and check_keys:
            for shard in sorted({shards[0], shards[-1]}):
                tfrecord.check_keys(shard, keys)
    _check_nonempty_files(source, skip_bad)
    return source


def _shard_source(kind: str, where: str, shards: list[str], keys: TFRecordKeys, label_ext: str,
                  index_cache_dir: str | None, build: bool, progress: bool, skip_bad: bool) -> Source:
    fmt = format_of(kind)
    for shard in shards:
        fmt.check_shard(shard)
    damaged: list[DatasetError] | None = [] if skip_bad else None
    index_files = indexes.ensure_indexes(shards, kind, cache_dir=index_cache_dir, build=build, progress=progress,
                                         label_ext=label_ext, damaged=damaged)
    return Source(kind, where, shards, index_files=index_files,
                  counts=[fmt.count_samples(idx) for idx in index_files], classes=_read_classes_json(shards[0]),
                  keys=keys, label_ext=label_ext, damaged=[(None, e) for e in damaged or []])


def folder_source(root: str) -> Source:
    files, labels, classes = image_files.list_folder(root)
    return Source("folder", root, files, labels=labels, classes=classes)


def file_list_source(list_path: str, missing_ok: bool = False) -> Source:
    files, labels = image_files.read_file_list(list_path, missing_ok)
    return Source("file_list", list_path, files, labels=labels)


def _check_nonempty_files(source: Source, skip_bad: bool) -> None:
    """DALI's file reader dies on a 0-byte file (its default mmap fails), naming nothing useful:
    refuse them, or (skip_bad, image files) list them for exclusion."""
    empty = [p for p in source.files if os.path.getsize(p) == 0]
    if empty and skip_bad and not source.format.SHARDED:
        empty_set = set(empty)
        source.damaged += [(ref, DatasetError(ref.path, "zero-byte file")) for ref in source.refs()
                           if ref.path in empty_set]
    elif empty:
        what = "images" if source.kind in ("folder", "file_list") else "shards"
        raise DatasetError(empty[0], f"empty (0-byte) file; {len(empty)} {what} in {source.location} are empty",
                           f"Remove them, or train from a clean list: python scripts/verify_dataset.py {source.location} "
                           f"--write-clean-list clean.txt (or: dali-pipes verify ...)")


def _read_classes_json(shard: str) -> list[str] | None:
    path = os.path.join(os.path.dirname(os.path.abspath(shard)), "classes.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("classes")
