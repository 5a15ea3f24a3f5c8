"""formats/image_files.py: image folders and file lists, listed without the library's other parts."""

import os

import pytest

from dali_pipes.errors import DatasetError
from dali_pipes.formats.image_files import list_folder, read_file_list

from conftest import CLASSES, write_folder


def test_folder_classes_are_sorted_names_and_labels_follow(tmp_path):
    expected = write_folder(str(tmp_path / "images"), counts=(2, 1, 3))
    os.makedirs(tmp_path / "images" / "zebra")  # an empty class keeps its label: later labels do not shift
    files, labels, classes = list_folder(str(tmp_path / "images"))
    assert classes == [*CLASSES, "zebra"] and dict(zip(files, labels)) == expected


def test_file_list_lines_are_checked_and_named(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"x")
    (tmp_path / "list.txt").write_text("a.jpg 3\n# a comment\n\n")
    assert read_file_list(str(tmp_path / "list.txt")) == ([str(tmp_path / "a.jpg")], [3])
    (tmp_path / "bad.txt").write_text("a.jpg 3\na.jpg three\n")
    with pytest.raises(DatasetError, match="bad.txt:2: expected 'relative/path label'"):
        read_file_list(str(tmp_path / "bad.txt"))
    (tmp_path / "out.txt").write_text("../elsewhere.jpg 1\n")
    with pytest.raises(DatasetError, match="outside the list's folder"):
        read_file_list(str(tmp_path / "out.txt"))
    (tmp_path / "missing.txt").write_text("gone.jpg 1\n")
    with pytest.raises(FileNotFoundError, match="missing.txt:1"):
        read_file_list(str(tmp_path / "missing.txt"))
