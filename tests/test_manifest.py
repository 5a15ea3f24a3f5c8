"""manifest.json (issue 19): convert writes it last, naming every shard with its size, sample count and
label range, and the classes; open_source and verify refuse shards that miss it, naming the shard and the
manifest; readers never take it for a shard. (The s3:// case: tests/test_s3_source.py.)"""

import json
import os

import pytest

from dali_pipes import DatasetError, SampleKeys, open_source
from dali_pipes.data.formats import tfrecord
from dali_pipes.data.manifest import MANIFEST_NAME, build, problems, write
from dali_pipes.errors import LabelError
from dali_pipes.tools.convert import write_tfrecords, write_webdataset
from dali_pipes.tools.verify import verify

from conftest import CLASSES, jpeg_bytes, write_folder


def converted(tmp_path, fmt="tfrecord", shards=3, prefix="train") -> str:
    write_folder(str(tmp_path / "images"), counts=(4, 3, 5))
    out = str(tmp_path / fmt)
    write = write_tfrecords if fmt == "tfrecord" else write_webdataset
    write(open_source(str(tmp_path / "images")), out, shards=shards, prefix=prefix, progress=False)
    return out


@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset"])
def test_convert_writes_the_manifest_last_and_readers_ignore_it(tmp_path, fmt):
    out = converted(tmp_path, fmt)
    ext = ".tfrecord" if fmt == "tfrecord" else ".tar"
    written = sorted(os.listdir(out), key=lambda n: os.stat(os.path.join(out, n)).st_mtime_ns)
    assert written[-1] == MANIFEST_NAME  # after every shard, index and classes.json
    manifest = json.load(open(os.path.join(out, MANIFEST_NAME)))
    names = [f"train-{i:05d}-of-00003{ext}" for i in range(3)]
    assert [s["name"] for s in manifest["shards"]] == names
    assert [s["bytes"] for s in manifest["shards"]] == [os.path.getsize(os.path.join(out, n)) for n in names]
    source = open_source(out)
    assert [s["samples"] for s in manifest["shards"]] == source.counts and manifest["samples"] == 12
    assert manifest["classes"] == list(CLASSES) and manifest["kind"] == fmt
    labels = {}
    for sample in source.iter_samples():
        labels.setdefault(sample.origin.split("#")[0], []).append(sample.label)
    assert [s["labels"] for s in manifest["shards"]] == [[min(labels[os.path.join(out, n)]), max(labels[os.path.join(
        out, n)])] for n in names]
    assert source.files == [os.path.join(out, n) for n in names]  # not a shard, through a folder or a glob
    assert open_source(os.path.join(out, "*")).files == source.files
    assert verify(out, progress=False).ok


def test_a_shard_of_another_size_is_refused_by_open_and_verify(tmp_path):
    out = converted(tmp_path)
    shard = os.path.join(out, "train-00001-of-00003.tfrecord")
    with open(shard, "ab") as f:  # a record more than the conversion wrote (the index is rebuilt: 5 records)
        f.write(tfrecord.frame_record(tfrecord.encode_example({"image/encoded": jpeg_bytes(1),
                                                              "image/class/label": 0})))
    expected = rf"train-00001-of-00003.tfrecord: \d+ bytes, but .*/{MANIFEST_NAME} lists \d+"
    with pytest.raises(DatasetError, match=expected):
        open_source(out)
    report = verify(out, progress=False)
    assert not report.ok and any(p.where == shard and "manifest.json lists" in p.message for p in report.problems)
    with pytest.warns(UserWarning, match=expected):  # skip_bad: the manifest's word is a warning
        open_source(out, skip_bad=True)


def test_a_shard_the_manifest_lists_but_the_folder_lacks_is_refused(tmp_path):
    """Shards not named -of- (the name check cannot see a gap): only the manifest can."""
    folder = tmp_path / "data"
    folder.mkdir()
    entries = []
    for name, labels in (("a.tfrecord", [0, 1]), ("b.tfrecord", [1, 2]), ("c.tfrecord", [2, 0])):
        with open(folder / name, "wb") as f:
            for i, label in enumerate(labels):
                f.write(tfrecord.frame_record(tfrecord.encode_example({"image/encoded": jpeg_bytes(i),
                                                                      "image/class/label": label})))
        entries.append({"name": name, "bytes": os.path.getsize(folder / name), "samples": 2,
                        "labels": [min(labels), max(labels)]})
    write(str(folder), build("tfrecord", ["x", "y", "z"], entries))
    assert open_source(str(folder)).classes == ["x", "y", "z"]  # classes from the manifest
    os.remove(folder / "b.tfrecord")
    with pytest.raises(DatasetError, match=rf"data/b.tfrecord: missing: .*/data/{MANIFEST_NAME} lists it "
                                           rf"\(\d+ bytes, 2 samples\)"):
        open_source(str(folder))
    with pytest.raises(DatasetError, match="missing"):
        open_source(str(folder), skip_bad=True)
    assert open_source([str(folder / "a.tfrecord")]).num_samples == 2  # an explicit list reads what it names
    report = verify(str(folder), progress=False)
    assert [(p.where, p.message.split(":")[0]) for p in report.problems] == [(str(folder / "b.tfrecord"), "missing")]
    from dali_pipes.tools.cli import main
    assert main(["verify", str(folder), "--workers", "1"]) == 1


def test_a_count_that_differs_is_named():
    manifest = build("tfrecord", None, [{"name": "a.tfrecord", "bytes": 10, "samples": 3, "labels": [0, 1]}])
    [error] = problems(manifest, "m.json", ["/d/a.tfrecord"], [10], [2], complete=True)
    assert str(error) == "/d/a.tfrecord: 2 samples, but m.json lists 3. Copy it again, or convert again"
    assert problems(manifest, "m.json", ["/d/other.tfrecord"], [5], [1], complete=True) == []  # not its shards


def test_the_manifest_range_refuses_a_label_offset_at_open(tmp_path):
    out = converted(tmp_path)
    with pytest.raises(LabelError, match=rf"{MANIFEST_NAME} lists labels from 0: label offset 1 makes them negative"):
        open_source(out, keys=SampleKeys(label_offset=1))


def test_a_convert_cut_short_leaves_no_manifest(tmp_path):
    write_folder(str(tmp_path / "images"), counts=(4, 3, 5))
    (tmp_path / "images" / CLASSES[2] / "zz_broken.jpg").write_bytes(b"not a jpeg at all")
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match="zz_broken.jpg: not a readable image"):
        write_tfrecords(open_source(str(tmp_path / "images")), str(out), shards=2, workers=1, progress=False)
    assert MANIFEST_NAME not in os.listdir(out)


def test_two_conversions_into_one_folder_keep_both_in_the_manifest(tmp_path):
    write_folder(str(tmp_path / "images"), counts=(4, 3, 5))
    source = open_source(str(tmp_path / "images"))
    out = str(tmp_path / "both")
    write_tfrecords(source, out, shards=2, prefix="train", progress=False)
    write_tfrecords(source, out, shards=1, prefix="val", progress=False)
    manifest = json.load(open(os.path.join(out, MANIFEST_NAME)))
    assert [s["name"] for s in manifest["shards"]] == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord",
                                                        "val-00000-of-00001.tfrecord"]
    assert open_source(os.path.join(out, "val-*")).num_samples == 12
    assert open_source(os.path.join(out, "train-*")).num_samples == 12


def test_a_folder_holding_two_conversions_is_refused_by_open_and_verify(tmp_path):
    """Issue 24: two conversions in one folder (--shards 6, then --shards 4, as convert allowed before it
    refused; here: the old set copied in) read as twice the samples, and verify said 0 problems. The shards the
    manifest does not list are named, at open (skip_bad too: a stale set is no bad sample) and by verify."""
    import shutil

    from dali_pipes.tools.cli import main
    write_folder(str(tmp_path / "images"), counts=(4, 3, 5))
    source = open_source(str(tmp_path / "images"))
    old, out = str(tmp_path / "old"), str(tmp_path / "out")
    write_tfrecords(source, old, shards=6, progress=False)
    write_tfrecords(source, out, shards=4, progress=False)
    for name in os.listdir(old):
        if name.startswith("train-"):
            shutil.copy(os.path.join(old, name), out)
    expected = (rf"^{out}/train-00000-of-00006.tfrecord: not listed in {out}/{MANIFEST_NAME} \(4 shards, 12 samples\), "
                r"but found with its shards: 10 shards \(24 samples\), 6 unlisted, as when two conversions write one "
                r"folder\. .*--overwrite")
    for location in (out, os.path.join(out, "train-*")):
        with pytest.raises(DatasetError, match=expected):
            open_source(location)
    with pytest.raises(DatasetError, match=expected):
        open_source(out, skip_bad=True)
    assert open_source([os.path.join(out, f"train-{i:05d}-of-00004.tfrecord") for i in range(4)]).num_samples == 12
    report = verify(out, progress=False)
    assert report.checked == 24
    assert sorted(p.where for p in report.problems) == [os.path.join(out, f"train-{i:05d}-of-00006.tfrecord")
                                                        for i in range(6)]
    assert all("not listed in" in p.message for p in report.problems)
    assert main(["verify", out, "--workers", "1"]) == 1


def test_the_manifest_total_classes_and_label_ranges_are_compared_with_the_data(tmp_path):
    """Issue 24: verify (and open, where it can tell without reading every label) compares the manifest's
    sample total, each shard's label range and its classes with what the folder holds, each difference a
    problem: exit 1."""
    from dali_pipes.tools.cli import main
    out = converted(tmp_path)
    path = os.path.join(out, MANIFEST_NAME)
    good = json.load(open(path))
    wrong_total = {**good, "samples": 13}
    write(out, wrong_total)
    with pytest.raises(DatasetError, match=rf"^{out}: 12 samples in its 3 shards, but {path} lists 13 in all"):
        open_source(out)
    assert [p.message for p in verify(out, progress=False).problems] == [f"12 samples in its 3 shards, but {path} "
                                                                         f"lists 13 in all"]
    low, high = good["shards"][1]["labels"]
    assert low < high
    write(out, {**good, "shards": [good["shards"][0], {**good["shards"][1], "labels": [low, low]},
                                   good["shards"][2]]})
    open_source(out)  # a range within the classes: only reading every label tells
    [problem] = verify(out, progress=False).problems
    assert problem.where == os.path.join(out, "train-00001-of-00003.tfrecord")
    assert problem.message == f"labels {low} .. {high}, but {path} lists {low} .. {low}"
    assert main(["verify", out, "--workers", "1"]) == 1
    write(out, good)
    classes = os.path.join(out, "classes.json")
    json.dump({**json.load(open(classes)), "classes": ["ant", "bee", "cow"]}, open(classes, "w"))
    expected = rf"^{classes}: lists 3 classes \(ant, bee, cow\), but {path} lists 3 \(cat, dog, fish\)"
    with pytest.raises(DatasetError, match=expected):
        open_source(out)
    assert [str(p) for p in verify(out, progress=False).problems] == [
        f"{classes}: lists 3 classes (ant, bee, cow), but {path} lists 3 (cat, dog, fish)"]
