"""formats/webdataset.py: tar members grouped into samples by key, labels parsed, indexes in DALI's v1.2 form."""

import os
import tarfile
from types import SimpleNamespace

import pytest

from dali_pipes.data.formats import webdataset
from dali_pipes.data.labels import EXCLUDED_LABEL
from dali_pipes.data.samples import SampleKeys
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
                             label_ext="txt", keys=SampleKeys())
    assert [r.key for r in webdataset.sample_refs(SimpleNamespace(**{**vars(source), "label_ext": "cls"}))] == ["a_0"]
    with pytest.raises(DatasetError, match=r"s\.tar#a_0: no image or no \.txt member \(members: jpg, cls\)\. "
                                           r"Pass the label extension"):
        webdataset.sample_refs(source)


# ---------------------------------------------------------------------------------------------
# Issue 32: member names with spaces (legal in tar and in webdataset) in DALI's whitespace-split index
# ---------------------------------------------------------------------------------------------

SPACED = ("a cat 0", "b\tdog 1", "c_50%20off", "d_plain")  # a space, a tab, a literal "%20", none


def _spaced_shard(folder) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "s.tar")
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for label, key in enumerate(SPACED):
            webdataset.add_member(tar, f"{key}.jpg", jpeg_bytes(label))
            webdataset.add_member(tar, f"{key}.cls", str(label).encode())
    return path


def test_an_index_of_members_with_spaces_reads_back_as_written(tmp_path):
    path = _spaced_shard(tmp_path)
    samples = webdataset.build_tar_index(path)
    webdataset.write_tar_index(samples, path + ".idx")
    lines = open(path + ".idx").read().splitlines()
    assert all(len(line.split()) == 8 for line in lines[1:])  # ext offset size name, twice: one token each
    assert "a%20cat%200.jpg" in lines[1] and "c_50%2520off.jpg" in lines[3]
    assert webdataset.read_tar_index(path + ".idx") == samples
    assert webdataset.tar_index_matches(path, path + ".idx")


def test_members_with_spaces_are_indexed_read_and_verified(tmp_path, capsys):
    """`dali-pipes index` wrote an index it could not read back (invalid literal for int()), the loader failed
    with a bare ValueError, verify found no problem: each sample is now read, with its label."""
    from dali_pipes import DaliLoader
    from dali_pipes.tools.cli import main
    from dali_pipes.tools.verify import verify
    folder = str(tmp_path / "shards")
    _spaced_shard(folder)
    assert main(["index", folder]) == 0
    assert "s.tar: 4 samples" in capsys.readouterr().out
    loader = DaliLoader(folder, batch_size=2, train=False, device="cpu", image_size=16, num_threads=1)
    assert sorted(label for _, labels in loader for label in labels.tolist()) == [0, 1, 2, 3]
    report = verify(folder, progress=False)
    assert (report.checked, report.problems) == (4, [])
