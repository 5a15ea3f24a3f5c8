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

Opening also checks what can be checked without reading the data: labels where they are listed (labels.py),
a conversion's manifest.json beside shards (manifest.py), and takes one stat per file, which gives the
data's fingerprint (fingerprint.py) that a resumed loader state is checked against.
"""

from __future__ import annotations

import glob
import json
import os
import posixpath
import warnings
from dataclasses import dataclass, field, replace
from typing import Iterator

from dali_pipes.data import fingerprint, indexes, manifest
from dali_pipes.data.formats import (
    Format,
    ShardedFormat,
    format_of,
    image_files,
    read_sample,
    shard_kind_by_name,
    sharded_format_of,
)
from dali_pipes.data.labels import check_label, label_bound, offset_fix
from dali_pipes.data.location import Location, classify, classify_remote, describe, is_remote, named
from dali_pipes.data.samples import Sample, SampleKeys, SampleRef
from dali_pipes.errors import DatasetError, LabelError
from dali_pipes.storage import remote, remote_urls, transfer
from dali_pipes.storage.remote_urls import ObjectInfo


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
    # The class count the run uses (open_source's num_classes: a model's outputs, --num-classes), where given.
    # Labels must be below it and below len(classes): labels.label_bound, in the graph and at open.
    num_classes: int | None = None
    keys: SampleKeys = field(default_factory=SampleKeys)
    label_ext: str = "cls"
    remote: list[ObjectInfo] | None = None  # per file, for s3:// sources: what was listed
    # Damage found while opening with skip_bad=True: (ref of a sample to exclude in place, or None
    # when the damaged sample is simply not in the index; what is wrong). BadSamplePolicy takes it.
    damaged: list[tuple[SampleRef | None, DatasetError]] = field(default_factory=list)
    # Of the files as opened (fingerprint.py): kept through exclusions, checked by a resume (resume.py).
    fingerprint: dict | None = None
    # (width, height): the box around every image, where a conversion manifest lists it for every shard read;
    # the GPU decoders preallocate for it (graph.augment's decoder_size_hint), else for ImageNet's largest image.
    largest_image: tuple[int, int] | None = None

    @property
    def num_samples(self) -> int:
        return len(self.files) if self.counts is None else sum(self.counts)

    @property
    def format(self) -> Format:
        """The format module of this source's kind (formats/)."""
        return format_of(self.kind)

    @property
    def sharded_format(self) -> ShardedFormat:
        """The format module of this source's shards (format.SHARDED); ValueError for image files."""
        return sharded_format_of(self.kind)

    def dali_reader(self, **reader_args):
        """Reader nodes inside a DALI pipeline definition (see reader.dali_reader)."""
        from dali_pipes.data.reader import dali_reader
        return dali_reader(self, **reader_args)

    def refs(self) -> list[SampleRef]:
        """A picklable handle per sample, in storage order; `formats.read_sample(ref)` reads it in
        any process. Converters and verification fan these out to worker processes."""
        return self.format.sample_refs(self)

    def iter_samples(self) -> Iterator[Sample]:
        """Every sample, in storage order, read in Python (converters, verification, tests)."""
        for ref in self.refs():
            yield read_sample(ref)


def open_source(location: Location, *, keys: SampleKeys | None = None, label_ext: str = "cls",
                index_cache_dir: str | None = None, build_indexes: bool = True, progress: bool = True,
                check_keys: bool = True, skip_bad: bool = False, allow_duplicates: bool = False,
                num_classes: int | None = None) -> Source:
    """Recognise what `location` is, check it, build missing indexes, and return a Source.

    Raises FileNotFoundError for paths that do not exist and DatasetError (a ValueError) for
    anything DALI could not read correctly, each naming the file and the fix; LabelError for a label
    out of range where labels are known (a file list, a manifest, the first record of a shard). With
    skip_bad=True, damage confined to samples (a zero-byte or unreadable image, a truncated last record
    or tar member, an incomplete tar sample) is listed in `source.damaged` instead; damage that leaves
    nothing readable (a compressed or foreign shard) still raises. A file list naming a sample twice is
    refused unless allow_duplicates (then each repeat is warned of). `num_classes`, the class count the
    run uses (a model's outputs), bounds the labels as a class list does (labels.label_bound)."""
    keys = keys or SampleKeys()
    _check_class_count(num_classes)
    if is_remote(location):
        source = _remote_source(location, keys, label_ext, index_cache_dir, build_indexes, progress, allow_duplicates,
                                num_classes)
    else:
        kind, shards = classify(location)
        if kind == "folder":
            source = folder_source(str(location), skip_bad)
        elif kind == "file_list":
            source = file_list_source(str(location), allow_duplicates=allow_duplicates)
        else:
            searched = isinstance(location, (str, os.PathLike)) and (os.path.isdir(location) or (
                glob.has_magic(str(location)) and not os.path.exists(location)))  # not named one by one
            source = _shard_source(kind, describe(location), shards, keys, label_ext, index_cache_dir,
                                   build_indexes, progress, skip_bad)
            source.num_classes = num_classes  # before the manifest's label range is checked against it
            _check_manifest(source, searched, skip_bad)
    source.num_classes = num_classes
    _check_listed_labels(source)
    _check_files(source, skip_bad)
    if check_keys:
        source.format.check_source(source, keys)  # the format's own check, before DALI sees the data
        _refuse_damage(source, skip_bad)
    return source


def _refuse_damage(source: Source, skip_bad: bool) -> None:
    """Bad samples a format's own check lists whatever skip_bad (Parquet: rows with no image to decode) stop the
    open unless skip_bad: the first is named, with how many there are."""
    if source.damaged and not skip_bad:
        first = source.damaged[0][1]
        count = f" ({len(source.damaged)} samples of {source.location} so)" if len(source.damaged) > 1 else ""
        raise DatasetError(first.where, f"{first.problem}{count}", first.fix)


def _shard_source(kind: str, where: str, shards: list[str], keys: SampleKeys, label_ext: str,
                  index_cache_dir: str | None, build: bool, progress: bool, skip_bad: bool) -> Source:
    fmt = sharded_format_of(kind)
    for shard in shards:
        fmt.check_shard(shard)
    damaged: list[DatasetError] | None = [] if skip_bad else None
    index_files = indexes.ensure_indexes(shards, kind, cache_dir=index_cache_dir, build=build, progress=progress,
                                         label_ext=label_ext, damaged=damaged)
    return Source(kind, where, shards, index_files=index_files,
                  counts=[fmt.count_samples(idx) for idx in index_files], classes=classes_beside(shards[0]),
                  keys=keys, label_ext=label_ext, damaged=[(None, e) for e in damaged or []])


def _remote_source(location: Location, keys: SampleKeys, label_ext: str, index_cache_dir: str | None,
                   build: bool, progress: bool, allow_duplicates: bool = False,
                   num_classes: int | None = None) -> Source:
    """open_source for remote locations: listed through storage.remote, indexes built by streaming."""
    location = named(location)  # from here on, no URL holds what grants access to it
    kind, infos = classify_remote(location)
    if kind == "folder":
        return remote_folder_source(str(location))
    if kind == "file_list":
        return remote_list_source(str(location), keys, label_ext, index_cache_dir, build, progress,
                                  allow_duplicates=allow_duplicates)
    source = _remote_shard_source(kind, describe(location), infos, keys, label_ext, index_cache_dir, build, progress)
    source.num_classes = num_classes  # before the manifest's label range is checked against it
    searched = isinstance(location, (str, os.PathLike)) and [o.url for o in infos] != [str(location)]
    _check_manifest(source, searched, False)  # a prefix or glob: the manifest's every shard must be there
    return source


def _remote_shard_source(kind: str, where: str, infos: list[ObjectInfo], keys: SampleKeys, label_ext: str,
                         index_cache_dir: str | None, build: bool, progress: bool) -> Source:
    index_files = indexes.ensure_remote_indexes(infos, kind, cache_dir=index_cache_dir, build=build,
                                                progress=progress, label_ext=label_ext)
    fmt = sharded_format_of(kind)
    return Source(kind, where, [info.url for info in infos], index_files=index_files,
                  counts=[fmt.count_samples(idx) for idx in index_files],
                  classes=_classes_json_beside_object(infos[0].url), keys=keys, label_ext=label_ext, remote=infos)


def _nested_shards_fix(prefix: str, listed: list[ObjectInfo]) -> str:
    """Where the shards below a prefix are, when they sit in subfolders (a Hub repo: data/train-*.parquet)."""
    nested = [remote_urls.relative_to(o.url, prefix) for o in listed if shard_kind_by_name(o.url)]
    if not nested:
        return ""
    folder = posixpath.dirname(nested[0])
    splits = sorted({posixpath.basename(n).split("-")[0] for n in nested if posixpath.dirname(n) == folder})
    split = "train" if "train" in splits else splits[0]
    glob_fix = f"one split's files with a glob such as {prefix}{folder}/{split}-*"
    if len(splits) > 1:  # a folder of several splits is refused as one dataset (location.check_one_set)
        return f"{len(nested)} shards are in subfolders ({nested[0]} ...): point at {glob_fix}"
    return f"{len(nested)} shards are in subfolders ({nested[0]} ...): point at them, e.g. {prefix}{folder}/, or at " \
        f"{glob_fix}"


def remote_folder_source(prefix: str) -> Source:
    """An image folder below an s3:// prefix: the class of an object is the first key segment
    below the prefix (s3://b/train/<class>/<image>.jpg), classes sorted as locally."""
    prefix = prefix.rstrip("/") + "/"
    listed = remote.list_objects(prefix)
    images = [o for o in listed
              if "/" in remote_urls.relative_to(o.url, prefix) and o.url.lower().endswith(image_files.IMAGE_EXTENSIONS)
              and not remote_urls.relative_to(o.url, prefix).startswith(".")]
    if not images:
        raise DatasetError(prefix, f"no images found; expected {prefix}<class name>/<image>.jpg (extensions: "
                           f"{' '.join(image_files.IMAGE_EXTENSIONS)})", _nested_shards_fix(prefix, listed))
    class_of = [remote_urls.relative_to(o.url, prefix).split("/", 1)[0] for o in images]
    classes = sorted(set(class_of))
    label = {name: i for i, name in enumerate(classes)}
    pairs = sorted(zip(class_of, images), key=lambda p: (label[p[0]], p[1].url))
    return Source("folder", prefix, [o.url for _, o in pairs], labels=[label[c] for c, _ in pairs], classes=classes,
                  remote=[o for _, o in pairs])


def remote_list_source(list_url: str, keys: SampleKeys, label_ext: str, index_cache_dir: str | None,
                       build: bool, progress: bool, *, allow_duplicates: bool = False,
                       problems: list | None = None) -> Source:
    """A text object: a file list ("relative/key label" lines) or a list of shards, entries
    relative to the list's prefix. One listing of that prefix finds every entry's object."""
    try:
        text = transfer.read_bytes(list_url).decode()
    except UnicodeDecodeError:
        raise DatasetError(list_url, "not a recognised dataset (not a TFRecord, .tar, prefix or text list)") from None
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith("#")]
    if not lines:
        raise DatasetError(list_url, "empty list file")
    base = remote_urls.dirname(list_url)
    listed = _objects_below(base, lines)
    if not image_files.looks_like_file_list_line(lines[0]):
        infos = [_listed(listed, remote_urls.join(base, posixpath.normpath(l.strip())), list_url) for l in lines]
        from dali_pipes.data.location import remote_shard_kind
        return _remote_shard_source(remote_shard_kind(infos, list_url), list_url, infos, keys, label_ext,
                                    index_cache_dir, build, progress)
    infos, labels, wheres = [], [], []
    numbered = [(n, l) for n, l in enumerate(text.splitlines(), 1) if l.strip() and not l.startswith("#")]
    for number, line in numbered:
        if not image_files.looks_like_file_list_line(line):
            raise DatasetError(f"{list_url}:{number}", f"expected 'relative/key label', got {line.strip()!r}")
        relative, label = line.strip().rsplit(maxsplit=1)
        if relative.startswith("/") or ".." in relative.split("/"):
            raise DatasetError(f"{list_url}:{number}", f"{relative!r} is outside the list's prefix {base}",
                               "Keys must be relative to it")
        infos.append(_listed(listed, remote_urls.join(base, posixpath.normpath(relative)), list_url))
        labels.append(int(label))
        wheres.append(f"{list_url}:{number}")
    classes = _classes_json_beside_object(list_url)
    image_files.check_listed([o.url for o in infos], labels, wheres, num_classes=len(classes) if classes else None,
                             classes_from=remote_urls.join(base, "classes.json"), allow_duplicates=allow_duplicates,
                             problems=problems)
    return Source("file_list", list_url, [o.url for o in infos], labels=labels, classes=classes, remote=infos)


def _objects_below(base: str, lines: list[str]) -> dict[str, ObjectInfo]:
    """URL -> info of the objects a list names: one listing of its prefix, or, where the scheme cannot
    list (http), a HEAD of each entry."""
    if remote_urls.SCHEMES[remote_urls.RemoteUrl.parse(base).scheme].listing:
        return {o.url: o for o in remote.list_objects(base)}
    entries = [l.strip().rsplit(maxsplit=1)[0] if image_files.looks_like_file_list_line(l) else l.strip()
               for l in lines]
    urls = [remote_urls.join(base, posixpath.normpath(e)) for e in entries if not e.startswith("/")]
    return {o.url: o for o in remote.heads(urls)}


def _listed(listed: dict[str, ObjectInfo], url: str, list_url: str) -> ObjectInfo:
    if url not in listed:
        raise FileNotFoundError(f"{url}: listed in {list_url} but no such object")
    return listed[url]


def _classes_json_beside_object(shard_url: str) -> list[str] | None:
    """The classes of classes.json beside an object, or None."""
    try:
        return json.loads(transfer.read_bytes(remote_urls.join(remote_urls.dirname(shard_url),
                                                                    "classes.json"))).get("classes")
    except FileNotFoundError:
        return None


def with_num_classes(source: Source, num_classes: int | None) -> Source:
    """`source` bounded by the class count the run uses (a Source opened elsewhere, a dataset's sample list):
    a copy whose labels known now (image files) are checked, and whose records are checked in the graph."""
    _check_class_count(num_classes)
    if num_classes is None:
        return source
    bounded = replace(source, num_classes=num_classes)
    _check_listed_labels(bounded)
    return bounded


def _check_class_count(num_classes: int | None) -> None:
    if num_classes is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)
                                    or num_classes < 1):
        raise ValueError(f"num_classes must be a count of at least 1 (or None: the dataset's), got {num_classes!r}")


def _check_listed_labels(source: Source) -> None:
    """Labels known without reading (image folders, file lists) against the class count the run uses: the
    first one at or above it raises LabelError naming its file. Their class list checked them already."""
    if source.num_classes is None or not source.labels:
        return
    bound, bound_from = label_bound(source)
    if bound is None:  # never: num_classes is given
        return
    bad = next((i for i, label in enumerate(source.labels) if label >= bound), None)
    if bad is not None:
        more = sum(label >= bound for label in source.labels) - 1
        where = source.files[bad] + (f" (and {more} more in {source.location})" if more else "")
        check_label(source.labels[bad], where, num_classes=bound, classes_from=bound_from)


def samples_source(root: str, samples: list[tuple[str, int]], classes: list[str] | None,
                   skip_bad: bool = False) -> Source:
    """A Source over a given list of (image path, label), as a torchvision dataset lists them: its
    sample list and class mapping are taken, the folder is not scanned again. A negative label is refused
    (LabelError naming the sample); the count is not checked, as a target_transform may map labels anywhere."""
    source = Source("folder", root, [path for path, _ in samples], labels=[label for _, label in samples],
                    classes=classes)
    for i, (path, label) in enumerate(samples):
        check_label(label, f"{root}: sample {i} ({path})")
    _check_files(source, skip_bad)  # a missing file fails here, naming it
    return source


def folder_source(root: str, skip_bad: bool = False) -> Source:
    files, labels, classes = image_files.list_folder(root, skip_bad)
    return Source("folder", root, files, labels=labels, classes=classes)


def file_list_source(list_path: str, missing_ok: bool = False, *, allow_duplicates: bool = False,
                     problems: list | None = None) -> Source:
    """A file list; a classes.json beside it gives the classes, which its labels must be below."""
    classes = classes_beside(list_path)
    files, labels = image_files.read_file_list(list_path, missing_ok, allow_duplicates=allow_duplicates,
                                               num_classes=len(classes) if classes else None, problems=problems)
    return Source("file_list", list_path, files, labels=labels, classes=classes)


def _check_files(source: Source, skip_bad: bool) -> None:
    """One stat per file (sizes are listed for s3:// objects): the source's fingerprint, and its files
    checked. DALI's file reader dies on a 0-byte file (its default mmap fails) and on an unreadable one,
    naming nothing useful: refuse them, or (skip_bad, image files) list them for exclusion."""
    unreadable: dict[str, str]  # {path: what is wrong}
    if source.remote is not None:
        sizes, unreadable = [info.size for info in source.remote], {}
        source.fingerprint = fingerprint.of_files(source.files, sizes, [info.etag for info in source.remote])
    else:
        sizes, unreadable = _local_sizes(source.files, check_read=not source.format.SHARDED)  # shards: read by now
        source.fingerprint = fingerprint.of_files(source.files, sizes)
    empty = {path: "zero-byte file" for path, size in zip(source.files, sizes) if size == 0}
    bad = {**unreadable, **empty}
    if bad and skip_bad and not source.format.SHARDED:
        source.damaged += [(ref, DatasetError(ref.path, bad[ref.path])) for ref in source.refs() if ref.path in bad]
    elif unreadable:
        path, problem = next(iter(unreadable.items()))
        raise DatasetError(path, f"{problem}; {len(unreadable)} files in {source.location} cannot be read",
                           "Fix them (permissions, links), remove them, or pass skip_bad=True (--skip-bad)")
    elif empty:
        images = source.kind in ("folder", "file_list")
        clean = image_files.clean_list_fix(source.location) if images else None
        raise DatasetError(next(iter(empty)), f"empty (0-byte) file; {len(empty)} {'images' if images else 'shards'} "
                           f"in {source.location} are empty", "Remove them" + (
                               f", or train from a clean list: {clean}" if clean else ""))


def _local_sizes(paths: list[str], check_read: bool = True) -> tuple[list[int], dict[str, str]]:
    """(size of each file, -1 where unreadable; {path: what is wrong} of the unreadable ones)."""
    sizes, unreadable = [], {}
    for path in paths:
        try:
            sizes.append(os.path.getsize(path))
        except OSError as e:
            if not os.path.islink(path) and isinstance(e, FileNotFoundError):
                raise FileNotFoundError(f"{path}: no such file") from None
            sizes.append(-1)
            unreadable[path] = f"unreadable ({'a dangling link' if os.path.islink(path) else e.strerror})"
            continue
        if check_read and not os.access(path, os.R_OK):
            unreadable[path] = "unreadable (no read permission)"
    return sizes, unreadable


def _check_manifest(source: Source, complete: bool, skip_bad: bool) -> None:
    """The shards against a manifest.json beside them (manifest.py), when there is one: a missing shard, or
    one it does not list (`complete`: shards found by a folder, prefix or glob, not named one by one), is
    refused (manifest.SetError); one of another size or count too, or with skip_bad (whose index build named
    the damage) warned of; so is a sample total other than its own. A classes.json that disagrees with its
    classes is refused. Its label ranges are checked against the label offset and the class count."""
    path = manifest.path_beside(source.files[0])
    found = manifest.read(path)
    if found is None:
        return
    if found.get("task") == "detection":  # boxes, not one label per image: DaliLoader(location) reads them so
        raise DatasetError(path, "detection shards (its \"task\" is \"detection\"): no class label per sample",
                           "Read them with DaliLoader(location, ...), which yields (images, targets) for detection "
                           "(docs/detection.md#by-location); or give classification shards here")
    sizes = [info.size for info in source.remote] if source.remote is not None else \
        [os.path.getsize(f) for f in source.files]
    problems = manifest.problems(found, path, source.files, sizes, source.counts, complete,
                                 manifest.name_pattern(source.location))
    for error in problems:
        if not skip_bad or isinstance(error, manifest.SetError):
            raise error
        warnings.warn(f"{error}", stacklevel=2)
    stale = manifest.classes_problem(found, path, manifest.classes_path(path), source.classes)
    if stale is not None:
        raise stale
    if source.classes is None:
        source.classes = found.get("classes")
    _check_label_span(source, manifest.label_range(found, source.files), path)
    source.largest_image = manifest.largest_image(found, source.files)


def _check_label_span(source: Source, span: tuple[int, int] | None, manifest_path: str) -> None:
    """A manifest's (lowest, highest) stored label against the label offset and the class count."""
    offset = source.keys.label_offset  # stored labels: TFRecord and WebDataset alike
    if span and span[0] - offset < 0:
        raise LabelError(source.location, f"{manifest_path} lists labels from {span[0]}: label offset {offset} makes "
                         f"them negative", offset_fix(offset))
    num_classes, classes_from = label_bound(source)
    if span and num_classes is not None:
        check_label(span[1] - offset, source.location, offset=offset, num_classes=num_classes,
                    classes_from=manifest_path if classes_from == "classes.json" else classes_from)


def classes_beside(beside: str) -> list[str] | None:
    """The classes of classes.json beside a shard or a file list (local or s3://), or None."""
    if remote_urls.is_remote(beside):
        return _classes_json_beside_object(beside)
    path = os.path.join(os.path.dirname(os.path.abspath(beside)), "classes.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("classes")
