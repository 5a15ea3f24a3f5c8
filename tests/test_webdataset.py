"""formats/webdataset.py: tar members grouped into samples by key, labels parsed, indexes in DALI's v1.2 form."""

import tarfile

import pytest

from dali_pipes.errors import DatasetError
from dali_pipes.formats import webdataset

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
