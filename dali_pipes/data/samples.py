"""The shared sample types: what every format, the loader and recovery pass around.

A leaf module (it imports nothing of the project's), so that the format modules, the source and
the recovery code can all import it without closing an import cycle.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, TypeVar

T = TypeVar("T")

# The label of a sample that is not a real sample: val padding (to equalise batch counts across
# ranks) and the placeholders of excluded bad samples. CrossEntropyLoss(ignore_index=-1) and
# `labels >= 0` masks ignore both.
PADDING_LABEL = -1


@dataclass(frozen=True)
class SampleKeys:
    """Where a sample's image and label are kept, in every format: TFRecord Examples' feature keys (defaults: those
    of TensorFlow's ImageNet scripts), Parquet's columns, and the label offset of the formats that store labels."""
    image: str = "image/encoded"
    label: str = "image/class/label"
    label_offset: int = 0  # subtracted from stored labels (TFRecord, WebDataset, Parquet): 1 for TF's 1-based ImageNet
    image_column: str = "image"  # Parquet: the column of encoded images (binary, or datasets' Image struct)
    label_column: str = "label"  # Parquet: the column of integer labels (datasets' ClassLabel)


KEYS_RENAMED = "dali_pipes: TFRecordKeys is now SampleKeys (the same class; the old name goes in 0.5)"


def __getattr__(name: str) -> Any:
    """TFRecordKeys, SampleKeys' name until 0.3 (it carries Parquet's columns too): for one more release."""
    if name == "TFRecordKeys":
        warnings.warn(KEYS_RENAMED, DeprecationWarning, stacklevel=2)
        return SampleKeys
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class SampleRef:
    """Where one sample lives, picklable (worker processes read samples from it).

    kind: the kind of its source, the package's one vocabulary ("folder", "file_list", "tfrecord",
    "webdataset", "parquet"; 0.2.0 wrote "file" for both image kinds, still read); path: the image file or
    the shard; index: the sample's position in its shard (0 for files); key: the record number as text
    (TFRecord), the sample key (tar) or the row of the file as text (Parquet); offset, size: the byte range of
    the record (TFRecord frame or image member), a Parquet row's number and 0; label: the label when it is
    known without reading (files), else None; extra: format details (a tar's member table; a Parquet row's
    row group and keys)."""
    kind: str
    path: str
    index: int = 0
    key: str = ""
    offset: int = 0
    size: int = 0
    label: int | None = None
    extra: tuple = ()

    @property
    def origin(self) -> str:
        """Where to look, for messages: the file, shard#record (byte offset) or tar#key."""
        if self.kind == "tfrecord":
            return f"{self.path}#{self.index} (byte {self.offset})"
        if self.kind in ("webdataset", "parquet"):
            return f"{self.path}#{self.key}"  # the tar's sample key; the Parquet file's row
        return self.path  # an image file


@dataclass(frozen=True)
class Sample:
    """One sample read in Python: `origin` says where it came from (file, or shard#record)."""
    origin: str
    data: bytes
    label: int


class SourceRecord(Protocol):
    """What a format module reads of a source (source.Source is one): typed here, in the leaf module,
    so that the formats need not import source.py, which imports them."""
    kind: str
    location: str
    files: list[str]
    labels: list[int] | None
    index_files: list[str] | None
    counts: list[int] | None
    classes: list[str] | None
    num_classes: int | None  # the class count the run uses (a model's outputs), where given: labels.label_bound
    keys: SampleKeys
    label_ext: str
    remote: list[Any] | None  # remote_urls.ObjectInfo per file, for remote (s3://, gs://, ...) sources
    damaged: list[tuple[SampleRef | None, Any]]  # (ref, errors.DatasetError): bad samples found at open


def required(value: T | None, source: SourceRecord, name: str) -> T:
    """`value`, the field `name` of `source`, which every source of its kind has (open_source sets it): a
    Source made without it is refused by name, rather than failing later on a None."""
    if value is None:
        raise ValueError(f"{source.location}: a {source.kind!r} source without {name}; make it with open_source")
    return value


class ReadPlan(Protocol):
    """What a Python-fed format (formats/parquet.py) reads of reader.ReaderModel, which tells it, per rank and
    epoch, the slice to read, its order and its batches: typed here so that the format needs no reader.py."""
    @property
    def batch_size(self) -> int: ...
    @property
    def shuffle_buffer(self) -> int: ...

    def shard_of(self, epoch: int) -> int: ...
    def slice(self, shard_id: int) -> Sequence[int]: ...
    def longest(self) -> int: ...
