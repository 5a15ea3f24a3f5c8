"""Labels are checked (issue 19): where they are known at open (file lists, image folders, classes.json, a
manifest, the first record of a shard) and, for records, in the DALI graph: a label negative after the
offset, or at or above a known class count, fails its batch and is named with the offset or the count,
never excluded as a bad sample and never trained on as the padding marker -1. Good data comes out with
exactly its labels. Real DALI on CPU, tiny data."""

import json
import os
import tarfile
import warnings

import pytest

from dali_pipes import DaliLoader, SampleKeys, open_source
from dali_pipes.data.formats import tfrecord, webdataset
from dali_pipes.data.labels import EXCLUDED_LABEL, check_label, stored_to_label
from dali_pipes.errors import LabelError

from conftest import jpeg_bytes

KW = dict(batch_size=4, train=False, device="cpu", image_size=16, num_threads=1, val_padding="none")


def all_labels(loader) -> list[int]:
    try:
        return sorted(l for _, labels in loader for l in labels.tolist())
    finally:
        loader.close()


def write_records(path, labels: list[int], keys: dict | None = None) -> str:
    with open(path, "wb") as f:
        for i, label in enumerate(labels):
            f.write(tfrecord.frame_record(tfrecord.encode_example(
                {"image/encoded": jpeg_bytes(i), "image/class/label": label})))
    return str(path)


def zero_based_shards(tmp_path, classes=None) -> str:
    """Two TFRecord shards, labels 0-based (class 0 present), but no shard starts with a class 0 record:
    only the graph can see it. No manifest; a classes.json when `classes` is given."""
    folder = tmp_path / "tfr"
    folder.mkdir()
    write_records(folder / "train-00000-of-00002.tfrecord", [2, 1, 0, 2, 1, 2])
    write_records(folder / "train-00001-of-00002.tfrecord", [1, 2, 2, 0, 1, 2])
    if classes:
        (folder / "classes.json").write_text(json.dumps({"classes": classes}))
    return str(folder)


def test_check_label_names_the_offset_or_the_count():
    check_label(0, "x")
    check_label(2, "x", num_classes=3)
    with pytest.raises(LabelError, match=r"^a#1: label 0 - label offset 1 = -1 is negative. Check --label-offset"):
        check_label(-1, "a#1", offset=1)
    with pytest.raises(LabelError, match=r"^a#1: label -3 is negative .* -1 is the loader's padding marker"):
        check_label(-3, "a#1")
    with pytest.raises(LabelError, match=r"^l:7: label 7 is not below the 3 classes of c.json"):
        check_label(7, "l:7", num_classes=3, classes_from="c.json")
    assert stored_to_label(EXCLUDED_LABEL, "x", offset=1) == -1  # a placeholder, whatever the offset
    assert stored_to_label(5, "x", offset=1) == 4


def test_good_records_keep_exactly_their_labels(tmp_path):
    location = zero_based_shards(tmp_path, classes=["a", "b", "c"])
    assert all_labels(DaliLoader(location, **KW)) == sorted([2, 1, 0, 2, 1, 2, 1, 2, 2, 0, 1, 2])
    one_based = str(tmp_path / "one-based.tfrecord")
    write_records(one_based, [3, 1, 2, 1])
    assert all_labels(DaliLoader(one_based, keys=SampleKeys(label_offset=1), **KW)) == [0, 0, 1, 2]


@pytest.mark.parametrize("skip_bad", [False, True])
def test_label_offset_that_makes_class_0_negative_fails_the_first_batch_holding_one(tmp_path, skip_bad):
    """The issue's case: --label-offset 1 on 0-based records turned class 0 into -1, the padding marker.
    Here no shard starts with class 0, so open cannot see it: the first batch holding one fails, naming
    the record and the offset, with skip_bad too (a wrong offset is not a bad sample)."""
    location = zero_based_shards(tmp_path)
    open_source(location, keys=SampleKeys(label_offset=1))  # open cannot tell: no shard starts with class 0
    with pytest.raises(LabelError, match=r"train-00000-of-00002.tfrecord#2: label 0 - label offset 1 = -1 is "
                                         r"negative. Check --label-offset \(label_offset=1\)"):
        all_labels(DaliLoader(location, keys=SampleKeys(label_offset=1), skip_bad=skip_bad, **KW))


def test_label_offset_is_refused_at_open_when_a_first_record_shows_it(tmp_path):
    shard = write_records(tmp_path / "a.tfrecord", [0, 1, 2])
    with pytest.raises(LabelError, match=r"a.tfrecord#0: label 0 - label offset 1 = -1 is negative"):
        open_source(shard, keys=SampleKeys(label_offset=1))


def test_record_label_at_or_above_the_classes_of_classes_json_fails_its_batch(tmp_path):
    location = zero_based_shards(tmp_path, classes=["a", "b"])  # labels go up to 2: 3 classes needed
    with pytest.raises(LabelError, match=r"train-00000-of-00002.tfrecord#0: label 2 is not below the 2 classes"):
        open_source(location)  # the first record of the first shard already shows it
    write_records(tmp_path / "tfr" / "train-00000-of-00002.tfrecord", [1, 0, 2, 1])
    write_records(tmp_path / "tfr" / "train-00001-of-00002.tfrecord", [0, 1])
    for name in os.listdir(tmp_path / "tfr"):
        if name.endswith(".idx"):
            os.remove(tmp_path / "tfr" / name)
    with pytest.raises(LabelError, match=r"00002.tfrecord#2: label 2 is not below the 2 classes"):
        all_labels(DaliLoader(location, skip_bad=True, **KW))


def tar_shard(path, labels: list[bytes]) -> str:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i, label in enumerate(labels):
            webdataset.add_member(tar, f"{i:04d}.jpg", jpeg_bytes(i))
            webdataset.add_member(tar, f"{i:04d}.cls", label)
    return str(path)


def test_negative_webdataset_label_fails_its_batch_naming_the_sample(tmp_path):
    good = tar_shard(tmp_path / "good.tar", [b"0", b"3", b"12\n", b"7"])
    assert all_labels(DaliLoader(good, **KW)) == [0, 3, 7, 12]
    bad = tar_shard(tmp_path / "bad.tar", [b"0", b"1", b"-3", b"2"])
    with pytest.raises(LabelError, match=r"bad.tar#0002: label -3 is negative"):
        all_labels(DaliLoader(bad, **KW))


def test_label_offset_applies_to_webdataset_labels_too(tmp_path):
    """--label-offset was read for TFRecords only: on WebDataset shards it was silently ignored. It is
    subtracted from .cls labels as from TFRecord labels, in the DALI graph and in Python reads alike; on
    0-based shards it is refused at open when a shard starts with class 0, else with the first batch
    holding one, naming the sample and the offset."""
    one_based = tar_shard(tmp_path / "one.tar", [b"1", b"4", b"13\n", b"8"])
    keys = SampleKeys(label_offset=1)
    assert all_labels(DaliLoader(one_based, keys=keys, **KW)) == [0, 3, 7, 12]
    assert [s.label for s in open_source(one_based, keys=keys).iter_samples()] == [0, 3, 12, 7]
    starts_with_0 = tar_shard(tmp_path / "zero.tar", [b"0", b"3", b"1", b"2"])
    with pytest.raises(LabelError, match=r"^.*zero.tar#0000: label 0 - label offset 1 = -1 is negative. "
                                         r"Check --label-offset \(label_offset=1\)"):
        open_source(starts_with_0, keys=keys)
    holds_0 = tar_shard(tmp_path / "later.tar", [b"2", b"3", b"0", b"1"])
    open_source(holds_0, keys=keys)  # its first sample is class 2: open cannot tell
    with pytest.raises(LabelError, match=r"later.tar#0002: label 0 - label offset 1 = -1 is negative"):
        all_labels(DaliLoader(holds_0, keys=keys, **KW))


def test_label_offset_is_refused_for_image_folders_and_file_lists(tmp_path, jpeg_folder):
    """Their labels are not stored in records: an offset would have been ignored without a word."""
    with pytest.raises(LabelError, match=r"images: label offset 1 given, but .* sorted class folders, 0 .. "
                                         r"classes - 1; --label-offset applies to TFRecord and WebDataset"):
        open_source(jpeg_folder, keys=SampleKeys(label_offset=1))
    listed = tmp_path / "list.txt"
    listed.write_text("images/cat/cat_000.jpg 1\n")
    with pytest.raises(LabelError, match=r"list.txt: label offset 2 given, .* Drop --label-offset .*0-based"):
        open_source(str(listed), keys=SampleKeys(label_offset=2))
    assert open_source(jpeg_folder).num_samples == 12  # no offset: as before


def test_excluded_samples_still_read_as_padding(tmp_path):
    """A placeholder (skip_bad) stores EXCLUDED_LABEL and reads as -1, while a real -1 is refused."""
    shard = str(tmp_path / "train-00000-of-00001.tfrecord")
    write_records(shard, [0, 1, 2, 3, 4, 5, 6, 7])
    with open(shard, "r+b") as f:  # record 5's image bytes garbled: a bad sample
        entries = tfrecord.build_tfrecord_index(shard)
        data = bytearray(f.read())
    offset, size = entries[5]
    frame = tfrecord.frame_record(tfrecord.encode_example({"image/encoded": b"garbage" * 20, "image/class/label": 5}))
    with open(shard, "wb") as f:
        f.write(bytes(data[:offset]) + frame + bytes(data[offset + size:]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = DaliLoader(shard, skip_bad=True, **KW)
        assert all_labels(loader) == [-1, 0, 1, 2, 3, 4, 6, 7]


def test_the_run_class_count_bounds_record_labels_in_the_graph(tmp_path):
    """Issue 24: with no classes.json, the class count the run uses (DaliLoader's num_classes, python -m train
    --num-classes) was no label check: label 9 reached the loss as torch's IndexError. Now the batch holding it
    fails, naming the record and the count, with skip_bad too; open already refuses a first record at or above
    it. Labels below it come out exactly."""
    folder = tmp_path / "tfr"
    folder.mkdir()
    write_records(folder / "train-00000-of-00001.tfrecord", [9 if i == 5 else i % 4 for i in range(8)])
    assert all_labels(DaliLoader(str(folder), **KW)) == [0, 0, 1, 2, 2, 3, 3, 9]  # no count known: as stored
    assert all_labels(DaliLoader(str(folder), num_classes=10, **KW)) == [0, 0, 1, 2, 2, 3, 3, 9]
    for skip_bad in (False, True):
        with pytest.raises(LabelError, match=r"train-00000-of-00001.tfrecord#5: label 9 is not below the 4 classes "
                                             r"of the run \(num_classes=4, --num-classes\)"):
            all_labels(DaliLoader(str(folder), num_classes=4, skip_bad=skip_bad, **KW))
    with pytest.raises(ValueError, match=r"num_classes must be a count of at least 1 .*, got 0"):
        open_source(str(folder), num_classes=0)
    first_is_3 = write_records(tmp_path / "a.tfrecord", [3, 0, 1])
    with pytest.raises(LabelError, match=r"a.tfrecord#0: label 3 is not below the 3 classes of the run"):
        open_source(first_is_3, num_classes=3)


def test_the_run_class_count_bounds_listed_labels_at_open(tmp_path, jpeg_folder):
    """Image folders and file lists: their labels are known at open, and checked there against the count (the
    smaller of it and the class list bounds them); a Source opened elsewhere is checked as DaliLoader takes it."""
    with pytest.raises(LabelError, match=r"fish/fish_000.jpg \(and 4 more in .*images\): label 2 is not below the "
                                         r"2 classes of the run \(num_classes=2, --num-classes\)"):
        open_source(jpeg_folder, num_classes=2)
    assert open_source(jpeg_folder, num_classes=3).num_samples == 12
    with pytest.raises(LabelError, match=r"fish_000.jpg .*label 2 is not below the 2 classes"):
        DaliLoader(open_source(jpeg_folder), num_classes=2, **KW)
    assert all_labels(DaliLoader(open_source(jpeg_folder), num_classes=5, **KW)) == [0] * 4 + [1] * 3 + [2] * 5


def test_the_torch_baseline_checks_labels_against_the_run_class_count(tmp_path):
    from dali_pipes.baseline import TorchLoader
    shard = write_records(tmp_path / "a.tfrecord", [0, 1, 9, 2])
    loader = TorchLoader(shard, batch_size=2, train=False, num_workers=0, image_size=16, num_classes=4)
    with pytest.raises(LabelError, match=r"a.tfrecord#2: label 9 is not below the 4 classes of the run"):
        list(loader)
