"""Image files: an image folder (ROOT/<class name>/<image>) or a file list ("relative/path label"
lines, relative to the list's folder), and their entries in the format table.

Each image is a file of its own, so there is no index; DALI's file reader gets the explicit list of
files checked here (not file_root walking), so it reads exactly what was checked.
"""

from __future__ import annotations

import os
import warnings

from dali_pipes.data.labels import check_label
from dali_pipes.data.samples import PADDING_LABEL, Sample, SampleRef, SourceRecord, required
from dali_pipes.errors import DatasetError, LabelError

SHARDED = False
SHUFFLES_LIST = True  # DALI's file reader shuffles its list once in train (reader.ReaderModel)
PYTHON_FED = False  # read by a DALI reader (dali_reader)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".jp2")


def clean_list_fix(location: str) -> str | None:
    """The commands, as they run, that train without an image folder's or a local file list's bad images: verify
    writes a clean list where a list may sit (inside the folder, or beside the list: its paths are relative to its
    folder), and the loader reads it. None where no list can be written (remote images)."""
    if os.path.isdir(location):
        target = os.path.join(location, "clean.txt")
    elif os.path.isfile(location):
        target = os.path.splitext(location)[0] + "-clean.txt"
    else:
        return None
    return (f"dali-pipes verify {location} --write-clean-list {target} (or: python scripts/verify_dataset.py ...), "
            f"then train from {target} (--data {target})")


def list_folder(root: str, skip_bad: bool = False) -> tuple[list[str], list[int], list[str]]:
    """(files, labels, classes) of ROOT/<class>/**/<image>: classes are the sorted subfolder names
    (empty ones included, so labels do not shift when a class is empty). A class entry that is a dangling
    link, or a folder that cannot be listed, is an error naming it (a class must never vanish silently);
    with skip_bad a warning, and the class stays, with the images that could be listed."""
    entries = [e for e in os.scandir(root) if not e.name.startswith(".")]
    dangling = [e.path for e in entries if e.is_symlink() and not os.path.exists(e.path)]
    for path in dangling:
        _unreadable(path, "a dangling link (its target does not exist), taken for a class folder", skip_bad)
    classes = sorted([e.name for e in entries if e.is_dir()] + [os.path.basename(p) for p in dangling])
    files, labels = [], []
    for label, name in enumerate(classes):
        if os.path.join(root, name) in dangling:
            continue  # named above
        def refuse(error: OSError, name: str = name) -> None:  # name bound now: os.walk calls it in this turn
            _unreadable(error.filename or os.path.join(root, name), f"a class folder that cannot be listed "
                        f"({error.strerror or error})", skip_bad)
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, name), onerror=refuse):
            dirnames.sort()
            for filename in sorted(filenames):
                if filename.lower().endswith(IMAGE_EXTENSIONS):
                    files.append(os.path.join(dirpath, filename))
                    labels.append(label)
    if not files:
        raise DatasetError(root, f"no images found; expected {root}/<class name>/<image>.jpg "
                           f"(extensions: {' '.join(IMAGE_EXTENSIONS)})")
    return files, labels, classes


def _unreadable(path: str, problem: str, skip_bad: bool) -> None:
    error = DatasetError(path, problem, "Fix it (permissions, the link), or pass skip_bad=True (--skip-bad) "
                         "to go on without its images")
    if not skip_bad:
        raise error
    warnings.warn(f"{error.where}: {error.problem}; its images are left out (skip_bad)", stacklevel=2)


def check_listed(paths: list[str], labels: list[int], wheres: list[str], *, num_classes: int | None = None,
                 classes_from: str = "", allow_duplicates: bool = False, problems: list | None = None) -> None:
    """The labels of a file list (never negative, below `num_classes` when known: LabelError naming the
    file and line), and each sample once: a path listed twice is refused naming both lines, or warned of
    with allow_duplicates. With a `problems` list (verification), what is wrong goes there instead."""
    first: dict[str, str] = {}
    for path, label, where in zip(paths, labels, wheres):
        try:
            check_label(label, where, num_classes=num_classes, classes_from=classes_from)
        except LabelError as e:
            if problems is None:
                raise
            problems.append(e)
        if path not in first:
            first[path] = where
            continue
        error = DatasetError(where, f"{path} is listed twice, first at {first[path]}: it would be read twice "
                             f"per epoch", "Remove the repeat, or allow it with allow_duplicates=True "
                             "(--allow-duplicates)")
        if allow_duplicates:
            warnings.warn(f"{error.where}: {error.problem} (allowed: allow_duplicates)", stacklevel=2)
        elif problems is not None:
            problems.append(error)
        else:
            raise error


def looks_like_file_list_line(line: str) -> bool:
    parts = line.rsplit(maxsplit=1)
    return len(parts) == 2 and parts[1].lstrip("-").isdigit()


def read_file_list(list_path: str, missing_ok: bool = False, *, allow_duplicates: bool = False,
                   num_classes: int | None = None, problems: list | None = None) -> tuple[list[str], list[int]]:
    """(files, labels) of a file list; listed files that do not exist are an error unless missing_ok.
    Labels and repeats are checked (check_listed; `num_classes` from a classes.json beside the list)."""
    base = os.path.dirname(os.path.abspath(list_path))
    files, labels, wheres, missing = [], [], [], []
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
            wheres.append(where)
    if missing and not missing_ok:
        raise FileNotFoundError(f"{len(missing)} listed files do not exist, first: {missing[0]}. "
                                f"Remove them from the list, or regenerate it with "
                                f"python scripts/verify_dataset.py DATA --write-clean-list {list_path} "
                                f"(or: dali-pipes verify ...)")
    if not files:
        raise DatasetError(list_path, "empty file list")
    check_listed(files, labels, wheres, num_classes=num_classes, classes_from=os.path.join(base, "classes.json"),
                 allow_duplicates=allow_duplicates, problems=problems)
    return files, labels


# ---------------------------------------------------------------------------------------------
# The format table's entries (see formats/__init__.py).
# ---------------------------------------------------------------------------------------------

def check_source(source: SourceRecord, keys) -> None:
    """The listing found every file (empty ones: source.py). A label offset is refused: it applies to labels
    stored in shards, and ignoring it here would train on other labels than the user asked for."""
    if keys.label_offset:
        labels = ("are the positions of the sorted class folders, 0 .. classes - 1" if source.kind == "folder"
                  else "are used as the list writes them")
        raise LabelError(source.location, f"label offset {keys.label_offset} given, but an image folder's or a "
                         f"file list's labels {labels}; --label-offset applies to TFRecord and WebDataset shards",
                         "Drop --label-offset (label_offset=0)"
                         + ("" if source.kind == "folder" else ", or write the list's labels 0-based"))


def sample_refs(source: SourceRecord) -> list[SampleRef]:
    labels = required(source.labels, source, "labels")
    return [SampleRef(source.kind, path, label=label) for path, label in zip(source.files, labels)]


def source_info(ref: SampleRef) -> str:
    """What DALI's file reader reports as a sample's source_info: the file's path."""
    return ref.path


def read_sample(ref: SampleRef) -> Sample:
    from dali_pipes.storage import remote_urls, transfer
    if ref.label is None:  # nothing in an image file says its label
        raise ValueError(f"{ref.path}: an image file's SampleRef needs its label (Source.refs() gives them)")
    if remote_urls.is_remote(ref.path):
        return Sample(ref.path, transfer.read_bytes(ref.path), ref.label)
    with open(ref.path, "rb") as f:
        return Sample(ref.path, f.read(), ref.label)


def dali_reader(source: SourceRecord, reader_args: dict):
    """(encoded images, labels) from DALI's file reader over the checked list of files."""
    from nvidia.dali import fn
    return fn.readers.file(files=source.files, labels=source.labels, **reader_args)


def excluded_files(source: SourceRecord, bad_refs: list[SampleRef], placeholder: str) -> tuple[list[str], list[int]]:
    """(files, labels) with every listing of a bad file swapped for the placeholder, label PADDING_LABEL."""
    bad_paths = {ref.path for ref in bad_refs}
    files, labels = list(source.files), list(required(source.labels, source, "labels"))
    for i, path in enumerate(files):
        if path in bad_paths:
            files[i], labels[i] = placeholder, PADDING_LABEL
    return files, labels
