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
