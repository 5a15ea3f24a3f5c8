"""Image files: an image folder (ROOT/<class name>/<image>) or a file list ("relative/path label"
lines, relative to the list's folder), and their entries in the format table.

Each image is a file of its own, so there is no index; DALI's file reader gets the explicit list of
files checked here (not file_root walking), so it reads exactly what was checked.
"""

from __future__ import annotations

import os

from dali_pipes.errors import DatasetError
from dali_pipes.samples import PADDING_LABEL, Sample, SampleRef, SourceRecord

SHARDED = False
SHUFFLES_LIST = True  # DALI's file reader shuffles its list once in train (reader.ReaderModel)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".jp2")


def list_folder(root: str) -> tuple[list[str], list[int], list[str]]:
    """(files, labels, classes) of ROOT/<class>/**/<image>: classes are the sorted subfolder names
    (empty ones included, so labels do not shift when a class is empty)."""
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
        raise DatasetError(root, f"no images found; expected {root}/<class name>/<image>.jpg "
                           f"(extensions: {' '.join(IMAGE_EXTENSIONS)})")
    return files, labels, classes


def looks_like_file_list_line(line: str) -> bool:
    parts = line.rsplit(maxsplit=1)
    return len(parts) == 2 and parts[1].lstrip("-").isdigit()


def read_file_list(list_path: str, missing_ok: bool = False) -> tuple[list[str], list[int]]:
    """(files, labels) of a file list; listed files that do not exist are an error unless missing_ok."""
    base = os.path.dirname(os.path.abspath(list_path))
    files, labels, missing = [], [], []
    with open(list_path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            where = f"{list_path}:{number}"
            if not looks_like_file_list_line(line):
                raise DatasetError(where, f"expected 'relative/path label', got {line.strip()!r}")
            relative, label = line.strip().rsplit(maxsplit=1)
            path = os.path.normpath(os.path.join(base, relative))
            if os.path.isabs(relative) or not path.startswith(base + os.sep):
                raise DatasetError(where, f"{relative!r} is outside the list's folder {base}",
                                   "Paths must be relative to it")
            if not os.path.isfile(path):
                missing.append(f"{where}: {path}")
            files.append(path)
            labels.append(int(label))
    if missing and not missing_ok:
        raise FileNotFoundError(f"{len(missing)} listed files do not exist, first: {missing[0]}. "
                                f"Remove them from the list, or regenerate it with "
                                f"python scripts/verify_dataset.py DATA --write-clean-list {list_path} (or: dali-pipes verify ...)")
    if not files:
        raise DatasetError(list_path, "empty file list")
    return files, labels


# ---------------------------------------------------------------------------------------------
# The format table's entries (see formats/__init__.py).
# ---------------------------------------------------------------------------------------------

def check_source(source: SourceRecord, keys) -> None:
    """Nothing to check before DALI: the listing found every file (empty ones: source.py)."""


def sample_refs(source: SourceRecord) -> list[SampleRef]:
    return [SampleRef(source.kind, path, label=label) for path, label in zip(source.files, source.labels)]


def source_info(ref: SampleRef) -> str:
    """What DALI's file reader reports as a sample's source_info: the file's path."""
    return ref.path


def read_sample(ref: SampleRef) -> Sample:
    from dali_pipes import object_store
    if object_store.is_remote(ref.path):
        return Sample(ref.path, object_store.read_bytes(ref.path), ref.label)
    with open(ref.path, "rb") as f:
        return Sample(ref.path, f.read(), ref.label)


def dali_reader(source: SourceRecord, reader_args: dict):
    """(encoded images, labels) from DALI's file reader over the checked list of files."""
    from nvidia.dali import fn
    return fn.readers.file(files=source.files, labels=source.labels, **reader_args)


def excluded_files(source: SourceRecord, bad_refs: list[SampleRef], placeholder: str) -> tuple[list[str], list[int]]:
    """(files, labels) with every listing of a bad file swapped for the placeholder, label PADDING_LABEL."""
    bad_paths = {ref.path for ref in bad_refs}
    files, labels = list(source.files), list(source.labels)
    for i, path in enumerate(files):
        if path in bad_paths:
            files[i], labels[i] = placeholder, PADDING_LABEL
    return files, labels
