"""Sources: one entry point from a location on disk to (encoded image, label) samples.

`open_source(location)` recognises
  * an image folder:       ROOT/<class name>/<image>      (labels: sorted class names -> 0..C-1)
  * a file list:           a text file of "relative/path label" lines, relative to its folder
  * TFRecord shards:       a folder, a glob ("train-*-of-*"), a list of paths, or a text file of paths
  * WebDataset tar shards: the same ways, with <key>.jpg + <key>.cls members
and checks it before DALI builds anything, because DALI's own failures on bad input are
C++ asserts, silent record drops or uninitialised labels. The returned `Source` then gives
DALI reader nodes for a pipeline (`dali_reader`) or plain Python samples (`iter_samples`).
"""

from __future__ import annotations

import glob
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from dali_pipes import indexes
from dali_pipes.formats import tfrecord, webdataset
from dali_pipes.errors import DatasetError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".jp2")
NOT_SHARDS = (".idx", ".json", ".txt", ".md", ".csv", ".tmp")  # files that sit beside shards
LABEL_DIGITS = 10  # .cls bytes read by the DALI graph; powers of 10 up to 10**10 are exact in lookup_table's float32

KINDS = ("folder", "file_list", "tfrecord", "webdataset")


@dataclass(frozen=True)
class Sample:
    """One sample read in Python: `origin` says where it came from (file, or shard#record)."""
    origin: str
    data: bytes
    label: int


@dataclass(frozen=True)
class TFRecordKeys:
    """Feature keys of TFRecord Examples; defaults are those of TensorFlow's ImageNet scripts."""
    image: str = "image/encoded"
    label: str = "image/class/label"
    label_offset: int = 0  # subtracted from stored labels: 1 for TensorFlow's 1-based ImageNet labels


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

    @property
    def num_samples(self) -> int:
        return len(self.files) if self.counts is None else sum(self.counts)

    def dali_reader(self, *, name: str = "Reader", shard_id: int = 0, num_shards: int = 1,
                    random_shuffle: bool = False, initial_fill: int = 1024, seed: int = -1,
                    pad_last_batch: bool = False, stick_to_shard: bool = False,
                    prefetch_queue_depth: int = 1, **reader_args):
        """Reader nodes for use inside a DALI pipeline definition: (encoded images, int64 labels).

        Labels come out as int64 scalars per sample (shape ()), already shifted by label_offset."""
        common = dict(name=name, shard_id=shard_id, num_shards=num_shards, random_shuffle=random_shuffle,
                      initial_fill=initial_fill, seed=seed, pad_last_batch=pad_last_batch,
                      stick_to_shard=stick_to_shard, prefetch_queue_depth=prefetch_queue_depth, **reader_args)
        from nvidia.dali import fn, types
        if self.kind in ("folder", "file_list"):
            # Explicit lists, not file_root walking: DALI then reads exactly what was checked here.
            images, labels = fn.readers.file(files=self.files, labels=self.labels, **common)
        elif self.kind == "tfrecord":
            from nvidia.dali import tfrecord as tfrec
            features = {self.keys.image: tfrec.FixedLenFeature((), tfrec.string, ""),
                        self.keys.label: tfrec.FixedLenFeature([1], tfrec.int64, -1)}
            out = fn.readers.tfrecord(path=self.files, index_path=self.index_files, features=features, **common)
            images, labels = out[self.keys.image], out[self.keys.label]
            if self.keys.label_offset:
                labels = labels - self.keys.label_offset
        else:
            images, cls = fn.readers.webdataset(
                paths=self.files, index_paths=self.index_files, ext=[";".join(webdataset.IMAGE_EXTS), self.label_ext],
                missing_component_behavior="error", **common)
            labels = _ascii_to_int64(cls)
        labels = fn.reshape(fn.cast(labels, dtype=types.INT64), shape=[])
        return images, labels

    def refs(self) -> list[tuple]:
        """A picklable handle per sample, in storage order; `read_sample(ref)` reads it in any
        process. Converters and verification fan these out to worker processes."""
        if self.kind in ("folder", "file_list"):
            return [("file", path, label) for path, label in zip(self.files, self.labels)]
        if self.kind == "tfrecord":
            return [("tfrecord", shard, i, offset, size, self.keys)
                    for shard, idx in zip(self.files, self.index_files)
                    for i, (offset, size) in enumerate(tfrecord.read_tfrecord_index(idx))]
        refs = []
        for shard, idx in zip(self.files, self.index_files):
            for members in webdataset.read_tar_index(idx):
                by_ext = {m.key_ext[1]: m for m in members}
                image = next(by_ext[e] for e in webdataset.IMAGE_EXTS if e in by_ext)
                refs.append(("tar", shard, image.key_ext[0], image, by_ext[self.label_ext]))
        return refs

    def iter_samples(self) -> Iterator[Sample]:
        """Every sample, in storage order, read in Python (converters, verification, tests)."""
        for ref in self.refs():
            yield read_sample(ref)


def _ascii_to_int64(cls):
    """Parse ASCII digits ("42", "42\\n", "-1") into int64 inside the DALI graph, without Python.

    The bytes are padded (then cut) to LABEL_DIGITS, each digit is weighted as if the number
    filled the whole width, and the sum is divided by 10 ** (unused width). An optional leading
    '-' negates (placeholders for excluded samples carry -1); trailing whitespace is ignored."""
    from nvidia.dali import fn, types
    width = LABEL_DIGITS
    chars = fn.cast(fn.pad(cls, axes=(0,), shape=(width,), fill_value=0)[0:width], dtype=types.INT64)
    is_digit = fn.cast((chars >= 48) & (chars <= 57), dtype=types.INT64)
    negative = fn.cast(chars[0] == 45, dtype=types.INT64)
    weights = types.Constant(np.array([10 ** (width - 1 - i) for i in range(width)], np.int64), dtype=types.INT64)
    value = fn.reductions.sum((chars - 48) * is_digit * weights, axes=0)
    used = fn.reductions.sum(is_digit, axes=0) + negative  # the '-' takes the first position
    scale = fn.lookup_table(used, keys=list(range(width + 1)),
                            values=[float(10 ** (width - k)) for k in range(width + 1)], dtype=types.INT64)
    return value // scale * (1 - 2 * negative)


def read_sample(ref: tuple) -> Sample:
    """Read one sample from a `Source.refs()` handle. Raises DatasetError if its record is bad."""
    kind, shard = ref[0], ref[1]
    if kind == "file":
        with open(shard, "rb") as f:
            return Sample(shard, f.read(), ref[2])
    with open(shard, "rb") as f:
        if kind == "tfrecord":
            _, _, index, offset, size, keys = ref
            f.seek(offset)
            frame = f.read(size)
            where = f"{shard}#{index}"
            if len(frame) != size:
                raise DatasetError(f"{where}: truncated record")
            data = frame[tfrecord.HEADER_BYTES:-tfrecord.FOOTER_BYTES]
            if struct.unpack("<I", frame[-tfrecord.FOOTER_BYTES:])[0] != tfrecord.masked_crc32c(data):
                raise DatasetError(f"{where}: data CRC mismatch (the record's bytes are corrupt)")
            try:
                example = tfrecord.decode_example(data)
            except ValueError as e:
                raise DatasetError(f"{where}: not a tf.train.Example ({e})") from None
            missing = [k for k in (keys.image, keys.label) if k not in example]
            if missing:
                raise DatasetError(f"{where}: no feature {missing[0]!r}; keys present: {', '.join(sorted(example))}")
            return Sample(where, example[keys.image][0], example[keys.label][0] - keys.label_offset)
        _, _, key, image, label = ref
        where = f"{shard}#{key}"
        return Sample(where, webdataset.read_member(f, image),
                      webdataset.parse_label(webdataset.read_member(f, label), where))


# ---------------------------------------------------------------------------------------------
# Recognising a location.
# ---------------------------------------------------------------------------------------------

def open_source(location: str | os.PathLike | Sequence[str], *, keys: TFRecordKeys | None = None,
                label_ext: str = "cls", index_cache_dir: str | None = None, build_indexes: bool = True,
                progress: bool = True, check_keys: bool = True) -> Source:
    """Recognise what `location` is, check it, build missing indexes, and return a Source.

    Raises FileNotFoundError for paths that do not exist and DatasetError (a ValueError) for
    anything DALI could not read correctly, each naming the file and the fix."""
    keys = keys or TFRecordKeys()
    kind, files = classify(location)
    if kind == "folder":
        source = folder_source(str(location))
    elif kind == "file_list":
        source = file_list_source(str(location))
    else:
        source = Source(kind, _describe(location), files, keys=keys, label_ext=label_ext)
        if kind == "tfrecord":
            for shard in files:
                compression = tfrecord.sniff_compression(shard)
                if compression:
                    raise tfrecord.compressed_error(shard, compression)
        source.index_files = indexes.ensure_indexes(files, kind, cache_dir=index_cache_dir, build=build_indexes,
                                                    progress=progress)
        source.counts = [_count_index(kind, idx) for idx in source.index_files]
        source.classes = _read_classes_json(files[0])
        if kind == "tfrecord" and check_keys:
            for shard in sorted({files[0], files[-1]}):
                check_tfrecord_keys(shard, keys)
    _check_nonempty_files(source)
    return source


def _describe(location) -> str:
    return str(location) if isinstance(location, (str, os.PathLike)) else f"{len(location)} paths"


def classify(location) -> tuple[str, list[str]]:
    """(kind, shard paths) for a location; folders and file lists get [] (listed later)."""
    if not isinstance(location, (str, os.PathLike)):
        shards = [str(p) for p in location]
        if not shards:
            raise DatasetError("an empty list of shards was given")
        for path in shards:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path}: no such shard file")
        return _shard_kind(shards, _describe(location)), shards
    location = str(location)
    if glob.has_magic(location) and not os.path.exists(location):
        shards = sorted(p for p in glob.glob(location) if os.path.isfile(p) and not p.endswith(NOT_SHARDS))
        if not shards:
            raise FileNotFoundError(f"{location}: no files match this pattern")
        return _shard_kind(shards, location), shards
    if not os.path.exists(location):
        raise FileNotFoundError(f"{location}: no such file or directory")
    if os.path.isdir(location):
        entries = [e for e in sorted(os.scandir(location), key=lambda e: e.name) if not e.name.startswith(".")]
        files = [e.path for e in entries if e.is_file() and not e.name.endswith(NOT_SHARDS)]
        shards = [p for p in files if p.endswith(".tar") or tfrecord.looks_like_tfrecord(p)]
        if shards:
            return _shard_kind(files, location), files
        if any(e.is_dir() for e in entries):
            return "folder", []
        if files:
            return _shard_kind(files, location), files  # raises: names a file that is no shard
        raise DatasetError(f"{location}: empty folder; expected {location}/<class name>/<image>.jpg, "
                           f"TFRecord shards or .tar shards")
    if location.endswith(".tar") or tfrecord.looks_like_tfrecord(location):
        return _shard_kind([location], location), [location]
    return _text_list_kind(location)


def _shard_kind(shards: list[str], where: str) -> str:
    if all(p.endswith(".tar") for p in shards):
        return "webdataset"
    not_records = [p for p in shards if not p.endswith(".tar") and not tfrecord.looks_like_tfrecord(p)]
    if not_records:
        raise DatasetError(
            f"{not_records[0]}: neither a TFRecord shard nor a .tar shard ({len(not_records)} such files in "
            f"{where}). Point at a folder that holds only shards, or at a glob such as 'train-*-of-*'")
    if any(p.endswith(".tar") for p in shards):
        raise DatasetError(f"{where}: holds both TFRecord and .tar shards; point at one kind (e.g. a glob)")
    return "tfrecord"


def _text_list_kind(path: str) -> tuple[str, list[str]]:
    """A text file: either a list of shards (one path per line) or a file list (path label)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if b"\0" in head:
        raise DatasetError(f"{path}: not a recognised dataset (not a TFRecord, .tar, folder or text list)")
    lines = [l for l in open(path).read().splitlines() if l.strip() and not l.startswith("#")]
    if not lines:
        raise DatasetError(f"{path}: empty list file")
    if _looks_like_file_list_line(lines[0]):
        return "file_list", []
    base = os.path.dirname(os.path.abspath(path))
    shards = [os.path.join(base, l.strip()) for l in lines]
    for shard in shards:
        if not os.path.isfile(shard):
            raise FileNotFoundError(f"{shard}: listed in {path} but no such file")
    return _shard_kind(shards, path), shards


def _looks_like_file_list_line(line: str) -> bool:
    parts = line.rsplit(maxsplit=1)
    return len(parts) == 2 and parts[1].lstrip("-").isdigit()


def folder_source(root: str) -> Source:
    """List ROOT/<class>/**/<image>: classes are the sorted subfolder names (empty ones included,
    so labels do not shift when a class is empty)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    files, labels = [], []
    for label, name in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, name)):
            dirnames.sort()
            for filename in sorted(filenames):
                if filename.lower().endswith(IMAGE_EXTENSIONS):
                    files.append(os.path.join(dirpath, filename))
                    labels.append(label)
    if not files:
        raise DatasetError(f"{root}: no images found; expected {root}/<class name>/<image>.jpg "
                           f"(extensions: {' '.join(IMAGE_EXTENSIONS)})")
    return Source("folder", root, files, labels=labels, classes=classes)


def file_list_source(list_path: str, missing_ok: bool = False) -> Source:
    """Parse a file list; listed files that do not exist are an error unless missing_ok."""
    base = os.path.dirname(os.path.abspath(list_path))
    files, labels, missing = [], [], []
    with open(list_path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            if not _looks_like_file_list_line(line):
                raise DatasetError(f"{list_path}:{number}: expected 'relative/path label', got {line.strip()!r}")
            relative, label = line.strip().rsplit(maxsplit=1)
            path = os.path.normpath(os.path.join(base, relative))
            if os.path.isabs(relative) or not path.startswith(base + os.sep):
                raise DatasetError(f"{list_path}:{number}: {relative!r} is outside the list's folder {base}; "
                                   f"paths must be relative to it")
            if not os.path.isfile(path):
                missing.append(f"{list_path}:{number}: {path}")
            files.append(path)
            labels.append(int(label))
    if missing and not missing_ok:
        raise FileNotFoundError(f"{len(missing)} listed files do not exist, first: {missing[0]}. "
                                f"Remove them from the list, or regenerate it with "
                                f"python scripts/verify_dataset.py DATA --write-clean-list {list_path}")
    if not files:
        raise DatasetError(f"{list_path}: empty file list")
    return Source("file_list", list_path, files, labels=labels)


def _check_nonempty_files(source: Source) -> None:
    """DALI's file reader dies on a 0-byte file (its default mmap fails), naming nothing useful."""
    empty = [p for p in source.files if os.path.getsize(p) == 0]
    if empty:
        what = "images" if source.kind in ("folder", "file_list") else "shards"
        raise DatasetError(
            f"{empty[0]}: empty (0-byte) file; {len(empty)} {what} in {source.location} are empty. "
            f"Remove them, or train from a clean list: python scripts/verify_dataset.py {source.location} "
            f"--write-clean-list clean.txt")


def _count_index(kind: str, index_path: str) -> int:
    if kind == "tfrecord":
        return len(tfrecord.read_tfrecord_index(index_path))
    with open(index_path) as f:
        return int(f.readline().split()[1])


def _read_classes_json(shard: str) -> list[str] | None:
    path = os.path.join(os.path.dirname(os.path.abspath(shard)), "classes.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("classes")


def check_tfrecord_keys(shard: str, keys: TFRecordKeys) -> None:
    """DALI returns uninitialised memory as labels when asked for keys the records lack: check
    the first record before DALI ever sees the shard."""
    for _, _, data, problem in tfrecord.walk_records(shard):
        if problem:
            raise DatasetError(f"{problem}")
        try:
            example = tfrecord.decode_example(data)
        except ValueError as e:
            raise DatasetError(f"{shard}: record 0 is not a tf.train.Example ({e})") from e
        present = ", ".join(sorted(example)) or "none"
        for key, kind in ((keys.image, bytes), (keys.label, int)):
            if key not in example:
                raise DatasetError(f"{shard}: record 0 has no feature {key!r}; keys present: {present}. "
                                   f"Pass the right key (TFRecordKeys / --image-key / --label-key)")
            values = example[key]
            if len(values) != 1 or not isinstance(values[0], kind):
                raise DatasetError(f"{shard}: feature {key!r} should hold one {kind.__name__} value, "
                                   f"holds {len(values)} value(s) of another type")
        return
