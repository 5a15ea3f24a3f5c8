"""location.py: what a path, glob or list names; shard formats told by the format table (name or first bytes)."""

import os

import pytest

from dali_pipes import open_source
from dali_pipes.data.location import classify, local_shard_kind
from dali_pipes.errors import DatasetError
from dali_pipes.tools.convert import write_tfrecords, write_webdataset


@pytest.fixture
def shards(jpeg_folder, tmp_path):
    source = open_source(jpeg_folder)
    write_tfrecords(source, str(tmp_path / "tfr"), shards=2, progress=False)
    write_webdataset(source, str(tmp_path / "wds"), shards=2, progress=False)
    return tmp_path


def test_a_tfrecord_is_told_by_its_bytes_and_a_tar_by_its_name(shards):
    record = sorted(p for p in os.listdir(shards / "tfr") if p.endswith(".tfrecord"))[0]
    renamed = shards / "tfr" / "no-extension"
    os.rename(shards / "tfr" / record, renamed)
    assert local_shard_kind(str(renamed)) == "tfrecord"
    tar = sorted(p for p in os.listdir(shards / "wds") if p.endswith(".tar"))[0]
    assert local_shard_kind(str(shards / "wds" / tar)) == "webdataset"
    (shards / "notes.bin").write_bytes(b"not a shard at all")
    assert local_shard_kind(str(shards / "notes.bin")) is None


def test_folders_globs_and_mixtures(shards, jpeg_folder):
    assert classify(jpeg_folder) == ("folder", [])
    kind, files = classify(str(shards / "wds" / "*.tar"))
    assert kind == "webdataset" and len(files) == 2
    tar = sorted(str(shards / "wds" / p) for p in os.listdir(shards / "wds") if p.endswith(".tar"))[0]
    record = sorted(str(shards / "tfr" / p) for p in os.listdir(shards / "tfr") if p.endswith(".tfrecord"))[0]
    with pytest.raises(DatasetError, match="holds shards of several formats"):
        classify([tar, record])
    (shards / "odd.bin").write_bytes(b"\x00" * 40)
    with pytest.raises(DatasetError, match="odd.bin: neither a TFRecord shard nor a .tar shard"):
        classify([record, str(shards / "odd.bin")])


def test_an_incomplete_numbered_set_is_refused_unless_listed(jpeg_folder, tmp_path):
    """3 of train-*-of-00004: a folder or a glob is refused naming the first missing shard; verify too."""
    from dali_pipes.tools.verify import verify
    out = str(tmp_path / "tfr")
    write_tfrecords(open_source(jpeg_folder), out, shards=4, progress=False)
    os.remove(os.path.join(out, "train-00002-of-00004.tfrecord"))
    for location in (out, os.path.join(out, "train-*")):
        with pytest.raises(DatasetError, match="1 of 4 shards train-\\*-of-00004.tfrecord are missing "
                                               "\\(first: train-00002-of-00004.tfrecord\\)"):
            open_source(location)
    with pytest.raises(DatasetError, match="are missing"):
        verify(out)
    listed = sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".tfrecord"))
    assert open_source(listed).num_samples > 0  # an explicit list reads what it names


def test_a_folder_holding_train_and_val_sets_is_refused_naming_both_and_the_glob_reads_one(tmp_path):
    """Issue 32: train and val converted into one folder read as one dataset of both splits, without a word.
    Refused, naming each set; the suggested glob, followed literally, reads the one set."""
    from conftest import write_folder
    write_folder(str(tmp_path / "images"), counts=(4, 3, 5))
    source, out = open_source(str(tmp_path / "images")), str(tmp_path / "both")
    write_tfrecords(source, out, shards=2, prefix="train", progress=False)
    write_tfrecords(source, out, shards=1, prefix="val", progress=False)
    with pytest.raises(DatasetError, match=rf"^{out}: holds 2 numbered shard sets \(train-\*-of-00002.tfrecord "
                                           r"\(2 shards\), val-\*-of-00001.tfrecord \(1 shards\)\), which would "
                                           rf"be read as one dataset\. Point at one set with a glob: "
                                           rf"{out}/train-\*-of-\*$"):
        open_source(out)
    assert open_source(f"{out}/train-*-of-*").num_samples == 12 and open_source(f"{out}/val-*-of-*").num_samples == 12


def test_images_beside_shard_files_are_refused(jpeg_folder, tmp_path):
    """Issue 32: class folders of images beside shards were left out without a word (the shards alone read)."""
    import shutil
    out = str(tmp_path / "tfr")
    write_tfrecords(open_source(jpeg_folder), out, shards=2, progress=False)
    shutil.copytree(os.path.join(jpeg_folder, "cat"), os.path.join(out, "cat"))
    expected = rf"^{out}: holds both shard files and images \(cat/\), so it is neither a shard folder nor an image"
    with pytest.raises(DatasetError, match=expected):
        open_source(out)
    shutil.rmtree(os.path.join(out, "cat"))
    shutil.copy(os.path.join(jpeg_folder, "dog", os.listdir(os.path.join(jpeg_folder, "dog"))[0]), out)
    with pytest.raises(DatasetError, match=r"holds both shard files and images \(\w+\.jpg\)"):
        open_source(out)
    assert open_source(f"{out}/train-*-of-*").num_samples == 12  # the suggested glob
