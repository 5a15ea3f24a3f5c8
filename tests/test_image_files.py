"""formats/image_files.py: image folders and file lists, listed without the library's other parts."""

import os

import pytest

from dali_pipes.data.formats.image_files import list_folder, read_file_list, read_sample
from dali_pipes.data.samples import SampleRef
from dali_pipes.errors import DatasetError

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


# ---------------------------------------------------------------------------------------------
# Issue 19: labels, repeats and unreadable class folders are named at open, never passed on silently
# ---------------------------------------------------------------------------------------------

def test_file_list_label_negative_or_above_the_classes_is_named_by_line(tmp_path):
    from dali_pipes import DaliLoader, open_source
    from dali_pipes.errors import LabelError
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.jpg").write_bytes(b"x")
    (tmp_path / "neg.txt").write_text("a.jpg 0\nb.jpg -3\n")
    with pytest.raises(LabelError, match=r"neg.txt:2: label -3 is negative"):
        read_file_list(str(tmp_path / "neg.txt"))
    (tmp_path / "seven.txt").write_text("a.jpg 0\nb.jpg 1\nc.jpg 7\n")
    assert read_file_list(str(tmp_path / "seven.txt"))[1] == [0, 1, 7]  # no class count known: 8 classes it is
    (tmp_path / "classes.json").write_text('{"classes": ["x", "y", "z"]}')
    with pytest.raises(LabelError, match=r"seven.txt:3: label 7 is not below the 3 classes of .*classes.json"):
        open_source(str(tmp_path / "seven.txt"))
    with pytest.raises(LabelError, match=r"seven.txt:3"):
        DaliLoader(str(tmp_path / "seven.txt"), batch_size=2, device="cpu")


def test_a_sample_listed_twice_is_refused_naming_both_lines_or_warned_with_allow_duplicates(tmp_path):
    from dali_pipes import DaliLoader, open_source

    from conftest import jpeg_bytes
    for i in range(4):
        (tmp_path / f"{i}.jpg").write_bytes(jpeg_bytes(i))
    (tmp_path / "list.txt").write_text("0.jpg 0\n1.jpg 1\n# a comment\n2.jpg 2\n./1.jpg 1\n3.jpg 3\n")
    with pytest.raises(DatasetError, match=r"list.txt:5: .*1.jpg is listed twice, first at .*list.txt:2.*"
                                           r"--allow-duplicates"):
        open_source(str(tmp_path / "list.txt"))
    with pytest.warns(UserWarning, match=r"list.txt:5: .*1.jpg is listed twice, first at .*list.txt:2"):
        source = open_source(str(tmp_path / "list.txt"), allow_duplicates=True)
    assert source.labels == [0, 1, 2, 1, 3]
    with pytest.warns(UserWarning, match="listed twice"):
        loader = DaliLoader(str(tmp_path / "list.txt"), batch_size=5, train=False, device="cpu", image_size=16,
                            allow_duplicates=True, val_padding="none")
    assert sorted(l for _, labels in loader for l in labels.tolist()) == [0, 1, 1, 2, 3]  # read as often as listed
    loader.close()


def test_a_class_entry_that_is_a_dangling_link_is_named_or_warned_of(tmp_path):
    """Fails as root too (chmod does not stop root): a class folder's link whose target is gone."""
    root = tmp_path / "images"
    write_folder(str(root), counts=(2, 1, 3))
    os.symlink(tmp_path / "gone", root / "bird")  # sorts first: a vanished class would shift every label
    with pytest.raises(DatasetError, match=r"images/bird: a dangling link .* taken for a class folder.*--skip-bad"):
        list_folder(str(root))
    with pytest.warns(UserWarning, match=r"images/bird: a dangling link"):
        files, labels, classes = list_folder(str(root), skip_bad=True)
    assert classes == ["bird", *CLASSES] and sorted(set(labels)) == [1, 2, 3]  # the class stays, labels do not shift


def test_an_image_that_is_a_dangling_link_is_named_or_excluded(tmp_path):
    from dali_pipes import DaliLoader, open_source
    root = tmp_path / "images"
    write_folder(str(root), counts=(2, 1, 3))
    os.symlink(tmp_path / "gone.jpg", root / CLASSES[1] / "lost.jpg")
    with pytest.raises(DatasetError, match=rf"{CLASSES[1]}/lost.jpg: unreadable \(a dangling link\)"):
        open_source(str(root))
    with pytest.warns(UserWarning, match=r"excluding a bad sample: .*lost.jpg: unreadable"):
        loader = DaliLoader(str(root), batch_size=7, train=False, device="cpu", image_size=16, skip_bad=True,
                            val_padding="none")
    assert sorted(l for _, labels in loader for l in labels.tolist() if l >= 0) == [0, 0, 1, 2, 2, 2]
    loader.close()


@pytest.mark.skipif(os.geteuid() == 0,
                    reason="root reads a chmod 000 folder anyway (the dangling-link test covers root)")
def test_an_unreadable_class_folder_is_named_not_taken_for_empty(tmp_path):
    root = tmp_path / "images"
    write_folder(str(root), counts=(2, 1, 3))
    os.chmod(root / CLASSES[1], 0)
    try:
        with pytest.raises(DatasetError, match=rf"images/{CLASSES[1]}: a class folder that cannot be listed"):
            list_folder(str(root))
        with pytest.warns(UserWarning, match="cannot be listed"):
            _, labels, classes = list_folder(str(root), skip_bad=True)
        assert classes == list(CLASSES) and 1 not in labels
    finally:
        os.chmod(root / CLASSES[1], 0o755)


def test_an_image_ref_without_its_label_is_refused(tmp_path):
    """An image file says nothing of its label: a SampleRef made without one is refused by name,
    rather than read as a Sample labelled None."""
    (tmp_path / "a.jpg").write_bytes(b"jpeg")
    assert read_sample(SampleRef("folder", str(tmp_path / "a.jpg"), label=2)).label == 2
    with pytest.raises(ValueError, match=r"a\.jpg: an image file's SampleRef needs its label"):
        read_sample(SampleRef("folder", str(tmp_path / "a.jpg")))
