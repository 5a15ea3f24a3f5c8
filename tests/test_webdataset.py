"""formats/webdataset.py: tar members grouped into samples by key, labels parsed, indexes in DALI's v1.2 form."""

import os
import tarfile
from types import SimpleNamespace

import pytest

from dali_pipes.data.formats import webdataset
from dali_pipes.data.labels import EXCLUDED_LABEL
from dali_pipes.data.samples import TFRecordKeys
from dali_pipes.errors import DatasetError

from conftest import jpeg_bytes


def test_samples_group_by_key_and_the_index_lists_them(tmp_path):
    path = str(tmp_path / "s.tar")
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for key, label in (("a_0", 3), ("a_1", 7)):
            webdataset.add_member(tar, f"{key}.jpg", jpeg_bytes(label))
            webdataset.add_member(tar, f"{key}.cls", str(label).encode())
    samples = webdataset.build_tar_index(path)
    assert [[m.key_ext for m in s] for s in samples] == [[("a_0", "jpg"), ("a_0", "cls")],
                                                          [("a_1", "jpg"), ("a_1", "cls")]]
    webdataset.write_tar_index(samples, path + ".idx")
    assert open(path + ".idx").readline().split() == [webdataset.INDEX_VERSION, "2"]
    assert webdataset.count_samples(path + ".idx") == 2 and webdataset.sniff_name(path)
    assert webdataset.parse_label(b" 42\n", "here") == 42
    with pytest.raises(DatasetError, match="here: label b'x' is not an integer"):
        webdataset.parse_label(b"x", "here")


def _three_samples(path: str) -> str:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(3):
            webdataset.add_member(tar, f"s_{i}.jpg", jpeg_bytes(i))
            webdataset.add_member(tar, f"s_{i}.cls", str(i).encode())
    webdataset.build_index(path, path + ".idx")
    return path


def test_a_rewrite_that_fails_removes_its_temp_copy(tmp_path, disk_full):
    """Issue 19: the copy of a shard with its bad samples replaced was written to a temp file that a failed
    write left behind. A full disk (injected ENOSPC) now leaves the target folder as it was; once space is
    freed the copy is made, the bad sample replaced by the placeholder and label EXCLUDED_LABEL."""
    shard = _three_samples(str(tmp_path / "s.tar"))
    out = tmp_path / "excluded"
    out.mkdir()
    source = SimpleNamespace(label_ext="cls")
    target = str(out / "copy.tar")
    disk_full(out)
    with pytest.raises(OSError, match="No space left"):
        webdataset.rewrite_without(shard, shard + ".idx", target, {"s_1"}, b"placeholder", source)
    assert os.listdir(out) == []  # no temp copy, no half-written target
    disk_full(None)
    webdataset.rewrite_without(shard, shard + ".idx", target, {"s_1"}, b"placeholder", source)
    assert sorted(os.listdir(out)) == ["copy.tar", "copy.tar.idx"]
    with tarfile.open(target) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert members == {"s_0.jpg": jpeg_bytes(0), "s_0.cls": b"0", "s_1.jpg": b"placeholder",
                       "s_1.cls": str(EXCLUDED_LABEL).encode(), "s_2.jpg": jpeg_bytes(2), "s_2.cls": b"2"}


def test_an_index_read_for_another_label_extension_names_the_sample(tmp_path):
    """Samples indexed with .cls labels, read with label_ext="txt": sample_refs names the first
    sample and its members, never hands out a None ref."""
    path = str(tmp_path / "s.tar")
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        webdataset.add_member(tar, "a_0.jpg", jpeg_bytes(3))
        webdataset.add_member(tar, "a_0.cls", b"3")
    webdataset.build_index(path, path + ".idx")
    source = SimpleNamespace(kind="webdataset", location=path, files=[path], index_files=[path + ".idx"],
                             label_ext="txt", keys=TFRecordKeys())
    assert [r.key for r in webdataset.sample_refs(SimpleNamespace(**{**vars(source), "label_ext": "cls"}))] == ["a_0"]
    with pytest.raises(DatasetError, match=r"s\.tar#a_0: no image or no \.txt member \(members: jpg, cls\)\. "
                                           r"Pass the label extension"):
        webdataset.sample_refs(source)
