"""WebDataset tar shards: writing, scanning, and DALI's webdataset index format.

Layout (webdataset's convention): consecutive tar members that share a key form one sample,
`<key>.jpg` holding the encoded image and `<key>.cls` the label as ASCII digits. The key is
the member path up to the first dot of its basename, as in DALI's `wds2idx`.

DALI's index ("v1.2") holds a header line "v1.2 <samples>" and one line per sample listing,
for each component, "<ext> <data offset> <size> <member name>".
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass

from dali_pipes.errors import DatasetError

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


def scan_members(path: str) -> list[Member]:
    """Every regular file in the tar with its data offset. Raises DatasetError on a truncated or
    non-tar file, naming the member."""
    size = os.path.getsize(path)
    members = []
    try:
        with tarfile.open(path, "r:") as tar:
            for info in tar:
                if not info.isreg():
                    continue
                if info.offset_data + info.size > size:
                    raise DatasetError(
                        f"{path}: member {info.name!r} is truncated: needs {info.size} bytes at byte "
                        f"{info.offset_data}, the file ends at {size}. Re-create the shard.")
                members.append(Member(info.name, info.offset_data, info.size))
            end = tar.offset
    except tarfile.TarError as e:
        raise DatasetError(f"{path}: not a readable tar file ({e}). Re-create the shard.") from e
    # tarfile stops quietly at a header cut short; a whole tar ends with zero blocks.
    with open(path, "rb") as f:
        f.seek(end)
        if f.read(BLOCK) != bytes(BLOCK):
            after = f"after member {members[-1].name!r}" if members else "at its start"
            raise DatasetError(f"{path}: truncated or damaged {after} (byte {end}): no end-of-archive "
                               f"marker. Re-create the shard.")
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


def build_tar_index(path: str, label_ext: str = "cls") -> list[list[Member]]:
    """Samples of a tar shard, each checked to hold one image and one label component."""
    samples = group_samples(scan_members(path))
    if not samples:
        raise DatasetError(f"{path}: no samples in this tar (expected <key>.jpg + <key>.{label_ext} members)")
    for sample in samples:
        exts = {m.key_ext[1] for m in sample}
        key = sample[0].key_ext[0]
        if not exts & set(IMAGE_EXTS):
            raise DatasetError(f"{path}: sample {key!r} has no image member (found: {sorted(exts)}; "
                               f"expected one of {', '.join(IMAGE_EXTS)})")
        if label_ext not in exts:
            raise DatasetError(f"{path}: sample {key!r} has no .{label_ext} label member (found: {sorted(exts)})")
    return samples


def write_tar_index(samples: list[list[Member]], index_path: str) -> None:
    lines = [f"{INDEX_VERSION} {len(samples)}\n"]
    lines += [" ".join(f"{m.key_ext[1]} {m.offset} {m.size} {m.name}" for m in s) + "\n" for s in samples]
    tmp = f"{index_path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(lines)
    os.replace(tmp, index_path)


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
            samples.append([Member(parts[i + 3], int(parts[i + 1]), int(parts[i + 2]))
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
    size = os.path.getsize(path)
    members = [m for s in samples for m in s]
    if any(m.offset + m.size > size or m.offset < BLOCK for m in members):
        return False
    step = max(1, len(members) // spot_checks)
    with open(path, "rb") as f:
        for m in members[::step] + members[-1:]:
            f.seek(m.offset - BLOCK)
            try:
                info = tarfile.TarInfo.frombuf(f.read(BLOCK), tarfile.ENCODING, "surrogateescape")
            except tarfile.HeaderError:
                return False
            if info.size != m.size:  # frombuf checked the header checksum; long names live elsewhere
                return False
    return True


def read_member(f, member: Member) -> bytes:
    f.seek(member.offset)
    return f.read(member.size)


def parse_label(data: bytes, where: str) -> int:
    try:
        return int(data.decode().strip())
    except (UnicodeDecodeError, ValueError):
        raise DatasetError(f"{where}: label {data[:20]!r} is not an integer") from None
