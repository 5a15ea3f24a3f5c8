"""WebDataset tar shards: writing, scanning, DALI's webdataset index format, and the format's entries
in the format table (samples, the DALI reader with in-graph label parsing, verification, exclusion).

Layout (webdataset's convention): consecutive tar members that share a key form one sample,
`<key>.jpg` holding the encoded image and `<key>.cls` the label as ASCII digits. The key is
the member path up to the first dot of its basename, as in DALI's `wds2idx`.

DALI's index ("v1.2") holds a header line "v1.2 <samples>" and one line per sample listing,
for each component, "<ext> <data offset> <size> <member name>". DALI splits the lines at whitespace
(webdataset_loader.cc reads them with `>>`, DALI 2.4), so a member name that holds a space (legal in tar and
in webdataset) is written percent-escaped ("a b.jpg" as "a%20b.jpg", "%" as "%25"): DALI finds members by
offset and only reports the name (source_info), so such members are read as any other.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from dali_pipes.data.labels import EXCLUDED_LABEL, check_label, dali_checked_labels, label_bound, stored_to_label
from dali_pipes.data.samples import Sample, SampleKeys, SampleRef, SourceRecord, required
from dali_pipes.errors import DatasetError
from dali_pipes.storage.files import atomic_write
from dali_pipes.storage.remote_urls import ObjectInfo

SHARD_NAME = "a .tar shard"  # in messages
SHUFFLES_LIST = False  # its reader keeps storage order; only the shuffle buffer mixes (reader.ReaderModel)
PYTHON_FED = False  # read by a DALI reader (dali_reader)
SNIFF_BYTES = 0


def sniff_name(name: str) -> bool:
    """A WebDataset shard is a .tar file (DALI's webdataset reader reads uncompressed tars only)."""
    return name.endswith(".tar")


def sniff_head(head: bytes) -> bool:
    return False


def check_source(source: SourceRecord, keys: SampleKeys) -> None:
    """Indexing found every sample's image and label members. The label of the first sample of the first
    and last shards, after the label offset, is checked here (one ranged read each, local or s3://), as
    TFRecord's first record is: a --label-offset 1 on 0-based data is refused at open when one shows it."""
    num_classes, classes_from = label_bound(source)
    index_files = required(source.index_files, source, "index_files")
    for i in sorted({0, len(source.files) - 1}):
        samples = read_tar_index(index_files[i])
        ref = _ref(source.files[i], 0, samples[0], source.label_ext, keys.label_offset) if samples else None
        if ref is not None:
            (text,) = _read_members(ref, ref.extra[1:2])  # the .cls member alone
            check_label(stored_label(text, ref.origin) - keys.label_offset, ref.origin, offset=keys.label_offset,
                        num_classes=num_classes, classes_from=classes_from)


INDEX_VERSION = "v1.2"
BLOCK = 512
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff")


@dataclass(frozen=True)
class Member:
    name: str
    offset: int  # of the data, not of the header
    size: int

    @property
    def key_ext(self) -> tuple[str, str]:
        dot = self.name.find(".", self.name.rfind("/") + 1)
        return (self.name, "") if dot < 0 else (self.name[:dot], self.name[dot + 1:])


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add one file with fixed metadata, so the same inputs give the same tar bytes."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def scan_members(path: str, damaged: list[DatasetError] | None = None) -> list[Member]:
    """Every regular file in the tar with its data offset. Raises DatasetError on a truncated or
    non-tar file, naming the member; with a `damaged` list, a truncated member or a missing end of
    the archive is recorded there and the members before it are returned."""
    size = os.path.getsize(path)
    members: list[Member] = []
    try:
        with tarfile.open(path, "r:") as tar:
            for info in tar:
                if not info.isreg():
                    continue
                if info.offset_data + info.size > size:
                    error = DatasetError(path, f"member {info.name!r} is truncated: needs {info.size} bytes at byte "
                                         f"{info.offset_data}, the file ends at {size}", "Re-create the shard")
                    if damaged is None or not members:
                        raise error
                    damaged.append(DatasetError(f"{path}#{Member(info.name, 0, 0).key_ext[0]}", error.problem))
                    return members
                members.append(Member(info.name, info.offset_data, info.size))
            end = tar.offset
    except tarfile.TarError as e:
        raise DatasetError(path, f"not a readable tar file ({e})", "Re-create the shard") from e
    # tarfile stops quietly at a header cut short; a whole tar ends with zero blocks.
    with open(path, "rb") as f:
        f.seek(end)
        if f.read(BLOCK) != bytes(BLOCK):
            after = f"after member {members[-1].name!r}" if members else "at its start"
            error = DatasetError(path, f"truncated or damaged {after} (byte {end}): no end-of-archive marker",
                                 "Re-create the shard")
            if damaged is None or not members:
                raise error
            damaged.append(error)
    return members


def group_samples(members: list[Member]) -> list[list[Member]]:
    """Consecutive members with the same key form one sample (webdataset's rule)."""
    samples: list[list[Member]] = []
    last_key = None
    for m in members:
        key, ext = m.key_ext
        if not ext or key.endswith("/"):
            continue
        if key != last_key:
            samples.append([])
            last_key = key
        samples[-1].append(m)
    return samples


def build_tar_index(path: str, label_ext: str = "cls", damaged: list[DatasetError] | None = None) -> list[list[Member]]:
    """Samples of a tar shard, each checked to hold one image and one label component. With a
    `damaged` list, incomplete samples and a truncated end are recorded there and left out."""
    samples = group_samples(scan_members(path, damaged))
    complete = []
    for sample in samples:
        exts = {m.key_ext[1] for m in sample}
        key = sample[0].key_ext[0]
        if not exts & set(IMAGE_EXTS):
            problem = (f"sample {key!r} has no image member (found: {sorted(exts)}; "
                       f"expected one of {', '.join(IMAGE_EXTS)})")
        elif label_ext not in exts:
            problem = f"sample {key!r} has no .{label_ext} label member (found: {sorted(exts)})"
        else:
            complete.append(sample)
            continue
        if damaged is None:
            raise DatasetError(f"{path}#{key}", problem)
        damaged.append(DatasetError(f"{path}#{key}", problem))
    if not complete:
        raise DatasetError(path, f"no samples in this tar (expected <key>.jpg + <key>.{label_ext} members)")
    return complete


def build_index_stream(f, where: str, index_path: str, label_ext: str = "cls") -> None:
    """The index of a remote tar shard, from one sequential read of it (tarfile's stream mode)."""
    members: list[Member] = []
    try:
        with tarfile.open(fileobj=f, mode="r|") as tar:
            for info in tar:
                if info.isreg():
                    members.append(Member(info.name, info.offset_data, info.size))
    except tarfile.TarError as e:
        raise DatasetError(where, f"not a readable tar file ({e})", "Re-create the shard") from e
    for _ in iter(lambda: f.read(1 << 20), b""):  # to the end: the size check of the download runs there
        pass
    samples = []
    for sample in group_samples(members):
        exts = {m.key_ext[1] for m in sample}
        if not exts & set(IMAGE_EXTS) or label_ext not in exts:
            raise DatasetError(f"{where}#{sample[0].key_ext[0]}", f"incomplete sample: members {sorted(exts)} "
                               f"(expected an image and .{label_ext})")
        samples.append(sample)
    if not samples:
        raise DatasetError(where, f"no samples in this tar (expected <key>.jpg + <key>.{label_ext} members)")
    write_tar_index(samples, index_path)


_ESCAPED = re.compile(r"[\t\n\x0b\x0c\r %]")  # what C++'s >> splits at (ASCII whitespace), and the escape itself
_UNESCAPED = re.compile(r"%(09|0A|0B|0C|0D|20|25)")


def index_token(text: str) -> str:
    """`text` (a member name, an extension) as one token of an index line: whitespace and "%" escaped."""
    return _ESCAPED.sub(lambda m: f"%{ord(m.group()):02X}", text)


def from_index_token(token: str) -> str:
    return _UNESCAPED.sub(lambda m: chr(int(m.group(1), 16)), token)


def write_tar_index(samples: list[list[Member]], index_path: str) -> None:
    lines = [f"{INDEX_VERSION} {len(samples)}\n"]
    lines += [" ".join(f"{index_token(m.key_ext[1])} {m.offset} {m.size} {index_token(m.name)}" for m in s) + "\n"
              for s in samples]
    with atomic_write(index_path, "w") as f:
        f.writelines(lines)


def read_tar_index(index_path: str) -> list[list[Member]]:
    with open(index_path) as f:
        version, count = f.readline().split()
        if version != INDEX_VERSION:
            raise ValueError(f"unsupported index version {version}")
        samples = []
        for line in f:
            parts = line.split()
            if len(parts) % 4:
                raise ValueError("malformed index line")
            samples.append([Member(from_index_token(parts[i + 3]), int(parts[i + 1]), int(parts[i + 2]))
                            for i in range(0, len(parts), 4)])
    if len(samples) != int(count):
        raise ValueError("index sample count does not match its header")
    return samples


def tar_index_matches(path: str, index_path: str, spot_checks: int = 16) -> bool:
    """True if the index describes this tar: every component inside the file, and the tar header
    in front of the checked components is valid and gives that size. An index older than
    its shard is checked against a full rescan."""
    try:
        samples = read_tar_index(index_path)
    except (OSError, ValueError):
        return False
    if not samples:
        return False
    if os.path.getmtime(index_path) < os.path.getmtime(path):
        try:
            return samples == group_samples(scan_members(path))
        except DatasetError:
            return False
    with open(path, "rb") as f:
        def block_before(offset: int) -> bytes:
            f.seek(offset - BLOCK)
            return f.read(BLOCK)
        return members_fit(samples, os.path.getsize(path), block_before, spot_checks)


def remote_index_matches(info: ObjectInfo, index_path: str, spot_checks: int = 16) -> bool:
    """tar_index_matches for a cached index of a remote tar: the same checks against the listed object (its
    size; the tar headers of the checked members by ranged reads, pinned to the listed version)."""
    try:
        samples = read_tar_index(index_path)
    except (OSError, ValueError):
        return False
    from dali_pipes.storage.transfer import read_range
    return bool(samples) and members_fit(samples, info.size, lambda at: read_range(info, at - BLOCK, BLOCK),
                                         spot_checks)


def members_fit(samples: list[list[Member]], size: int, block_before, spot_checks: int) -> bool:
    """Every member inside the tar's `size` bytes, and a valid tar header giving the member's size in front of
    `spot_checks` evenly spread members and the last. `block_before(offset)` reads the BLOCK before offset."""
    members = [m for s in samples for m in s]
    if any(m.offset + m.size > size or m.offset < BLOCK or m.size < 0 for m in members):
        return False
    for m in members[::max(1, len(members) // max(1, spot_checks))] + members[-1:]:
        try:
            info = tarfile.TarInfo.frombuf(block_before(m.offset), tarfile.ENCODING, "surrogateescape")
        except tarfile.HeaderError:
            return False
        if info.size != m.size:  # frombuf checked the header checksum; long names live elsewhere
            return False
    return True


def read_member(f, member: Member) -> bytes:
    f.seek(member.offset)
    return f.read(member.size)


def parse_label(data: bytes, where: str, offset: int = 0) -> int:
    """The label a .cls member holds, less `offset` (--label-offset): never negative (LabelError naming the
    offset), a placeholder's reads as PADDING_LABEL."""
    return stored_to_label(stored_label(data, where), where, offset)


def stored_label(data: bytes, where: str) -> int:
    """The integer a .cls member holds, as stored (DatasetError if it is none)."""
    try:
        return int(data.decode().strip())
    except (UnicodeDecodeError, ValueError):
        raise DatasetError(where, f"label {data[:20]!r} is not an integer") from None


# ---------------------------------------------------------------------------------------------
# The format table's entries (see formats/__init__.py).
# ---------------------------------------------------------------------------------------------

SHARDED = True
LABEL_DIGITS = 10  # .cls bytes read by the DALI graph; powers of 10 up to 10**10 are exact in lookup_table's float32
index_matches = tar_index_matches


def build_index(shard: str, index_path: str, label_ext: str = "cls", damaged: list | None = None) -> None:
    write_tar_index(build_tar_index(shard, label_ext, damaged), index_path)


def count_samples(index_path: str) -> int:
    with open(index_path) as f:
        return int(f.readline().split()[1])


read_index, write_index = read_tar_index, write_tar_index  # one list of members per sample


def source_info(ref: SampleRef) -> str:
    """What DALI 2.4's webdataset reader reports as a sample's source_info: tar:offset:member (as the index
    names it: escaped)."""
    return f"{ref.path}:{ref.offset}:{index_token(ref.extra[0].name)}"


def split_source_info(info: str) -> tuple[str, int]:
    """(shard path, byte offset of the image member) from source_info; ValueError if another form."""
    path, offset, _ = info.rsplit(":", 2)
    return path, int(offset)


def check_shard(shard: str) -> None:
    """Nothing to refuse before indexing: scanning the tar checks it."""


def _ref(shard: str, position: int, members: list[Member], label_ext: str, label_offset: int) -> SampleRef | None:
    by_ext = {m.key_ext[1]: m for m in members}
    image = next((by_ext[e] for e in IMAGE_EXTS if e in by_ext), None)
    if image is None or label_ext not in by_ext:
        return None
    return SampleRef("webdataset", shard, position, members[0].key_ext[0], image.offset, image.size,
                     extra=(image, by_ext[label_ext], label_offset))


def sample_refs(source: SourceRecord) -> list[SampleRef]:
    refs = []
    for shard, idx in zip(source.files, required(source.index_files, source, "index_files")):
        for i, members in enumerate(read_tar_index(idx)):
            ref = _ref(shard, i, members, source.label_ext, source.keys.label_offset)
            if ref is None:  # an index is built for one label extension and read for another
                raise DatasetError(f"{shard}#{members[0].key_ext[0]}", f"no image or no .{source.label_ext} member "
                                   f"(members: {', '.join(m.key_ext[1] for m in members)})",
                                   "Pass the label extension the shards hold (label_ext, --label-ext)")
            refs.append(ref)
    return refs


def _read_members(ref: SampleRef, members: tuple[Member, ...]) -> list[bytes]:
    from dali_pipes.storage import remote_urls, transfer
    if remote_urls.is_remote(ref.path):
        return [transfer.read_range(ref.path, m.offset, m.size) for m in members]
    with open(ref.path, "rb") as f:
        return [read_member(f, m) for m in members]


def read_sample(ref: SampleRef) -> Sample:
    image, label, offset = ref.extra
    data, text = _read_members(ref, (image, label))
    return Sample(ref.origin, data, parse_label(text, ref.origin, offset))


def dali_reader(source: SourceRecord, reader_args: dict):
    """(encoded images, int64 labels) from DALI's webdataset reader; labels parsed in the graph."""
    from nvidia.dali import fn
    out: Any = fn.readers.webdataset(  # a node per ext; DALI's stub (2.4) types it as one node or a sequence
        paths=source.files, index_paths=source.index_files, ext=[";".join(IMAGE_EXTS), source.label_ext],
        missing_component_behavior="error", **reader_args)
    images, cls = out
    # less --label-offset; out of range (negative after it, or >= the classes): the batch fails
    return images, dali_checked_labels(ascii_to_int64(cls), source.keys.label_offset, label_bound(source)[0])


def ascii_to_int64(cls):
    """Parse ASCII digits ("42", "42\\n", "-1") into int64 inside the DALI graph, without Python.

    The bytes are padded (then cut) to LABEL_DIGITS, each digit is weighted as if the number
    filled the whole width, and the sum is divided by 10 ** (unused width). An optional leading
    '-' negates (placeholders for excluded samples carry labels.EXCLUDED_LABEL); trailing whitespace is ignored."""
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


def verify_shard(shard: str, keys: SampleKeys, label_ext: str) -> tuple[list[SampleRef], list[DatasetError]]:
    """Scan the members: complete samples become refs for the per-sample checks, incomplete ones
    problems. A tar that cannot be scanned is one problem."""
    try:
        samples = group_samples(scan_members(shard))
    except DatasetError as e:
        return [], [e]
    refs, problems = [], []
    for i, members in enumerate(samples):
        ref = _ref(shard, i, members, label_ext, keys.label_offset)
        if ref is None:
            key = members[0].key_ext[0]
            problems.append(DatasetError(f"{shard}#{key}", f"incomplete sample: members "
                                         f"{sorted(m.key_ext[1] for m in members)}"))
        else:
            refs.append(ref)
    return refs, problems


def rewrite_without(shard: str, index_path: str, target: str, bad: set[str], jpeg: bytes, source: SourceRecord) -> None:
    """Copy `shard` to `target` with the samples keyed in `bad` replaced by a placeholder (the
    placeholder image, label EXCLUDED_LABEL), and write the copy's index."""
    from dali_pipes.storage.transfer import local_copy
    # atomic_write: the temp copy is removed when reading the shard or writing the copy fails
    with local_copy(shard) as local, open(local, "rb") as f, atomic_write(target, "wb") as raw, \
            tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as out:
        for members in read_tar_index(index_path):
            key = members[0].key_ext[0]
            for m in members:
                if key not in bad:
                    data = read_member(f, m)
                elif m.key_ext[1] == source.label_ext:
                    data = str(EXCLUDED_LABEL).encode()  # reads as PADDING_LABEL
                else:
                    data = jpeg
                add_member(out, m.name, data)
    write_tar_index(build_tar_index(target, source.label_ext), target + ".idx")
