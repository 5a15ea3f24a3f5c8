"""Parquet image datasets, and the format's entries in the format table (samples, the Python-fed DALI
source, verification, exclusion).

Layouts read: Hugging Face `datasets`' (a struct column `image` of {bytes, path}, an integer `label` column,
the ClassLabel names in the file's "huggingface" schema metadata), and any table with a binary column of
encoded images and an integer label column, named by --image-column / --label-column (SampleKeys).

DALI has no Parquet reader, so the encoded bytes reach DALI's decoder through `fn.external_source`, fed by
ParquetFeed: a callable of (epoch, iteration), so that DALI's own checkpoint holds its position and a
restored pipeline asks for the very batch it stopped at. What it reads, in which order, is reader.ReaderModel's
(slices, their rotation, padding), the read order of a shuffled epoch `read_order` here: the row groups of the
slice in a random order per (seed, epoch), cut into windows of about `shuffle_buffer` samples whose rows are
shuffled together. Row groups are read whole (the unit Parquet compresses), a window ahead, in the process's
reading threads (shared by its feeds: none start or linger per loader).

An "index" here lists each sample as (row group, row of the file): it comes from the file's footer alone,
and is what elastic resume's subsets and the exclusion of bad samples rewrite, as for TFRecord.
A file is opened through `open_file`; remote files through `storage()`, the one place naming the storage layer.
Arrow files (`datasets`' cache and save_to_disk, `.arrow`) are read the same way, their record batches as row
groups, memory-mapped.
"""

from __future__ import annotations

import functools
import io
import json
import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from dali_pipes.data.formats import parquet_images
from dali_pipes.data.labels import EXCLUDED_LABEL, check_label, dali_checked_labels, label_bound, stored_to_label
from dali_pipes.data.samples import ReadPlan, Sample, SampleKeys, SampleRef, SourceRecord
from dali_pipes.errors import DatasetError, LabelError, install_hint
from dali_pipes.storage.files import atomic_write

SHARD_NAME = "a .parquet (or datasets' .arrow) file"  # in messages
SHARDED = True
SHUFFLES_LIST = False  # its order is read_order's, given to reader.ReaderModel
PYTHON_FED = True  # read by ParquetFeed through fn.external_source, not by a DALI reader
MAGIC = b"PAR1"
SNIFF_BYTES = len(MAGIC)
INDEX_VERSION = "parquet-v1"
MISSING_LABEL = -2_147_483_000  # a null label: fails its batch in the graph, as TFRecord's missing key does
GROUP_THREADS = 4  # row groups read at once, per process (pyarrow decompresses outside the GIL)
INSTALL = install_hint("parquet")  # pyarrow


def pyarrow_modules():
    """(pyarrow, pyarrow.parquet, pyarrow.compute), or ImportError naming the extra to install."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ImportError as e:
        raise ImportError(f"reading Parquet datasets needs pyarrow: {INSTALL}") from e
    return pyarrow, pyarrow.parquet, pyarrow.compute


def sniff_name(name: str) -> bool:
    """A .parquet file, or an .arrow file as `datasets` keeps a Dataset (save_to_disk, its cache files)."""
    return name.endswith((".parquet", ".arrow"))


def sniff_head(head: bytes) -> bool:
    return head[:SNIFF_BYTES] == MAGIC


# ---------------------------------------------------------------------------------------------
# Opening files: local paths, s3:// URLs through ranged reads.
# ---------------------------------------------------------------------------------------------

class RangedFile(io.RawIOBase):
    """A read-only, seekable file over an object store's ranged reads: pyarrow reads the footer, then each
    column chunk it needs, one ranged GET each (never the whole object). `where` is what read_range takes: the
    object as listed (storage.remote.ObjectInfo), so a read is one request, pinned to that version."""

    def __init__(self, where: Any, size: int, read_range: Callable[[Any, int, int], bytes]) -> None:
        self.where, self.size, self._read_range, self._at = where, size, read_range, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._at = {0: offset, 1: self._at + offset, 2: self.size + offset}[whence]
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, size: int = -1) -> bytes:
        size = self.size - self._at if size is None or size < 0 else min(size, self.size - self._at)
        data = self._read_range(self.where, self._at, size) if size > 0 else b""
        self._at += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def storage():
    """The storage layer remote files are read through (any scheme: s3://, gs://, az://, hf://, http(s)://), the one
    place this module names it. What is used of it: is_remote(path), head(url), read_range(info, start, length),
    check_unchanged(info),
    and the loader's retries (current_options, options_in_force) for the feed's reads in its own threads."""
    from dali_pipes.storage import remote
    return remote


def is_remote(path: str) -> bool:
    return storage().is_remote(path)


def open_remote(url: str) -> RangedFile:
    """A remote file as pyarrow reads it: its size and version once a process (a HEAD), then one ranged read per
    footer and column chunk, each under the retries in force now (pyarrow calls them from its own IO threads,
    which have none of ours), each failing rather than reading another version of the object."""
    layer = storage()
    options, info = layer.current_options(), _remote_info(url)

    def read_range(where: Any, start: int, length: int) -> bytes:
        with layer.options_in_force(options):
            return layer.read_range(where, start, length)
    return RangedFile(info, info.size, read_range)


@functools.lru_cache(maxsize=1024)
def _remote_info(url: str) -> Any:
    return storage().head(url)


def open_file(path: str, metadata: Any = None):
    """A pyarrow ParquetFile of a local path or a remote URL; `metadata` (a FileMetaData read before) spares
    reading the footer again. DatasetError naming the file when it is not a readable Parquet file."""
    _, pq, _ = pyarrow_modules()
    try:
        return pq.ParquetFile(open_remote(path) if is_remote(path) else path, metadata=metadata)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError; ArrowIOError an OSError
        if isinstance(e, (FileNotFoundError, ConnectionError, DatasetError)):
            raise
        _check_unchanged(path)
        raise DatasetError(path, f"not a readable Parquet file ({e})", "Re-create the file") from None


def _check_unchanged(path: str) -> None:
    """A remote file that does not read: ObjectChangedError when the store holds another version of it now (a
    store that ignores the version a read asks for, as the GCS emulator does, returned the new bytes)."""
    if is_remote(path):
        storage().check_unchanged(_remote_info(path))


def _stamp(path: str) -> tuple:
    """What tells one version of a local file from the next (a cache key); remote files: their URL."""
    if is_remote(path):
        return (path,)
    stat = os.stat(path)
    return (path, stat.st_size, stat.st_mtime_ns)


@dataclass(frozen=True)
class Layout:
    """What a file's header tells: its schema (with the "huggingface" metadata), its row groups' sizes (an Arrow
    file's record batches), and a Parquet file's footer (FileMetaData), kept to open it again unread."""
    schema: Any
    sizes: tuple[int, ...]
    footer: Any = None


@functools.lru_cache(maxsize=256)
def _layout_of(stamp: tuple) -> Layout:
    path = stamp[0]
    if is_arrow(path):
        table = arrow_table(path)
        return Layout(table.schema, tuple(batch.num_rows for batch in table.to_batches()))
    opened = open_file(path)
    footer = opened.metadata
    return Layout(opened.schema_arrow, tuple(footer.row_group(g).num_rows for g in range(footer.num_row_groups)),
                  footer)


def layout(path: str) -> Layout:
    """The header of a Parquet or Arrow file, read once per version of the file in a process."""
    return _layout_of(_stamp(path))


def group_starts(path: str) -> np.ndarray:
    """The first row of each row group of a file, and its row count last."""
    return np.cumsum([0, *layout(path).sizes])


def read_columns(path: str, group: int, columns: list[str] | None):
    """Row group `group` of a file (an Arrow file: its record batch), those columns (None: all), as a table."""
    pa, _, _ = pyarrow_modules()
    if is_arrow(path):
        table = pa.Table.from_batches([arrow_table(path).to_batches()[group]])
        return table if columns is None else table.select(columns)
    return open_file(path, layout(path).footer).read_row_group(group, columns=columns, use_threads=False)


# Arrow IPC files, as `datasets` keeps a Dataset's cache (Dataset.cache_files, save_to_disk): read the same way.

def is_arrow(path: str) -> bool:
    return path.endswith(".arrow")


def arrow_table(path: str):
    """The table of a local Arrow file (stream or file format), memory-mapped: nothing is copied."""
    return _arrow_table_of(_stamp(path))


@functools.lru_cache(maxsize=64)
def _arrow_table_of(stamp: tuple):
    pa, _, _ = pyarrow_modules()
    import pyarrow.ipc
    path = stamp[0]
    if is_remote(path):
        raise DatasetError(path, "an Arrow file in an object store (Arrow files are read from local disk only)",
                           "Write the dataset as Parquet (datasets: Dataset.to_parquet), or copy it locally")
    try:
        try:
            return pyarrow.ipc.open_stream(pa.memory_map(path)).read_all()
        except pa.ArrowInvalid:
            return pyarrow.ipc.open_file(pa.memory_map(path)).read_all()
    except pa.ArrowInvalid as e:
        raise DatasetError(path, f"not a readable Arrow file ({e})", "Re-create the file") from None


# ---------------------------------------------------------------------------------------------
# Columns: which holds the images, which the labels; the class names.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Columns:
    """Where a table keeps the encoded images (`image`, `struct`: HF's {bytes, path}) and the labels."""
    image: str
    label: str
    struct: bool


def columns_of(path: str, keys: SampleKeys) -> Columns:
    """The image and label columns of a file, checked: DatasetError naming the columns found and the flag."""
    pa, _, _ = pyarrow_modules()
    schema = layout(path).schema
    present = ", ".join(f"{f.name} ({f.type})" for f in schema)
    fix = "Name the columns: --image-column / --label-column (SampleKeys(image_column=..., label_column=...))"
    for name in (keys.image_column, keys.label_column):
        if schema.get_field_index(name) < 0:
            raise DatasetError(path, f"no column {name!r}; columns: {present}", fix)
    image, label = schema.field(keys.image_column).type, schema.field(keys.label_column).type
    struct = pa.types.is_struct(image)
    bytes_type = image.field(image.get_field_index("bytes")).type if struct and image.get_field_index("bytes") >= 0 \
        else image
    if not (pa.types.is_binary(bytes_type) or pa.types.is_large_binary(bytes_type)):
        raise DatasetError(path, f"column {keys.image_column!r} holds {image}, not encoded images (binary, or "
                           f"the Hugging Face Image struct of bytes and path); columns: {present}", fix)
    if not pa.types.is_integer(label):
        raise DatasetError(path, f"column {keys.label_column!r} holds {label}, not integer labels; columns: "
                           f"{present}", fix)
    return Columns(keys.image_column, keys.label_column, struct)


def class_names(path: str, label_column: str) -> list[str] | None:
    """The ClassLabel names `datasets` keeps in a file's schema metadata for the label column, or None."""
    meta = layout(path).schema.metadata or {}
    try:
        features = json.loads(meta[b"huggingface"])["info"]["features"]
    except (KeyError, TypeError, ValueError):
        return None
    names = features.get(label_column, {}).get("names") if isinstance(features, dict) else None
    return list(names) if isinstance(names, list) else None


# ---------------------------------------------------------------------------------------------
# Row groups, read whole.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Group:
    """One row group's encoded images (byte ranges into `data`), labels and identities."""
    data: np.ndarray     # uint8: the image bytes of every row, back to back
    starts: np.ndarray   # per row: where its bytes start in `data`
    ends: np.ndarray     # per row: where they end (== start for a null image)
    labels: np.ndarray   # int64 per row, MISSING_LABEL for a null one
    first_row: int       # of the file

    def image(self, row: int) -> np.ndarray:
        """The encoded image of `row` (a row of the file), a view into the group's buffer."""
        j = row - self.first_row
        return self.data[self.starts[j]:self.ends[j]]


def read_group(path: str, group: int, columns: Columns) -> Group:
    """Row group `group` of a file: its image and label columns only."""
    _, _, pc = pyarrow_modules()
    try:
        table = read_columns(path, group, [columns.image, columns.label])
    except (OSError, ValueError) as e:  # pyarrow: a damaged page or a truncated file
        if isinstance(e, (ConnectionError, DatasetError)):
            raise
        _check_unchanged(path)
        raise DatasetError(f"{path} (row group {group})", f"unreadable ({e})", "Re-create the file") from None
    cells = table.column(columns.image).combine_chunks()
    images = pc.struct_field(cells, "bytes") if columns.struct else cells  # honours the struct's offset and nulls
    data, starts, ends = parquet_images.with_files(cells, *_byte_ranges(images))  # paths without bytes: read
    labels = table.column(columns.label).combine_chunks()
    stored = np.asarray(labels.fill_null(MISSING_LABEL).to_numpy(zero_copy_only=False), np.int64)
    return Group(data, starts, ends, stored, int(group_starts(path)[group]))


def _byte_ranges(array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data buffer, starts, ends) of a binary array, without copying the bytes; a null is empty."""
    pa, _, _ = pyarrow_modules()
    _, offsets, data = array.buffers()[:3]
    kind = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    bounds = np.frombuffer(offsets, kind)[array.offset:array.offset + len(array) + 1].astype(np.int64) \
        if offsets is not None else np.zeros(len(array) + 1, np.int64)
    starts, ends = bounds[:-1], bounds[1:]
    valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), bool)
    buffer = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return buffer, starts, np.where(valid, ends, starts)


class _GroupCache:
    """A few row groups of this process, for sample-at-a-time reads (read_sample: converters, verification,
    the bad-sample search): neighbouring samples share their group's one read."""

    def __init__(self, size: int = 4) -> None:
        self._size, self._lock = size, threading.Lock()
        self._groups: dict[tuple, Group] = {}

    def get(self, path: str, group: int, columns: Columns) -> Group:
        key = (_stamp(path), group, columns)
        with self._lock:
            found = self._groups.pop(key, None)
        found = found or read_group(path, group, columns)
        with self._lock:
            self._groups[key] = found
            while len(self._groups) > self._size:
                self._groups.pop(next(iter(self._groups)))
        return found


_GROUPS = _GroupCache()


# ---------------------------------------------------------------------------------------------
# Index: (row group, row of the file) per sample, from the footer.
# ---------------------------------------------------------------------------------------------

def file_entries(path: str) -> list[tuple[int, int]]:
    """(row group, row) of every row of a file, in storage order."""
    starts = group_starts(path)
    return [(g, row) for g in range(len(starts) - 1) for row in range(int(starts[g]), int(starts[g + 1]))]


def build_index(shard: str, index_path: str, label_ext: str = "cls", damaged: list | None = None) -> None:
    entries = file_entries(shard)
    if not entries:
        raise DatasetError(shard, "empty Parquet file (0 rows)")
    write_index(entries, index_path)


def build_index_stream(f, where: str, index_path: str, label_ext: str = "cls") -> None:
    """The index of a remote file: from its footer alone, by ranged reads (the stream is not needed)."""
    build_index(where, index_path, label_ext)


def write_index(entries: Sequence[tuple[int, int]], index_path: str) -> None:
    lines = [f"{INDEX_VERSION} {len(entries)}\n"] + [f"{g} {row}\n" for g, row in entries]
    with atomic_write(index_path, "w") as f:
        f.writelines(lines)


def read_index(index_path: str) -> list[tuple[int, int]]:
    with open(index_path) as f:
        version, count = f.readline().split()
        if version != INDEX_VERSION:
            raise ValueError(f"unsupported index version {version}")
        entries = [(int(g), int(row)) for g, row in (line.split() for line in f if line.strip())]
    if len(entries) != int(count):
        raise ValueError("index entry count does not match its header")
    return entries


def _index_arrays(index_path: str) -> tuple[np.ndarray, np.ndarray]:
    """(row groups, rows) of an index as arrays (the feed's and the read order's bulk form)."""
    with open(index_path) as f:
        f.readline()
        table = np.loadtxt(f, dtype=np.int64, ndmin=2)
    return (table[:, 0], table[:, 1]) if table.size else (np.zeros(0, np.int64), np.zeros(0, np.int64))


def count_samples(index_path: str) -> int:
    with open(index_path) as f:
        return int(f.readline().split()[1])


def index_matches(shard: str, index_path: str, spot_checks: int = 0) -> bool:
    """True if the index lists every row of the file as its footer has them (a cheap, full check)."""
    try:
        return read_index(index_path) == file_entries(shard)
    except (OSError, ValueError):
        return False


def remote_index_matches(info: Any, index_path: str, spot_checks: int = 0) -> bool:
    """index_matches for a cached index of a remote file (`info`: its storage ObjectInfo): its footer, read by
    ranged reads."""
    return index_matches(info.url, index_path, spot_checks)


# ---------------------------------------------------------------------------------------------
# The format table's entries (see formats/__init__.py).
# ---------------------------------------------------------------------------------------------

def check_shard(shard: str) -> None:
    """A readable Parquet footer or Arrow header (DatasetError naming the file if not)."""
    layout(shard)


def source_info(ref: SampleRef) -> str:
    """The identity ParquetFeed gives each sample (DALI's readers give source_info): file#row."""
    return f"{ref.path}#{ref.offset}"


def split_source_info(info: str) -> tuple[str, int]:
    path, _, row = info.rpartition("#")
    return path, int(row)


def sample_refs(source: SourceRecord) -> list[SampleRef]:
    return [SampleRef("parquet", path, i, str(row), row, extra=(group, source.keys))
            for path, idx in zip(source.files, source.index_files or [])
            for i, (group, row) in enumerate(read_index(idx))]


def read_sample(ref: SampleRef) -> Sample:
    """One row's encoded image and label (its row group read once per process for its neighbours)."""
    group, keys = ref.extra
    read = _GROUPS.get(ref.path, group, columns_of(ref.path, keys))
    data, stored = read.image(ref.offset), int(read.labels[ref.offset - read.first_row])
    if not len(data):
        raise DatasetError(ref.origin, _cell_problem(ref.path, group, ref.offset - read.first_row, keys), NO_IMAGE_FIX)
    if stored == MISSING_LABEL:
        raise DatasetError(ref.origin, f"no label in column {keys.label_column!r} (null)")
    return Sample(ref.origin, data.tobytes(), stored_to_label(stored, ref.origin, keys.label_offset))


def check_source(source: SourceRecord, keys: SampleKeys) -> None:
    """The image and label columns of every file, the class names of the first one's metadata (when no
    classes.json names them), and the labels: every label of local files (one column, read alone), the first
    row group's of the first and last remote ones. LabelError names file#row. Then the rows with no image to
    decode, as bad samples found at open (rows_without_images)."""
    for path in source.files:
        columns_of(path, keys)
    if source.classes is None:
        source.classes = class_names(source.files[0], keys.label_column)
    num_classes, classes_from = label_bound(source)
    remote = is_remote(source.files[0])
    for path in sorted(set([source.files[0], source.files[-1]])) if remote else source.files:
        groups = [0] if remote else range(len(layout(path).sizes))
        for group in groups:
            stored = read_group_labels(path, group, keys.label_column)
            _check_labels(stored, path, int(group_starts(path)[group]), keys, num_classes, classes_from)
    rows_without_images(source, keys)


NO_IMAGE_FIX = f"{parquet_images.EMBED}, or leave such rows out with skip_bad=True (--skip-bad)"


def rows_without_images(source: SourceRecord, keys: SampleKeys) -> None:
    """Rows with no image to decode (parquet_images.problems) listed in `source.damaged` as bad samples found at
    open: excluded with skip_bad, else open_source refuses them. Only row groups whose footer counts null image
    bytes are read (an Arrow file's every record batch: memory-mapped); empty bytes elsewhere the feed finds."""
    for path in source.files:
        columns, starts = columns_of(path, keys), group_starts(path)
        for group in _groups_with_nulls(path, columns):
            cells = read_columns(path, group, [columns.image]).column(0).combine_chunks()
            for j, problem in parquet_images.problems(cells):
                row = int(starts[group]) + j
                ref = SampleRef("parquet", path, row, str(row), row, extra=(group, keys))
                source.damaged.append((ref, DatasetError(ref.origin, problem, NO_IMAGE_FIX)))


def _groups_with_nulls(path: str, columns: Columns) -> list[int]:
    """The row groups of a file whose image bytes may hold a null, by the footer's statistics (a group
    without statistics may); an Arrow file's every record batch."""
    footer = layout(path).footer
    if footer is None:
        return list(range(len(layout(path).sizes)))
    leaf = f"{columns.image}.bytes" if columns.struct else columns.image
    at = [i for i in range(footer.num_columns) if footer.schema.column(i).path == leaf]
    found = []
    for group in range(footer.num_row_groups):
        stats = footer.row_group(group).column(at[0]).statistics if at else None
        if stats is None or not stats.has_null_count or stats.null_count > 0:
            found.append(group)
    return found


def _cell_problem(path: str, group: int, j: int, keys: SampleKeys) -> str:
    """What is wrong with the image cell of row `j` of a row group that gave no bytes."""
    cells = read_columns(path, group, [columns_of(path, keys).image]).column(0).combine_chunks().slice(j, 1)
    found = parquet_images.problems(cells)
    return found[0][1] if found else f"no image bytes in column {keys.image_column!r} (its file cannot be read)"


def read_group_labels(path: str, group: int, label_column: str) -> np.ndarray:
    labels = read_columns(path, group, [label_column]).column(0)
    return np.asarray(labels.fill_null(MISSING_LABEL).to_numpy(zero_copy_only=False), np.int64)


def _check_labels(stored: np.ndarray, path: str, first_row: int, keys: SampleKeys, num_classes: int | None,
                  classes_from: str) -> None:
    labels = stored - keys.label_offset
    bad = (stored != EXCLUDED_LABEL) & ((labels < 0) | (labels >= (num_classes or np.iinfo(np.int64).max)))
    missing = stored == MISSING_LABEL
    if missing.any():
        raise LabelError(f"{path}#{first_row + int(np.argmax(missing))}", f"null label in column "
                         f"{keys.label_column!r}", "Fill the label, or drop the row")
    if bad.any():
        j = int(np.argmax(bad))
        check_label(int(labels[j]), f"{path}#{first_row + j}", offset=keys.label_offset, num_classes=num_classes,
                    classes_from=classes_from)


def verify_shard(shard: str, keys: SampleKeys, label_ext: str) -> tuple[list[SampleRef], list[DatasetError]]:
    """A readable footer and columns: every row becomes a ref for the per-sample checks; else one problem."""
    try:
        columns_of(shard, keys)
        entries = file_entries(shard)
    except DatasetError as e:
        return [], [e]
    return [SampleRef("parquet", shard, i, str(row), row, extra=(g, keys)) for i, (g, row) in enumerate(entries)], []


def rewrite_without(shard: str, index_path: str, target: str, bad: set[str], jpeg: bytes,
                    source: SourceRecord) -> None:
    """Copy `shard` to `target` with the rows numbered in `bad` replaced by a placeholder (the placeholder image,
    label EXCLUDED_LABEL, labels widened to int64), row group for row group, metadata kept; write its index."""
    columns = columns_of(shard, source.keys)
    starts = group_starts(shard)
    with atomic_write(target, "wb") as raw:
        writer = None
        for group in range(len(starts) - 1):
            rows = [int(k) - int(starts[group]) for k in bad if starts[group] <= int(k) < starts[group + 1]]
            table = _with_placeholders(read_columns(shard, group, None), rows, columns, jpeg)
            writer = writer or _writer(raw, table.schema, arrow=is_arrow(shard))
            writer.write_table(table, **({} if is_arrow(shard) else {"row_group_size": max(1, table.num_rows)}))
        if writer is not None:
            writer.close()
    write_index(file_entries(target), target + ".idx")


def _writer(raw, schema, arrow: bool):
    """A Parquet writer, or an Arrow stream writer (one record batch per write) for an Arrow file's copy."""
    pa, pq, _ = pyarrow_modules()
    import pyarrow.ipc
    return pyarrow.ipc.new_stream(raw, schema) if arrow else pq.ParquetWriter(raw, schema)


def _with_placeholders(table, rows: list[int], columns: Columns, jpeg: bytes):
    """`table` with the image and label of `rows` replaced by the placeholder's (labels as int64)."""
    pa, _, _ = pyarrow_modules()
    mask = np.zeros(table.num_rows, bool)
    mask[rows] = True
    image = table.column(columns.image).combine_chunks()
    if columns.struct and rows:
        fields = [image.field(i) for i in range(image.type.num_fields)]
        names = [image.type.field(i).name for i in range(image.type.num_fields)]
        at = names.index("bytes")
        fields[at] = _replaced(fields[at], mask, jpeg)
        image = pa.StructArray.from_arrays(fields, names=names)
    elif rows:
        image = _replaced(image, mask, jpeg)
    stored = table.column(columns.label).combine_chunks().cast(pa.int64()).fill_null(MISSING_LABEL).to_numpy()
    label = pa.array(np.where(mask, EXCLUDED_LABEL, stored), pa.int64())
    table = table.set_column(table.schema.get_field_index(columns.image), columns.image, image)
    return table.set_column(table.schema.get_field_index(columns.label), columns.label, label)


def _replaced(array, mask: np.ndarray, data: bytes):
    pa, _, _ = pyarrow_modules()
    values = array.to_pylist()
    return pa.array([data if m else v for v, m in zip(values, mask)], array.type)


# ---------------------------------------------------------------------------------------------
# The read order of a shuffled epoch, and the feed.
# ---------------------------------------------------------------------------------------------

def read_order(blocks: np.ndarray, span: Sequence[int], seed: int, epoch: int, fill: int,
               shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
    """(storage indices of `span` in read order, the start of each window in that order).

    `blocks`: the storage index where each row group starts (sorted; row groups are read whole). Shuffled:
    the row groups of the span in a random order drawn from (seed, epoch), dealt into windows of at least
    `fill` samples, each window's rows shuffled together; else storage order, windows of whole groups."""
    lo, hi = (span[0], span[-1] + 1) if len(span) else (0, 0)
    cuts = np.unique(np.concatenate([[lo, hi], np.clip(blocks, lo, hi)]))
    bounds = list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))
    rng = np.random.default_rng([seed, epoch]) if shuffle else None
    if rng is not None:
        bounds = [bounds[i] for i in rng.permutation(len(bounds))]
    pieces, windows, size = [], [0], 0
    for start, stop in bounds:
        pieces.append(np.arange(start, stop, dtype=np.int64))
        size += stop - start
        if size - windows[-1] >= max(1, fill):
            windows.append(size)
    order = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    windows = [w for w in windows if w < len(order)] or [0]
    if rng is not None:
        for start, stop in zip(windows, windows[1:] + [len(order)]):
            order[start:stop] = order[start:stop][rng.permutation(stop - start)]
    return order, np.asarray(windows, np.int64)


@dataclass(frozen=True)
class SampleTable:
    """Where each storage-order sample of a source lives: its file, row group and row, and where each row
    group begins in storage order (read_order's blocks)."""
    files: list[str]
    file: np.ndarray
    group: np.ndarray
    row: np.ndarray

    @classmethod
    def of(cls, source: SourceRecord) -> "SampleTable":
        parts = [_index_arrays(idx) for idx in source.index_files or []]
        empty = [np.zeros(0, np.int64)]
        file = np.concatenate([np.full(len(g), i, np.int64) for i, (g, _) in enumerate(parts)] or empty)
        group = np.concatenate([g for g, _ in parts] or empty)
        row = np.concatenate([r for _, r in parts] or empty)
        return cls(list(source.files), file, group, row)

    def blocks(self) -> np.ndarray:
        """The storage index at which each run of one (file, row group) starts."""
        change = (np.diff(self.file) != 0) | (np.diff(self.group) != 0)
        return np.concatenate([[0], np.flatnonzero(change) + 1]).astype(np.int64)


def order_model(source: SourceRecord, seed: int, fill: int) -> Callable[[int, Sequence[int]], Sequence[int]]:
    """reader.ReaderModel's `order` of a shuffled reader: (epoch, slice) -> the slice in read order. The
    source's index is read at the first call (a bad-sample search), not now."""
    blocks: list[np.ndarray] = []

    def order(epoch: int, span: Sequence[int]) -> Sequence[int]:
        if not blocks:
            blocks.append(SampleTable.of(source).blocks())
        return read_order(blocks[0], span, seed, epoch, fill, True)[0].tolist()
    return order


@dataclass
class _Epoch:
    order: np.ndarray    # storage indices, padded to whole batches with the last one repeated
    windows: np.ndarray  # where each window starts in `order`
    batches: int
    groups: dict[int, np.ndarray]  # window -> the row groups it reads (ids), found when first needed


class ParquetFeed:
    """The external source's callback: batch `iteration` of the pipeline's epoch `epoch_idx` as (encoded images,
    stored labels[, identities]), exactly as `plan` (a reader.ReaderModel) says this rank reads it; StopIteration
    after the epoch's last batch. A pure function of (epoch, iteration), so a DALI checkpoint resumes it. Row
    groups are read in threads, the next window's (the next epoch's first, at an epoch's last) while this one's
    batches go out; only those two windows' groups are held."""

    def __init__(self, source: SourceRecord, plan: ReadPlan, seed: int, shuffle: bool, with_ids: bool) -> None:
        self.table, self.plan, self.seed, self.shuffle, self.with_ids = SampleTable.of(source), plan, seed, shuffle, \
            with_ids
        self.columns = [columns_of(path, source.keys) for path in self.table.files]
        self._blocks = self.table.blocks()
        keys, self._gid = np.unique(self.table.file * (1 << 32) + self.table.group, return_inverse=True)
        self._groups = [(int(k >> 32), int(k & 0xFFFFFFFF)) for k in keys.tolist()]  # id -> (file, row group)
        firsts = [group_starts(self.table.files[f])[g] for f, g in self._groups]
        self._at = self.table.row - np.asarray(firsts, np.int64)[self._gid]  # row within its group
        self._epochs: dict[int, _Epoch] = {}
        self._loaded: dict[int, Future] = {}
        weakref.finalize(self, _cancel, self._loaded)  # a dropped feed's reads not yet begun are not made
        self._options = storage().current_options()  # the loader's retries, for reads in the pool's threads

    def __call__(self, info) -> tuple:
        epoch = self._plan_of(info.epoch_idx)
        if info.iteration >= epoch.batches:
            raise StopIteration
        size = self.plan.batch_size
        picks = epoch.order[info.iteration * size:(info.iteration + 1) * size]
        self._keep(info.epoch_idx, int(np.searchsorted(epoch.windows, info.iteration * size, side="right") - 1))
        gids = self._gid[picks].tolist()
        groups = {g: self._loaded[g].result() for g in set(gids)}
        at = self._at[picks].tolist()
        images = [groups[g].data[groups[g].starts[j]:groups[g].ends[j]] for g, j in zip(gids, at)]
        empty = [k for k, data in enumerate(images) if not len(data)]
        if empty:  # never given to DALI: its decoder crashes the process on empty buffers
            t, i = self.table, int(picks[empty[0]])
            raise NoImage(f"{t.files[t.file[i]]}#{t.row[i]}: no image to decode (a null or empty cell, or a "
                          f"file its path names that cannot be read)")
        labels = np.fromiter((groups[g].labels[j] for g, j in zip(gids, at)), np.int64, len(at))
        if not self.with_ids:
            return images, labels
        t = self.table
        ids = [np.frombuffer(f"{t.files[t.file[i]]}#{t.row[i]}".encode(), np.uint8) for i in picks.tolist()]
        return images, labels, ids

    def _plan_of(self, epoch: int) -> _Epoch:
        if epoch not in self._epochs:
            span = self.plan.slice(self.plan.shard_of(epoch))
            order, windows = read_order(self._blocks, span, self.seed, epoch, self.plan.shuffle_buffer, self.shuffle)
            batches = -(-self.plan.longest() // self.plan.batch_size)
            padded = np.concatenate([order, np.full(batches * self.plan.batch_size - len(order), order[-1])])
            self._epochs = {e: p for e, p in self._epochs.items() if e in (epoch - 1, epoch)}
            self._epochs[epoch] = _Epoch(padded.astype(np.int64), windows, batches, {})
        return self._epochs[epoch]

    def _window_groups(self, epoch: int, window: int) -> np.ndarray:
        plan = self._plan_of(epoch)
        if window not in plan.groups:
            bounds = [*plan.windows.tolist(), len(plan.order)]
            plan.groups[window] = np.unique(self._gid[plan.order[bounds[window]:bounds[window + 1]]])
        return plan.groups[window]

    def _keep(self, epoch: int, window: int) -> None:
        """Row groups of this window and the next (the next epoch's first) read or being read; others let go."""
        following = (epoch, window + 1) if window + 1 < len(self._plan_of(epoch).windows) else (epoch + 1, 0)
        wanted = np.concatenate([self._window_groups(epoch, window), self._window_groups(*following)]).tolist()
        for g in wanted:
            if g not in self._loaded:
                file, group = self._groups[g]
                self._loaded[g] = _group_pool().submit(_read_group_with, self._options, self.table.files[file],
                                                       group, self.columns[file])
        keep = set(wanted)
        for g in [g for g in self._loaded if g not in keep]:
            del self._loaded[g]


class NoImage(RuntimeError):
    """A row the feed met with no image to decode, raised in DALI's place: a pipeline failure, so that the
    bad-sample search names the row (and skip_bad excludes it)."""


_POOLS: dict[int, ThreadPoolExecutor] = {}  # by process id: a forked worker makes its own
_POOLS_LOCK = threading.Lock()


def _group_pool() -> ThreadPoolExecutor:
    """The process's row-group readers, shared by its feeds: threads that live with the process, as DALI's and
    pyarrow's do, so that none start or linger per loader."""
    with _POOLS_LOCK:
        if os.getpid() not in _POOLS:
            _POOLS[os.getpid()] = ThreadPoolExecutor(GROUP_THREADS, thread_name_prefix="dali_pipes-parquet")
        return _POOLS[os.getpid()]


def _cancel(loaded: dict[int, Future]) -> None:
    for future in list(loaded.values()):
        future.cancel()


def _read_group_with(options: Any, path: str, group: int, columns: Columns) -> Group:
    """read_group under the loader's retries (`options`), in a feed's thread."""
    with storage().options_in_force(options):
        return read_group(path, group, columns)


class _FeedHandle:
    """What DALI's external_source holds of a ParquetFeed: a weak reference. DALI's operator graph is a reference
    cycle (DataNodes and operator instances refer to each other, DALI 2.4) that outlives its pipeline until the
    cycle collector runs; a feed held there kept its threads and row groups as long (4 threads and ~15 MB per
    dropped loader). The pipeline owns the feed instead, and frees it with itself."""

    def __init__(self, feed: ParquetFeed) -> None:
        self._feed = weakref.ref(feed)

    def __call__(self, info) -> tuple:
        feed = self._feed()
        if feed is None:  # only a pipeline already freed can ask
            raise StopIteration
        return feed(info)


def python_reader(source: SourceRecord, plan: ReadPlan, seed: int, shuffle: bool, with_ids: bool) -> tuple:
    """(encoded images, int64 labels, identity rows or None) inside a pipeline definition, from ParquetFeed
    through fn.external_source; labels less label_offset and checked in the graph (labels.dali_checked_labels)."""
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline
    outputs = 3 if with_ids else 2
    feed = ParquetFeed(source, plan, seed, shuffle, with_ids)
    owner = Pipeline.current()  # the pipeline being defined owns its feeds (see _FeedHandle): an attribute of ours
    owner._dali_pipes_feeds = [*getattr(owner, "_dali_pipes_feeds", []), feed]
    nodes = fn.external_source(_FeedHandle(feed), num_outputs=outputs, batch=True, batch_info=True,
                               dtype=[types.DALIDataType.UINT8, types.DALIDataType.INT64,
                                      types.DALIDataType.UINT8][:outputs])
    labels = dali_checked_labels(nodes[1], source.keys.label_offset, label_bound(source)[0])
    ids = fn.pad(nodes[2], axes=(0,), fill_value=0) if with_ids else None
    return nodes[0], labels, ids


def dali_reader(source: SourceRecord, reader_args: dict) -> tuple:
    raise NotImplementedError("Parquet has no DALI reader: reader.dali_reader feeds it (python_reader)")


def excluded_files(source: SourceRecord, bad_refs: list, placeholder: str) -> tuple:
    raise NotImplementedError("a sharded format: recovery.exclude rewrites its files (rewrite_without)")
