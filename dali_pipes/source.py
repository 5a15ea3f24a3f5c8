"""Sources: one entry point from a location to checked (encoded image, label) samples.

`open_source(location)` recognises the location (location.py), lists and checks it with its format
module (formats/), builds missing indexes (indexes.py) and returns a `Source`: the files or shards,
their indexes and sample counts. It checks before DALI builds anything, because DALI's own failures
on bad input are C++ asserts, silent record drops or uninitialised labels. A Source then gives DALI
reader nodes for a pipeline (`reader.dali_reader`) or plain Python samples (`iter_samples`).

An s3:// location gives a Source whose `files` are s3:// URLs and whose `remote` holds each file's
ObjectInfo as listed (size, ETag, last-modified); its indexes are local, in the index cache, keyed
by that version (indexes.ensure_remote_indexes). The loader reads such a source through the shard
cache or DALI's own s3:// reading (loader.py, remote_feed.py).
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Iterator

from dali_pipes import indexes, object_store
from dali_pipes.errors import DatasetError
from dali_pipes.formats import format_of, image_files, read_sample
from dali_pipes.location import Location, classify, classify_remote, describe, is_remote
from dali_pipes.object_store import ObjectInfo
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
    remote: list[ObjectInfo] | None = None  # per file, for s3:// sources: what was listed
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
    if is_remote(location):
        source = _remote_source(location, keys, label_ext, index_cache_dir, build_indexes, progress)
    else:
        kind, shards = classify(location)
        if kind == "folder":
            source = folder_source(str(location))
        elif kind == "file_list":
            source = file_list_source(str(location))
        else:
            source = _shard_source(kind, describe(location), shards, keys, label_ext, index_cache_dir,
                                   build_indexes, progress, skip_bad)
    if check_keys:
        source.format.check_source(source, keys)  # the format's own check, before DALI sees the data
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


def _remote_source(location: Location, keys: TFRecordKeys, label_ext: str, index_cache_dir: str | None,
                   build: bool, progress: bool) -> Source:
    """open_source for s3:// locations: listed through object_store, indexes built by streaming."""
    kind, infos = classify_remote(location)
    if kind == "folder":
        return remote_folder_source(str(location))
    if kind == "file_list":
        return remote_list_source(str(location), keys, label_ext, index_cache_dir, build, progress)
    return _remote_shard_source(kind, describe(location), infos, keys, label_ext, index_cache_dir, build, progress)


def _remote_shard_source(kind: str, where: str, infos: list[ObjectInfo], keys: TFRecordKeys, label_ext: str,
                         index_cache_dir: str | None, build: bool, progress: bool) -> Source:
    index_files = indexes.ensure_remote_indexes(infos, kind, cache_dir=index_cache_dir, build=build,
                                                progress=progress, label_ext=label_ext)
    fmt = format_of(kind)
    return Source(kind, where, [info.url for info in infos], index_files=index_files,
                  counts=[fmt.count_samples(idx) for idx in index_files],
                  classes=_read_remote_classes_json(infos[0].url), keys=keys, label_ext=label_ext, remote=infos)


def remote_folder_source(prefix: str) -> Source:
    """An image folder below an s3:// prefix: the class of an object is the first key segment
    below the prefix (s3://b/train/<class>/<image>.jpg), classes sorted as locally."""
    prefix = prefix.rstrip("/") + "/"
    images = [o for o in object_store.list_objects(prefix)
              if "/" in object_store.relative_to(o.url, prefix) and o.url.lower().endswith(image_files.IMAGE_EXTENSIONS)
              and not object_store.relative_to(o.url, prefix).startswith(".")]
    if not images:
        raise DatasetError(prefix, f"no images found; expected {prefix}<class name>/<image>.jpg "
                           f"(extensions: {' '.join(image_files.IMAGE_EXTENSIONS)})")
    class_of = [object_store.relative_to(o.url, prefix).split("/", 1)[0] for o in images]
    classes = sorted(set(class_of))
    label = {name: i for i, name in enumerate(classes)}
    pairs = sorted(zip(class_of, images), key=lambda p: (label[p[0]], p[1].url))
    return Source("folder", prefix, [o.url for _, o in pairs], labels=[label[c] for c, _ in pairs], classes=classes,
                  remote=[o for _, o in pairs])


def remote_list_source(list_url: str, keys: TFRecordKeys, label_ext: str, index_cache_dir: str | None,
                       build: bool, progress: bool) -> Source:
    """A text object: a file list ("relative/key label" lines) or a list of shards, entries
    relative to the list's prefix. One listing of that prefix finds every entry's object."""
    try:
        text = object_store.read_bytes(list_url).decode()
    except UnicodeDecodeError:
        raise DatasetError(list_url, "not a recognised dataset (not a TFRecord, .tar, prefix or text list)") from None
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith("#")]
    if not lines:
        raise DatasetError(list_url, "empty list file")
    base = object_store.dirname(list_url)
    listed = {o.url: o for o in object_store.list_objects(base)}
    if not image_files.looks_like_file_list_line(lines[0]):
        infos = [_listed(listed, object_store.join(base, posixpath.normpath(l.strip())), list_url) for l in lines]
        from dali_pipes.location import remote_shard_kind
        return _remote_shard_source(remote_shard_kind(infos, list_url), list_url, infos, keys, label_ext,
                                    index_cache_dir, build, progress)
    infos, labels = [], []
    for number, line in enumerate(lines, 1):
        if not image_files.looks_like_file_list_line(line):
            raise DatasetError(f"{list_url}:{number}", f"expected 'relative/key label', got {line.strip()!r}")
        relative, label = line.strip().rsplit(maxsplit=1)
        if relative.startswith("/") or ".." in relative.split("/"):
            raise DatasetError(f"{list_url}:{number}", f"{relative!r} is outside the list's prefix {base}",
                               "Keys must be relative to it")
        infos.append(_listed(listed, object_store.join(base, posixpath.normpath(relative)), list_url))
        labels.append(int(label))
    return Source("file_list", list_url, [o.url for o in infos], labels=labels, remote=infos)


def _listed(listed: dict[str, ObjectInfo], url: str, list_url: str) -> ObjectInfo:
    if url not in listed:
        raise FileNotFoundError(f"{url}: listed in {list_url} but no such object")
    return listed[url]


def _read_remote_classes_json(shard_url: str) -> list[str] | None:
    try:
        return json.loads(object_store.read_bytes(object_store.join(object_store.dirname(shard_url),
                                                                    "classes.json"))).get("classes")
    except FileNotFoundError:
        return None


def samples_source(root: str, samples: list[tuple[str, int]], classes: list[str] | None,
                   skip_bad: bool = False) -> Source:
    """A Source over a given list of (image path, label), as a torchvision dataset lists them: its
    sample list and class mapping are taken, the folder is not scanned again."""
    source = Source("folder", root, [path for path, _ in samples], labels=[label for _, label in samples],
                    classes=classes)
    _check_nonempty_files(source, skip_bad)  # a missing file fails here, naming it
    return source


def folder_source(root: str) -> Source:
    files, labels, classes = image_files.list_folder(root)
    return Source("folder", root, files, labels=labels, classes=classes)


def file_list_source(list_path: str, missing_ok: bool = False) -> Source:
    files, labels = image_files.read_file_list(list_path, missing_ok)
    return Source("file_list", list_path, files, labels=labels)


def _check_nonempty_files(source: Source, skip_bad: bool) -> None:
    """DALI's file reader dies on a 0-byte file (its default mmap fails), naming nothing useful:
    refuse them, or (skip_bad, image files) list them for exclusion."""
    if source.remote is not None:
        empty = [info.url for info in source.remote if info.size == 0]
    else:
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
