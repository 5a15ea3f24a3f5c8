"""A Parquet or Arrow table's image cells: encoded bytes, or, where the bytes are null, a path to a local file.

`datasets` keeps an image folder it loaded (load_dataset("imagefolder", data_dir=...)) as paths: its Image
column holds {bytes: null, path: the file's absolute path}, in its Arrow cache and in what `to_parquet` writes
from it. Such a cell is read from its file. A cell with no image to give DALI (null, no bytes and a path that
is not an existing absolute file, empty bytes) is a bad sample, named file#row; it never reaches DALI's decoder,
which crashes the process on a large batch of empty buffers (DALI 2.4).

Functions of one row group's image column (a pyarrow array: the struct of {bytes, path}, or plain binary);
pyarrow comes from the caller's array, so this module imports nothing of ours.
"""

from __future__ import annotations

import os

import numpy as np

EMBED = ("Embed the images in the file: ds.with_format('arrow').map(datasets.table.embed_table_storage, "
         "batched=True).to_parquet(PATH) (datasets), keep the images at the paths the file names")  # the recipe


def _fields(cells) -> tuple:
    """(bytes, paths or None, whether the cell itself is valid) of an image column's cells, as arrays."""
    import pyarrow.compute as pc
    if not hasattr(cells.type, "get_field_index"):  # plain binary
        return cells, None, np.asarray(cells.is_valid().to_numpy(zero_copy_only=False), bool)
    paths = pc.struct_field(cells, "path") if cells.type.get_field_index("path") >= 0 else None
    return pc.struct_field(cells, "bytes"), paths, np.asarray(cells.is_valid().to_numpy(zero_copy_only=False), bool)


def read_file(path: str | None) -> bytes:
    """The bytes of the local file a cell names; b"" where the path is not an absolute path of a readable file
    (a relative path has no folder to be relative to: the file was written elsewhere)."""
    if not path or not os.path.isabs(path):
        return b""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def with_files(cells, data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple:
    """(data, starts, ends) of a row group's images (parquet_table.byte_ranges) with every row that has no bytes
    but a path read from its file; the rows whose file cannot be read stay empty."""
    _, paths, _ = _fields(cells)
    missing = np.flatnonzero(ends == starts)
    if paths is None or not len(missing):
        return data, starts, ends
    read = {int(j): read_file(p) for j, p in zip(missing.tolist(), paths.take(missing).to_pylist())}
    pieces = [np.frombuffer(read[j], np.uint8) if j in read else data[starts[j]:ends[j]] for j in range(len(starts))]
    lengths = np.asarray([len(p) for p in pieces], np.int64)
    ends = np.cumsum(lengths)
    return np.concatenate(pieces) if pieces else data[:0], ends - lengths, ends


def problems(cells) -> list[tuple[int, str]]:
    """(row within the group, what is wrong) for each cell with no image to decode: null, empty bytes, or no
    bytes and a path that is not an existing absolute file."""
    import pyarrow.compute as pc
    data, paths, valid = _fields(cells)
    has_bytes = np.asarray(data.is_valid().to_numpy(zero_copy_only=False), bool)
    empty = has_bytes & (np.asarray(pc.binary_length(data).fill_null(0).to_numpy(zero_copy_only=False)) == 0)
    found = [(int(j), "empty image bytes") for j in np.flatnonzero(empty)]
    no_bytes = np.flatnonzero(~has_bytes)
    names = paths.take(no_bytes).to_pylist() if paths is not None else [None] * len(no_bytes)
    for j, path in zip(no_bytes.tolist(), names):
        problem = _path_problem(path, bool(valid[j]))
        if problem:
            found.append((j, problem))
    return sorted(found)


def _path_problem(path: str | None, cell: bool) -> str:
    """What keeps a cell without bytes from being read from its path ("" if nothing: one stat)."""
    if not cell:
        return "no image (a null cell)"
    if not path:
        return "no image bytes and no path"
    if not os.path.isabs(path):
        return f"no image bytes, and its path {path!r} is not absolute"
    try:
        size = os.stat(path).st_size if os.path.isfile(path) else -1
    except OSError:
        size = -1
    if size < 0:
        return f"no image bytes, and its path {path!r} does not exist"
    return f"no image bytes, and its file {path!r} is empty (0 bytes)" if size == 0 else ""
