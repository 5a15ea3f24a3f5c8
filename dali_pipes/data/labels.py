"""Label checks: a label is in [0, number of classes) after the label offset, wherever it is known.

Labels known without reading the data (image folders, file lists, a manifest, classes.json) are checked
when a source opens (source.py); labels that only the records hold are checked in the DALI graph
(`dali_checked_labels`): a batch holding a label out of range fails, and the bad-sample search reads the
culprit in Python (the formats' read_sample), which names it with `check_label`. The loader's own marker
PADDING_LABEL (-1: val padding, excluded samples) is never data: a placeholder record stores
EXCLUDED_LABEL instead, which reads as PADDING_LABEL whatever the offset, so that -1 after an offset (class 0
read with --label-offset 1) is told apart from it and refused.

The class count labels must be below (`label_bound`) is the smaller of the source's class list and the count
the run uses (`num_classes`: the model's outputs, `python -m train --num-classes`): a label the model has no
output for fails here, named, rather than as torch's "Target 9 is out of bounds" (a device-side assert on a GPU).
"""

from __future__ import annotations

from dali_pipes.data.samples import PADDING_LABEL
from dali_pipes.errors import LabelError

# The label a placeholder record stores in a shard rewritten without its bad samples (recovery.exclude).
# Ten characters as ASCII ('-' and nine digits), the most a WebDataset label parsed in the graph can hold.
EXCLUDED_LABEL = -999_999_999


def offset_fix(offset: int) -> str:
    return (f"Check --label-offset (label_offset={offset}): it is subtracted from every stored label, "
            f"1 only for 1-based records such as TensorFlow's ImageNet")


def check_label(label: int, where: str, *, offset: int = 0, num_classes: int | None = None,
                classes_from: str = "") -> None:
    """Raise LabelError naming `where` when `label` (after `offset`) is negative or >= num_classes."""
    if label < 0:
        if offset:
            raise LabelError(where, f"label {label + offset} - label offset {offset} = {label} is negative",
                             offset_fix(offset))
        raise LabelError(where, f"label {label} is negative (labels are 0 .. classes - 1; "
                         f"{PADDING_LABEL} is the loader's padding marker, never data)", "Fix the label")
    if num_classes is not None and label >= num_classes:
        shifted = f" (stored {label + offset} - label offset {offset})" if offset else ""
        raise LabelError(where, f"label {label}{shifted} is not below the {num_classes} classes of "
                         f"{classes_from or 'the dataset'}", "Fix the label or the class list")


def label_bound(source) -> tuple[int | None, str]:
    """(the count every label must be below, what sets it) of a source (a SourceRecord): the smaller of its
    class list (classes.json, a manifest, class folders) and `source.num_classes`, the count the run uses;
    (None, "") when neither is known."""
    known = []
    if source.num_classes is not None:
        known.append((source.num_classes, f"the run (num_classes={source.num_classes}, --num-classes)"))
    if source.classes:
        known.append((len(source.classes), "classes.json"))
    return min(known, key=lambda k: k[0], default=(None, ""))


def stored_to_label(stored: int, where: str, offset: int = 0) -> int:
    """A label as read from a record (read_sample): the placeholder's EXCLUDED_LABEL reads as PADDING_LABEL,
    anything else is shifted by `offset` and must not be negative (LabelError naming the offset)."""
    if stored == EXCLUDED_LABEL:
        return PADDING_LABEL
    check_label(stored - offset, where, offset=offset)
    return stored - offset


def dali_checked_labels(stored, offset: int = 0, num_classes: int | None = None):
    """In a DALI graph: int64 labels (shape [1]) after `offset` from stored int64 labels (scalars). A
    label out of range (negative after the offset, or >= num_classes) gets a shape its batch cannot
    take, so the batch fails (as a record without its label key does) and the bad-sample search names
    it; EXCLUDED_LABEL becomes PADDING_LABEL. A good sample's label is stored - offset, unchanged."""
    from nvidia.dali import fn, types
    excluded = fn.cast(stored == EXCLUDED_LABEL, dtype=types.DALIDataType.INT64)
    label = stored - offset if offset else stored
    bad = fn.cast(label < 0, dtype=types.DALIDataType.INT64)
    if num_classes is not None:
        bad = bad + fn.cast(label >= num_classes, dtype=types.DALIDataType.INT64)
    bad = fn.cast(bad * (1 - excluded), dtype=types.DALIDataType.INT32)
    out = label * (1 - excluded) + PADDING_LABEL * excluded
    return fn.reshape(out, shape=fn.stack(1 + bad))  # [1] when good; [2] or [3] fails the batch
