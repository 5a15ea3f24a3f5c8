"""Pack the wheels a lent GPU machine lacks into as few parts as its calls can carry (issue 33).

A lent machine takes at most 64 MiB a call, the working tree included, and reaches no package index. So:

  * the pinned wheels (scripts/gpu/wheels.txt) are downloaded here for Python 3.12 on manylinux x86_64;
  * the `early` group (what the data generation of call 1 needs) goes, uncompressed, into early.tar;
  * the rest, each wheel rewritten uncompressed (`stored`), is one tar, compressed with xz, split into parts
    of `part_bytes`: 64 MiB less the working tree (measured: the tracked files and the untracked ones git does
    not ignore), less early.tar and the manifest, less a margin;
  * manifest.json names each part with its size and sha256, the archive's sha256, and each wheel with its
    version, so that the device script checks every byte and env.json can say which DALI and codec ran.

    python scripts/gpu/pack.py [--repo DIR] [--out DIR]      # default: ./.device-wheels (git-ignored)

`pack_files` packs any files the same way: the dry run's fake part set is a tiny tarball packed by it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

MiB = 2**20
CALL_LIMIT = 64 * MiB     # what one device call carries, the working tree included
MARGIN = 1 * MiB          # file-system slack, and files that change between packing and the call
PINS = Path(__file__).resolve().parent.parent / "scripts" / "gpu" / "wheels.txt"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any")
MANIFEST, EARLY = "manifest.json", "early.tar"


@dataclass(frozen=True)
class Part:
    """One piece of the compressed archive, as the manifest lists it."""
    name: str
    bytes: int
    sha256: str


def read_pins(path: Path = PINS) -> dict[str, list[str]]:
    """{group: ["name==version", ...]} of wheels.txt ("[group]" lines start a group, "#" starts a comment)."""
    groups: dict[str, list[str]] = {}
    group = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("["):
            group = line.strip("[]")
            groups[group] = []
        elif group is None or "==" not in line:
            raise ValueError(f"{path}:{number}: expected '[group]' or 'name==version' (pinned), got {raw!r}")
        else:
            groups[group].append(line)
    return groups


def download(pins: Sequence[str], folder: Path, python: str = "3.12") -> list[Path]:
    """`pins` as wheels for `python` on manylinux x86_64 into `folder` (each pin alone: --no-deps)."""
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python, "--implementation", "cp", *platforms, "-d", str(folder), *pins],
                   check=True)
    wheels = {wheel_name(w): w for w in folder.glob("*.whl")}
    missing = [p for p in pins if _normal(p.split("==")[0]) not in wheels]
    if missing:
        raise FileNotFoundError(f"{folder}: pip downloaded no wheel for {', '.join(missing)}")
    return [wheels[_normal(p.split("==")[0])] for p in pins]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> str:
    """A wheel file's project name, normalised (PEP 503)."""
    return _normal(path.name.split("-")[0])


def wheel_version(path: Path) -> str:
    return path.name.split("-")[1]


def tree_bytes(repo: Path) -> int:
    """Bytes of what a device call sends of `repo`: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.split(b"\0")
    paths = {repo / os.fsdecode(p) for p in listed if p}
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def part_bytes_for(repo: Path, early_bytes: int, limit: int = CALL_LIMIT) -> int:
    """The largest part a call can carry beside the working tree, early.tar and the manifest."""
    size = limit - tree_bytes(repo) - early_bytes - 64 * 1024 - MARGIN
    if size < MiB:
        raise ValueError(f"{repo}: the working tree leaves {size} bytes of the {limit >> 20} MiB a call carries; "
                         f"commit or ignore less (git ls-files --others --exclude-standard lists what travels)")
    return size


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            digest.update(block)
    return digest.hexdigest()


def stored(wheel: Path, folder: Path) -> Path:
    """`wheel` rewritten without compression (ZIP_STORED) under `folder`, same name and members: still a wheel
    (its RECORD hashes the members, not the zip), and xz compresses its shared libraries 2-4 times better than
    deflate did, where xz over the deflated wheel gains about 5%."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for member in src.infolist():
            data = src.read(member)  # read as the source stores it, before the copy's method changes
            copy = zipfile.ZipInfo(member.filename, member.date_time)
            copy.external_attr, copy.compress_type = member.external_attr, zipfile.ZIP_STORED
            dst.writestr(copy, data)
    return out


def compress(files: Sequence[Path], archive: Path, preset: int = 9) -> None:
    """`files` (by their names alone) as one xz-compressed tar at `archive`; `xz -T0` where it is installed
    (all cores), else Python's lzma (one core)."""
    with tarfile.open(archive.with_suffix(""), "w") as tar:  # archive.tar, then compressed whole
        for f in files:
            tar.add(f, arcname=f.name)
    plain = archive.with_suffix("")
    if shutil.which("xz"):
        subprocess.run(["xz", f"-{preset}", "-T0", "-f", "-k", str(plain)], check=True)
        plain.with_name(plain.name + ".xz").replace(archive)
    else:
        with open(plain, "rb") as src, lzma.open(archive, "wb", preset=preset) as dst:
            shutil.copyfileobj(src, dst, MiB)
    plain.unlink()


def split(archive: Path, out: Path, part_bytes: int) -> list[Part]:
    """`archive` cut into out/part-00, part-01, ... of `part_bytes` each (the last smaller)."""
    parts = []
    with open(archive, "rb") as src:
        while block := src.read(part_bytes):
            path = out / f"part-{len(parts):02d}"
            path.write_bytes(block)
            parts.append(Part(path.name, len(block), hashlib.sha256(block).hexdigest()))
    return parts


def pack_files(files: Sequence[Path], out: Path, part_bytes: int, early: Sequence[Path] = (),
               versions: dict | None = None, preset: int = 9) -> dict:
    """Pack `files` into out/part-NN (xz) and `early` into out/early.tar; write and return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("part-*"), out / EARLY, out / MANIFEST]:
        old.unlink(missing_ok=True)
    archive = out / "wheels.tar.xz"
    plain = [stored(f, out / "stored") if f.suffix == ".whl" else f for f in files]
    compress(plain, archive, preset)
    # sha256: the file as shipped (a wheel rewritten uncompressed); index_sha256: as the index served it
    wheels = {f.name: {"name": wheel_name(f), "version": wheel_version(f), "sha256": sha256(shipped),
                       "index_sha256": sha256(f)}
              for f, shipped in [*zip(early, early), *zip(files, plain)] if f.suffix == ".whl"}
    stored_bytes = sum(f.stat().st_size for f in plain)
    shutil.rmtree(out / "stored", ignore_errors=True)
    parts = split(archive, out, part_bytes)
    manifest = {"archive_bytes": archive.stat().st_size, "archive_sha256": sha256(archive),
                "files_bytes": sum(f.stat().st_size for f in files),
                "stored_bytes": stored_bytes,
                "part_bytes": part_bytes, "parts": [vars(p) for p in parts], "early": [f.name for f in early],
                "wheels": wheels, "versions": versions or {}}
    archive.unlink()
    with tarfile.open(out / EARLY, "w") as tar:
        for f in early:
            tar.add(f, arcname=f.name)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def key_versions(wheels: Sequence[Path]) -> dict[str, str]:
    """The versions env.json and the docs name: DALI's build and the codec libraries beside it."""
    keys = ("nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-nvimgcodec-cu13", "nvidia-libnvcomp-cu13",
            "nvidia-nvjpeg", "nvidia-nvjpeg2k-cu13", "nvidia-nvtiff-cu13")
    found = {wheel_name(w): wheel_version(w) for w in wheels}
    return {k: found[k] for k in keys if k in found}


def pack(repo: Path, out: Path, groups: dict[str, list[str]], cache: Path) -> dict:
    """Download every pinned group, then pack: early alone, the rest in parts that fit beside `repo`."""
    early = download(groups.get("early", []), cache)
    rest = [w for g, pins in groups.items() if g != "early" for w in download(pins, cache)]
    early_bytes = sum(f.stat().st_size for f in early) + 10 * 1024  # tar headers
    manifest = pack_files(rest, out, part_bytes_for(repo, early_bytes), early, key_versions(rest))
    manifest["groups"] = groups
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/gpu/pack.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", default=".", help="the checkout whose working tree travels with each call")
    parser.add_argument("--out", default=None, help="where the parts go (default: REPO/.device-wheels, git-ignored)")
    parser.add_argument("--pins", default=str(PINS), help="pinned wheels, by group (default: %(default)s)")
    parser.add_argument("--without", default="", help="comma-separated groups to leave out (e.g. tests)")
    args = parser.parse_args(argv)
    repo = Path(args.repo).resolve()
    out = Path(args.out) if args.out else repo / ".device-wheels"
    groups = {g: p for g, p in read_pins(Path(args.pins)).items() if g not in args.without.split(",")}
    manifest = pack(repo, out, groups, cache=out / "wheels")
    for p in manifest["parts"]:
        print(f"{out / p['name']}: {p['bytes'] / MiB:.1f} MiB")
    print(f"{len(manifest['parts'])} parts of at most {manifest['part_bytes'] / MiB:.1f} MiB: "
          f"{manifest['files_bytes'] / MiB:.0f} MiB of wheels, {manifest['archive_bytes'] / MiB:.0f} MiB after xz; "
          f"{out / EARLY} and {out / MANIFEST} go with part-00. Versions: {manifest['versions']}")
    return 0
