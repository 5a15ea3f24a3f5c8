"""open_source: every format round-trips through real DALI readers, exactly once, and every bad
input gives a message that names the file and the fix before DALI builds."""

import glob
import gzip
import os
import zlib

import pytest

from dali_pipes import DatasetError, SampleKeys, Source, open_source
from dali_pipes.data.formats import tfrecord
from dali_pipes.tools.convert import write_tfrecords, write_webdataset

from conftest import CLASSES, dali_read_epoch, expected_multiset, jpeg_bytes


@pytest.fixture
def tfrecord_dir(jpeg_folder, tmp_path):
    out = str(tmp_path / "tfrecord")
    write_tfrecords(open_source(jpeg_folder), out, shards=3, progress=False)
    return out


@pytest.fixture
def wds_dir(jpeg_folder, tmp_path):
    out = str(tmp_path / "wds")
    write_webdataset(open_source(jpeg_folder), out, shards=2, progress=False)
    return out


def test_image_folder_round_trips(jpeg_folder):
    source = open_source(jpeg_folder)
    assert (source.kind, source.num_samples, source.classes) == ("folder", 12, ["cat", "dog", "fish"])
    assert dali_read_epoch(source) == expected_multiset(jpeg_folder)


def test_file_list_round_trips(jpeg_folder):
    list_path = os.path.join(jpeg_folder, "list.txt")
    with open(list_path, "w") as f:
        f.write("# comment lines and blank lines are skipped\n\n")
        f.write("dog/dog_000.jpg 7\ncat/cat_001.jpg 3\n")
    source = open_source(list_path)
    assert (source.kind, source.num_samples) == ("file_list", 2)
    read = lambda p: open(os.path.join(jpeg_folder, p), "rb").read()
    assert dali_read_epoch(source, batch_size=3) == {(read("dog/dog_000.jpg"), 7): 1, (read("cat/cat_001.jpg"), 3): 1}


@pytest.mark.parametrize("form", ["folder", "glob", "list", "list_file", "one_file"])
def test_tfrecords_round_trip_in_every_form(tfrecord_dir, jpeg_folder, form):
    shards = sorted(glob.glob(f"{tfrecord_dir}/*.tfrecord"))
    location = {"folder": tfrecord_dir, "glob": f"{tfrecord_dir}/train-*-of-*", "list": shards,
                "one_file": shards[0]}.get(form)
    if form == "list_file":
        location = os.path.join(tfrecord_dir, "shards.txt")
        with open(location, "w") as f:
            f.write("".join(os.path.basename(s) + "\n" for s in shards))
    source = open_source(location)
    assert source.kind == "tfrecord" and source.classes == ["cat", "dog", "fish"]
    expected = expected_multiset(jpeg_folder)
    if form == "one_file":
        expected = {s: n for s, n in expected.items() if s in dict.fromkeys(
            (x.data, x.label) for x in source.iter_samples())}
    assert source.num_samples == sum(expected.values())
    assert dali_read_epoch(source) == expected


def test_webdataset_round_trips(wds_dir, jpeg_folder):
    source = open_source(wds_dir)
    assert (source.kind, source.num_samples) == ("webdataset", 12)
    assert dali_read_epoch(source, batch_size=5) == expected_multiset(jpeg_folder)


def test_webdataset_labels_with_many_digits_and_newlines(tmp_path):
    import tarfile

    from dali_pipes.data.formats.webdataset import add_member
    labels = [0, 9, 10, 123, 98765, 4000000000]
    with tarfile.open(tmp_path / "x.tar", "w") as tar:
        for i, label in enumerate(labels):
            add_member(tar, f"k{i}.jpg", jpeg_bytes(i))
            add_member(tar, f"k{i}.cls", f"{label}\n".encode() if i % 2 else str(label).encode())
    got = dali_read_epoch(open_source(str(tmp_path / "x.tar")), batch_size=4)
    assert sorted(label for _, label in got) == labels


def test_tensorflow_style_keys_and_one_based_labels(tmp_path, jpeg_folder):
    """Records with other keys and 1-based labels (TensorFlow's ImageNet scripts) read with
    configured keys and a label offset."""
    path = str(tmp_path / "tf" / "train-00000-of-00001")
    os.makedirs(os.path.dirname(path))
    expected = expected_multiset(jpeg_folder)
    with open(path, "wb") as f:
        for data, label in expected:
            f.write(tfrecord.frame_record(tfrecord.encode_example({"jpeg": data, "cls": label + 1, "extra": 1.5})))
    source = open_source(os.path.dirname(path), keys=SampleKeys("jpeg", "cls", label_offset=1))
    assert dali_read_epoch(source, batch_size=5) == expected
    assert os.path.exists(path + ".idx")


# ---------------------------------------------------------------------------------------------
# Bad input: a clear message, never a DALI stack trace.
# ---------------------------------------------------------------------------------------------

def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere: no such file or directory"):
        open_source(str(tmp_path / "nothere"))


def test_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="empty folder; expected .*<class name>/<image>.jpg"):
        open_source(str(tmp_path / "empty"))
    (tmp_path / "empty" / "a_class").mkdir()
    with pytest.raises(DatasetError, match="no images found"):
        open_source(str(tmp_path / "empty"))


def test_glob_with_no_matching_shards(tmp_path):
    with pytest.raises(FileNotFoundError, match="train-\\*-of-\\*: no files match"):
        open_source(str(tmp_path / "train-*-of-*"))


@pytest.mark.parametrize("compress,name", [(gzip.compress, "GZIP"), (zlib.compress, "ZLIB")])
def test_compressed_tfrecords_say_how_to_fix(tfrecord_dir, compress, name):
    shard = sorted(glob.glob(f"{tfrecord_dir}/*.tfrecord"))[1]
    with open(shard, "rb") as f:
        data = f.read()
    with open(shard, "wb") as f:
        f.write(compress(data))
    with pytest.raises(DatasetError, match=f"{name}-compressed TFRecord.*to_tfrecord.py .* --decompress"):
        open_source(tfrecord_dir)


def test_truncated_last_record(tfrecord_dir):
    shard = sorted(glob.glob(f"{tfrecord_dir}/*.tfrecord"))[0]
    os.remove(shard + ".idx")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 100)
    with pytest.raises(DatasetError, match=r"00000-of-00003.tfrecord: record 3 \(byte \d+\): truncated"):
        open_source(tfrecord_dir)


def test_missing_feature_key_lists_the_keys_present(tfrecord_dir):
    with pytest.raises(DatasetError, match="no feature 'image/class/label_id'; keys present: image/channels, "
                                           "image/class/label, image/class/text, image/colorspace"):
        open_source(tfrecord_dir, keys=SampleKeys(label="image/class/label_id"))
    with pytest.raises(DatasetError, match="no feature 'img'"):
        open_source(tfrecord_dir, keys=SampleKeys(image="img"))


def test_label_feature_of_the_wrong_type(tfrecord_dir):
    with pytest.raises(DatasetError, match="'image/class/text' should hold one int value"):
        open_source(tfrecord_dir, keys=SampleKeys(label="image/class/text"))


def test_index_that_does_not_match_its_shard(tfrecord_dir):
    shard = sorted(glob.glob(f"{tfrecord_dir}/*.tfrecord"))[2]
    with open(shard + ".idx") as f:
        lines = f.readlines()
    with open(shard + ".idx", "w") as f:
        f.writelines(lines[:-1])  # a short index: DALI would silently drop the last record
    with pytest.raises(DatasetError, match=r"00002-of-00003.tfrecord: no index that matches this shard "
                                           r"\(1 of 3 shards lack one\).*make_index.py"):
        open_source(tfrecord_dir, build_indexes=False)
    assert open_source(tfrecord_dir).num_samples == 12  # the default rebuilds it
    assert len(open(shard + ".idx").readlines()) == len(lines)


def test_missing_index_is_built_or_reported(tfrecord_dir):
    for idx in glob.glob(f"{tfrecord_dir}/*.idx"):
        os.remove(idx)
    with pytest.raises(DatasetError, match="3 of 3 shards lack one"):
        open_source(tfrecord_dir, build_indexes=False)
    assert open_source(tfrecord_dir).num_samples == 12


def test_zero_byte_image_named_before_dali(jpeg_folder):
    open(os.path.join(jpeg_folder, "dog", "empty.jpg"), "wb").close()
    with pytest.raises(DatasetError, match=r"dog/empty.jpg: empty \(0-byte\) file.*--write-clean-list"):
        open_source(jpeg_folder)


@pytest.mark.parametrize("given", ["folder", "file list"])
def test_the_zero_byte_messages_clean_list_fix_runs_as_written(jpeg_folder, capsys, given):
    """Issue 32: the 0-byte-file message said --write-clean-list clean.txt, which verify refuses (a list must sit
    with its images). The fix's commands, run as written, give a list that trains: the 12 good images of 13."""
    import re
    import shlex

    from dali_pipes import DaliLoader
    from dali_pipes.tools.cli import main
    open(os.path.join(jpeg_folder, "dog", "empty.jpg"), "wb").close()
    location = jpeg_folder
    if given == "file list":
        location = os.path.join(jpeg_folder, "all.txt")
        files = sorted(glob.glob(f"{jpeg_folder}/*/*.jpg"))
        with open(location, "w") as f:
            f.writelines(f"{os.path.relpath(p, jpeg_folder)} {CLASSES.index(p.split('/')[-2])}\n"
                         for p in files)
    with pytest.raises(DatasetError) as error:
        open_source(location)
    verify, target = re.search(r"train from a clean list: (dali-pipes verify \S+ --write-clean-list (\S+)) \(or: "
                               r"python scripts/verify_dataset.py \.\.\.\), then train from \2 \(--data \2\)$",
                               error.value.fix).groups()
    assert main(shlex.split(verify)[1:]) == 1  # the problem is listed, and the clean list written
    loader = DaliLoader(target, batch_size=4, train=False, device="cpu", num_threads=1, image_size=16)
    assert sum(int((labels >= 0).sum()) for _, labels in loader) == 12
    loader.close()
    capsys.readouterr()


def test_file_list_problems(jpeg_folder):
    list_path = os.path.join(jpeg_folder, "list.txt")
    for content, error, match in [
        ("cat/cat_000.jpg 0\ncat/nope.jpg 1\n", FileNotFoundError,
         r"1 listed files do not exist, first: .*list.txt:2: .*cat/nope.jpg"),
        ("../outside.jpg 0\n", DatasetError, r"list.txt:1: '../outside.jpg' is outside the list's folder"),
        ("cat/cat_000.jpg 0\ncat/cat_001.jpg\n", DatasetError, r"list.txt:2: expected 'relative/path label'"),
    ]:
        with open(list_path, "w") as f:
            f.write(content)
        with pytest.raises(error, match=match):
            open_source(list_path)


def test_folder_of_non_shards(tmp_path):
    (tmp_path / "notes.bin").write_bytes(b"hello world, not a record")
    with pytest.raises(DatasetError, match="notes.bin: neither a TFRecord shard nor a .tar shard"):
        open_source(str(tmp_path))


def test_truncated_tar_member(wds_dir):
    shard = sorted(glob.glob(f"{wds_dir}/*.tar"))[0]
    os.remove(shard + ".idx")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    with pytest.raises(DatasetError,
                       match=r"00000-of-00002.tar: (member .* is truncated|not a readable tar|truncated or damaged)"):
        open_source(wds_dir)


def test_a_source_made_without_its_kinds_fields_is_refused_by_name():
    """A Source made by hand without a field its kind needs (a shard kind's index files, an image
    kind's labels) is refused naming the field, not failed on a None."""
    with pytest.raises(ValueError, match=r"^data/: a 'tfrecord' source without index_files; make it with open_source"):
        Source("tfrecord", "data/", ["data/a.tfrecord"]).refs()
    with pytest.raises(ValueError, match=r"^data/: a 'folder' source without labels"):
        Source("folder", "data/", ["data/a/1.jpg"]).refs()
