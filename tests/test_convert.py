"""Converters: shuffled across shards, balanced, deterministic, complete."""

import glob
import io
import json
import os

from dali_pipes import AugmentConfig, open_source
from dali_pipes.tools.convert import write_tfrecords, write_webdataset

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


def _listing(out) -> list[str]:
    return sorted(os.listdir(out))


def test_converting_again_into_a_folder_is_refused_and_overwrite_replaces_the_old_set(tmp_path, capsys):
    """Issue 24: convert OUT --shards 6, then --shards 4, left both sets: OUT read twice the samples and verify
    found nothing wrong. The second conversion is refused naming OUT and what it holds; --overwrite removes the
    old set first (shards of either format, .idx, classes.json, manifest.json), so OUT holds the new set alone."""
    import pytest

    from dali_pipes.errors import DatasetError
    from dali_pipes.tools.cli import main
    from dali_pipes.tools.verify import verify
    write_folder(str(tmp_path / "images"), counts=(4, 3, 5))
    source, out = open_source(str(tmp_path / "images")), str(tmp_path / "out")
    write_tfrecords(source, out, shards=6, progress=False)
    before = {n: os.path.getmtime(os.path.join(out, n)) for n in os.listdir(out)}
    with pytest.raises(DatasetError, match=rf"^{out}: not empty: holds an earlier conversion \(classes.json, "
                                           r"manifest.json, train-00000-of-00006.tfrecord, "
                                           r"train-00001-of-00006.tfrecord, \.\.\. \(14 in all\)\); .* "
                                           r"Pass --overwrite \(overwrite=True\)"):
        write_tfrecords(source, out, shards=4, progress=False)
    with pytest.raises(SystemExit, match=rf"^error: {out}: not empty: holds an earlier conversion"):
        main(["convert", "webdataset", str(tmp_path / "images"), out, "--shards", "4", "--workers", "1", "--prefix",
              "train"])
    assert {n: os.path.getmtime(os.path.join(out, n)) for n in os.listdir(out)} == before  # untouched
    assert main(["convert", "webdataset", str(tmp_path / "images"), out, "--shards", "4", "--workers", "1",
                 "--prefix", "train", "--overwrite"]) == 0
    assert _listing(out) == ["classes.json", "manifest.json"] + [f"train-{i:05d}-of-00004.tar{idx}"
                                                                 for i in range(4) for idx in ("", ".idx")]
    assert open_source(out).num_samples == 12 and verify(out, progress=False).ok
    assert json.load(open(os.path.join(out, "classes.json")))["samples_per_shard"] == [3, 3, 3, 3]
    capsys.readouterr()


def test_overwrite_keeps_other_prefixes_and_never_removes_files_no_conversion_wrote(tmp_path):
    """train and val converted into one folder both stay (the manifest lists both); --overwrite of train leaves
    val. A file no conversion wrote is refused, named, with --overwrite too, and left where it is."""
    import pytest

    from dali_pipes.errors import DatasetError
    write_folder(str(tmp_path / "images"), counts=(4, 3, 5))
    source, out = open_source(str(tmp_path / "images")), str(tmp_path / "both")
    write_tfrecords(source, out, shards=2, prefix="train", progress=False)
    write_tfrecords(source, out, shards=1, prefix="val", progress=False)
    write_tfrecords(source, out, shards=3, prefix="train", overwrite=True, progress=False)
    expected = [f"train-{i:05d}-of-00003.tfrecord" for i in range(3)] + ["val-00000-of-00001.tfrecord"]
    assert [n for n in _listing(out) if n.endswith(".tfrecord")] == expected
    assert open_source(os.path.join(out, "train-*")).num_samples == 12
    assert open_source(os.path.join(out, "val-*")).num_samples == 12
    (tmp_path / "both" / "notes.md").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(DatasetError, match=rf"^{out}: not empty: holds 1 files or folders that no conversion "
                                               r"with prefix 'train' wrote \(notes.md\)\. .* move them away"):
            write_tfrecords(source, out, shards=2, overwrite=overwrite, progress=False)
    assert (tmp_path / "both" / "notes.md").read_text() == "mine"
    with pytest.raises(DatasetError, match=r"images: not empty: holds 3 files or folders .* \(cat, dog, fish\)"):
        write_tfrecords(source, str(tmp_path / "images"), shards=2, overwrite=True, progress=False)


def test_the_manifest_lists_the_box_around_each_shards_images_and_a_source_reads_it(jpeg_folder, tmp_path):
    """The GPU decoders preallocate for the data's largest images where the data says (graph.decoder_size_hint):
    convert writes each shard's box (width, height) into the manifest; an image folder lists none."""
    import PIL.Image

    from dali_pipes.run.pipeline import sized_to_data
    from dali_pipes.tools.convert import write_webdataset

    def box(source):
        sizes = [PIL.Image.open(io.BytesIO(s.data)).size for s in source.iter_samples()]
        return max(w for w, _ in sizes), max(h for _, h in sizes)

    for write in (write_tfrecords, write_webdataset):
        out = tmp_path / write.__name__
        write(open_source(jpeg_folder), str(out), shards=3, progress=False)
        shards = json.load(open(out / "manifest.json"))["shards"]
        for shard in shards:
            assert tuple(shard["largest"]) == box(open_source(str(out / shard["name"])))
        assert open_source(str(out)).largest_image == box(open_source(jpeg_folder)) == (50, 31)
        assert sized_to_data(AugmentConfig(), open_source(str(out))).decoder_size_hint == (50, 31)
    assert open_source(jpeg_folder).largest_image is None  # every header read at open: not cheap for ImageNet
    assert sized_to_data(AugmentConfig(), open_source(jpeg_folder)).decoder_size_hint is None
    given = AugmentConfig(decoder_size_hint=(0, 0))
    assert sized_to_data(given, open_source(str(tmp_path / "write_tfrecords"))) is given  # the flag wins


def test_the_prefix_defaults_to_the_source_folders_name(tmp_path, capsys):
    """Issue 32: `dali-pipes convert` named a val split's shards train-* unless told --prefix; now the source
    folder's name (data/val -> val-*), so train and val converted into one folder keep apart."""
    from dali_pipes.tools.cli import main
    for split in ("train", "val"):
        write_folder(str(tmp_path / "data" / split), counts=(2, 1, 1))
        assert main(["convert", "tfrecord", str(tmp_path / "data" / split), str(tmp_path / "tfr"), "--shards", "1",
                     "--workers", "1"]) == 0
    assert [n for n in _listing(tmp_path / "tfr") if n.endswith(".tfrecord")] == \
        ["train-00000-of-00001.tfrecord", "val-00000-of-00001.tfrecord"]
    assert main(["convert", "tfrecord", str(tmp_path / "data" / "val"), str(tmp_path / "tfr"), "--shards", "1",
                 "--workers", "1", "--prefix", "heldout"]) == 0
    assert "heldout-00000-of-00001.tfrecord" in _listing(tmp_path / "tfr")
    capsys.readouterr()
