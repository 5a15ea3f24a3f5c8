"""Converters: shuffled across shards, balanced, deterministic, complete."""

import glob
import json
import os

from dali_pipes import open_source
from dali_pipes.convert import write_tfrecords, write_webdataset

from conftest import write_folder


def test_shards_are_balanced_shuffled_and_deterministic(tmp_path):
    folder = str(tmp_path / "images")
    write_folder(folder, counts=(10, 10, 11))
    source = open_source(folder)
    write_tfrecords(source, str(tmp_path / "a"), shards=4, seed=1, progress=False)
    write_tfrecords(source, str(tmp_path / "b"), shards=4, seed=1, progress=False)
    shards = sorted(glob.glob(f"{tmp_path}/a/*.tfrecord"))
    per_shard = [open_source(s).num_samples for s in shards]
    assert sorted(per_shard) == [7, 8, 8, 8]  # 31 samples over 4 shards
    assert json.load(open(tmp_path / "a" / "classes.json"))["samples_per_shard"] == per_shard
    for a in shards:  # same seed, same bytes
        assert open(a, "rb").read() == open(a.replace("/a/", "/b/"), "rb").read()
    labels = [[s.label for s in open_source(shard).iter_samples()] for shard in shards]
    assert all(len(set(l)) > 1 for l in labels)  # classes mixed within each shard
    assert labels[0] != sorted(labels[0]) or labels[1] != sorted(labels[1])  # and not in class order


def test_webdataset_members_and_labels(jpeg_folder, tmp_path):
    out = str(tmp_path / "wds")
    stats = write_webdataset(open_source(jpeg_folder), out, shards=3, progress=False)
    assert stats.samples == 12 and stats.shards == 3 and stats.mb_per_s > 0
    import tarfile
    names = [n for shard in sorted(glob.glob(f"{out}/*.tar")) for n in tarfile.open(shard).getnames()]
    assert len(names) == 24 and all(n.endswith((".jpg", ".cls")) for n in names)
    assert all(n.count(".") == 1 for n in names)  # the key ends at the first dot


def test_a_full_disk_during_convert_is_one_line_naming_the_output_and_leaves_no_temp(tmp_path, disk_full):
    import pytest
    from dali_pipes.config import run_cli
    write_folder(tmp_path / "images")
    out = tmp_path / "out"
    disk_full(out)
    with pytest.raises(SystemExit) as ended:
        run_cli(lambda _: write_tfrecords(open_source(str(tmp_path / "images")), str(out), shards=2,
                                          progress=False), None)
    message = str(ended.value.code)
    assert "\n" not in message and message.startswith(f"error: {out}/train-0000")
    assert "no space left on the device" in message and "convert's output argument" in message
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
