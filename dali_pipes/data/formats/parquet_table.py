"""Reading a Parquet file (or an Arrow file, as `datasets` keeps a Dataset): pyarrow, opened locally or over
ranged reads of a remote object (storage/ranged_file.py); its layout from the footer; the image and label
columns, checked; whole row groups as byte ranges into one buffer, a few of them cached per process. The format's
entries (index, checks, exclusion) are parquet.py's; the feed that reads these groups for DALI is parquet_feed.py's.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from dali_pipes.data.formats import parquet_images
from dali_pipes.data.samples import SampleKeys
from dali_pipes.errors import DatasetError, install_hint
from dali_pipes.storage import ranged_file, transfer
from dali_pipes.storage.remote_urls import is_remote

MISSING_LABEL = -2_147_483_000  # a null label: fails its batch in the graph, as TFRecord's missing key does
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


# ---------------------------------------------------------------------------------------------
# Opening files: local paths, remote URLs through ranged reads (storage/ranged_file.py).
# ---------------------------------------------------------------------------------------------

def open_file(path: str, metadata: Any = None):
    """A pyarrow ParquetFile of a local path or a remote URL; `metadata` (a FileMetaData read before) spares
    reading the footer again. DatasetError naming the file when it is not a readable Parquet file."""
    _, pq, _ = pyarrow_modules()
    try:
        return pq.ParquetFile(ranged_file.open_ranged(path) if is_remote(path) else path, metadata=metadata)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError; ArrowIOError an OSError
        if isinstance(e, (FileNotFoundError, ConnectionError, DatasetError)):
            raise
        check_unchanged(path)
        raise DatasetError(path, f"not a readable Parquet file ({e})", "Re-create the file") from None


def check_unchanged(path: str) -> None:
    """A remote file that does not read: ObjectChangedError when the store holds another version of it now (a
    store that ignores the version a read asks for, as the GCS emulator does, returned the new bytes)."""
    if is_remote(path):
        transfer.check_unchanged(ranged_file.object_info(path))


def stamp(path: str) -> tuple:
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
    return _layout_of(stamp(path))


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
    return _arrow_table_of(stamp(path))


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
        check_unchanged(path)
        raise DatasetError(f"{path} (row group {group})", f"unreadable ({e})", "Re-create the file") from None
    cells = table.column(columns.image).combine_chunks()
    images = pc.struct_field(cells, "bytes") if columns.struct else cells  # honours the struct's offset and nulls
    data, starts, ends = parquet_images.with_files(cells, *byte_ranges(images))  # paths without bytes: read
    labels = table.column(columns.label).combine_chunks()
    stored = np.asarray(labels.fill_null(MISSING_LABEL).to_numpy(zero_copy_only=False), np.int64)
    return Group(data, starts, ends, stored, int(group_starts(path)[group]))


def byte_ranges(array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
        key = (stamp(path), group, columns)
        with self._lock:
            found = self._groups.pop(key, None)
        found = found or read_group(path, group, columns)
        with self._lock:
            self._groups[key] = found
            while len(self._groups) > self._size:
                self._groups.pop(next(iter(self._groups)))
        return found


GROUP_CACHE = _GroupCache()
