"""verify_dataset: every kind of bad sample is found, named with its file (and record), and the
clean list reads back without them."""

import glob
import io
import os
import subprocess
import sys

import numpy as np
from PIL import Image

from dali_pipes import open_source
from dali_pipes.data.formats import tfrecord
from dali_pipes.tools.convert import write_tfrecords, write_webdataset
from dali_pipes.tools.verify import verify, write_clean_list

from conftest import dali_read_epoch, jpeg_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _spoil_folder(root):
    good = jpeg_bytes(99)
    (root / "cat" / "zero.jpg").write_bytes(b"")
    (root / "cat" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "dog" / "text.jpg").write_bytes(b"this is not an image at all")
    big = io.BytesIO()
    Image.fromarray(np.zeros((300, 400, 3), np.uint8)).save(big, "JPEG")
    (root / "fish" / "big.jpg").write_bytes(big.getvalue())
    (root / "zebra").mkdir()  # a class with no images


def test_every_bad_file_is_named(jpeg_folder, tmp_path):
    root = tmp_path / "images"
    _spoil_folder(root)
    report = verify(str(root), max_pixels=100_000, progress=False)
    problems = {os.path.relpath(p.where, root): p.message for p in report.problems}
    assert set(problems) == {"cat/zero.jpg", "cat/truncated.jpg", "dog/text.jpg", "fish/big.jpg", "zebra"}
    assert problems["cat/zero.jpg"] == "zero-byte file"
    assert problems["cat/truncated.jpg"].startswith("truncated or corrupt image")
    assert problems["dog/text.jpg"].startswith("not an image")
    assert problems["fish/big.jpg"].startswith("oversized: 400 x 300 = 120,000 pixels")
    assert problems["zebra"] == "class folder with no images"
    assert report.checked == 16 and len(report.clean) == 12


def test_clean_list_reads_back_through_dali(jpeg_folder, tmp_path):
    root = tmp_path / "images"
    _spoil_folder(root)
    report = verify(str(root), max_pixels=100_000, progress=False)
    clean = str(root / "clean.txt")
    assert write_clean_list(report, clean) == 12
    source = open_source(clean)
    assert source.kind == "file_list" and source.num_samples == 12
    assert sum(dali_read_epoch(source).values()) == 12


def test_tfrecord_crc_and_keys(jpeg_folder, tmp_path):
    out = tmp_path / "tfr"
    write_tfrecords(open_source(jpeg_folder), str(out), shards=1, progress=False)
    shard = glob.glob(f"{out}/*.tfrecord")[0]
    entries = tfrecord.read_tfrecord_index(shard + ".idx")
    data = bytearray(open(shard, "rb").read())
    data[entries[2][0] + 40] ^= 0xFF  # a flipped bit inside record 2's data
    extra = tfrecord.frame_record(tfrecord.encode_example({"jpeg": jpeg_bytes(1), "label": 0}))
    garbage = tfrecord.frame_record(tfrecord.encode_example({"image/encoded": b"garbage!" * 10,
                                                           "image/class/label": 1}))
    with open(shard, "wb") as f:
        f.write(bytes(data) + extra + garbage)
    report = verify(str(out), progress=False)
    problems = {p.where.rsplit("/", 1)[1]: p.message for p in report.problems}
    name = os.path.basename(shard)
    assert problems[f"{name}#2"] == "data CRC mismatch (the record's bytes are corrupt)"
    assert problems[f"{name}#12"].startswith("no feature 'image/encoded'; keys present: jpeg, label")
    assert problems[f"{name}#13"].startswith("not an image")
    assert problems[name].startswith(f"{len(data) + len(extra) + len(garbage)} bytes, but ")  # the manifest's size
    assert len(problems) == 4 and report.checked == 14


def test_truncated_tfrecord_and_tar(jpeg_folder, tmp_path):
    write_tfrecords(open_source(jpeg_folder), str(tmp_path / "tfr"), shards=2, progress=False)
    shard = sorted(glob.glob(f"{tmp_path}/tfr/*.tfrecord"))[1]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 10)
    report = verify(str(tmp_path / "tfr"), progress=False)
    problem, by_manifest = report.problems
    assert problem.where.endswith(".tfrecord#5") and "truncated" in problem.message
    assert by_manifest.where == shard and "bytes, but" in by_manifest.message and "manifest.json" in by_manifest.message
    assert report.checked == 11  # the 5 records before the cut, and the other shard

    write_webdataset(open_source(jpeg_folder), str(tmp_path / "wds"), shards=2, progress=False)
    tar = sorted(glob.glob(f"{tmp_path}/wds/*.tar"))[0]
    with open(tar, "r+b") as f:
        f.truncate(3000)
    report = verify(str(tmp_path / "wds"), progress=False)
    assert len(report.problems) == 2 and {p.where for p in report.problems} == {tar}  # the scan's, the manifest's


def test_script_exit_codes_and_output(jpeg_folder, tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "scripts/verify_dataset.py", *a], cwd=ROOT,
                                    capture_output=True, text=True)
    ok = run(jpeg_folder)
    assert ok.returncode == 0 and "12 samples checked, 0 problems" in ok.stdout
    (tmp_path / "images" / "dog" / "zero.jpg").write_bytes(b"")
    bad = run(jpeg_folder, "--write-clean-list", str(tmp_path / "images" / "clean.txt"))
    assert bad.returncode == 1
    assert f"{tmp_path}/images/dog/zero.jpg: zero-byte file" in bad.stdout
    assert "clean.txt: 12 good samples listed" in bad.stdout
    missing = run(str(tmp_path / "nope"))
    assert missing.returncode == 1 and missing.stderr.strip().endswith("nope: no such file or directory")
