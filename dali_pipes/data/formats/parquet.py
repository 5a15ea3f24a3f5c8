"""Parquet image datasets, and the format's entries in the format table (samples, the Python-fed DALI
source, verification, exclusion).

Layouts read: Hugging Face `datasets`' (a struct column `image` of {bytes, path}, an integer `label` column,
the ClassLabel names in the file's "huggingface" schema metadata), and any table with a binary column of
encoded images and an integer label column, named by --image-column / --label-column (SampleKeys).

DALI has no Parquet reader, so the encoded bytes reach DALI's decoder through `fn.external_source`, fed by
ParquetFeed: a callable of (epoch, iteration), so that DALI's own checkpoint holds its position and a
restored pipeline asks for the very batch it stopped at. What it reads, in which order, is reader.ReaderModel's
(slices, their rotation, padding), the read order of a shuffled epoch parquet_feed.read_order's: the row groups of the
slice in a random order per (seed, epoch), cut into windows of about `shuffle_buffer` samples whose rows are
shuffled together. Row groups are read whole (the unit Parquet compresses), a window ahead, in the process's
reading threads (shared by its feeds: none start or linger per loader).

An "index" here lists each sample as (row group, row of the file): it comes from the file's footer alone,
and is what elastic resume's subsets and the exclusion of bad samples rewrite, as for TFRecord.

Here: the format's entries (sniffing, the index, checks, verification, exclusion). Reading a file (pyarrow, local
or over ranged reads of a remote object, its layout, columns and row groups) is parquet_table.py's; the feed and
the read order, parquet_feed.py's. Arrow files (`datasets`' cache and save_to_disk, `.arrow`) are read the
same way, their record batches as row groups, memory-mapped.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dali_pipes.data.formats import parquet_images
from dali_pipes.data.formats.parquet_feed import order_model as order_model  # the table's entries: the feed's
from dali_pipes.data.formats.parquet_feed import python_reader as python_reader
from dali_pipes.data.formats.parquet_table import (
    GROUP_CACHE,
    MISSING_LABEL,
    Columns,
    class_names,
    columns_of,
    group_starts,
    is_arrow,
    layout,
    pyarrow_modules,
    read_columns,
)
from dali_pipes.data.labels import EXCLUDED_LABEL, check_label, label_bound, stored_to_label
from dali_pipes.data.samples import Sample, SampleKeys, SampleRef, SourceRecord
from dali_pipes.errors import DatasetError, LabelError
from dali_pipes.storage.files import atomic_write
from dali_pipes.storage.remote_urls import is_remote

SHARD_NAME = "a .parquet (or datasets' .arrow) file"  # in messages
SHARDED = True
SHUFFLES_LIST = False  # its order is read_order's, given to reader.ReaderModel
PYTHON_FED = True  # read by ParquetFeed through fn.external_source, not by a DALI reader
MAGIC = b"PAR1"
SNIFF_BYTES = len(MAGIC)
INDEX_VERSION = "parquet-v1"


def sniff_name(name: str) -> bool:
    """A .parquet file, or an .arrow file as `datasets` keeps a Dataset (save_to_disk, its cache files)."""
    return name.endswith((".parquet", ".arrow"))


def sniff_head(head: bytes) -> bool:
    return head[:SNIFF_BYTES] == MAGIC

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
    read = GROUP_CACHE.get(ref.path, group, columns_of(ref.path, keys))
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
def dali_reader(source: SourceRecord, reader_args: dict) -> tuple:
    raise NotImplementedError("Parquet has no DALI reader: reader.dali_reader feeds it (python_reader)")


def excluded_files(source: SourceRecord, bad_refs: list, placeholder: str) -> tuple:
    raise NotImplementedError("a sharded format: recovery.exclude rewrites its files (rewrite_without)")
