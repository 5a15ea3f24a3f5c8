"""The built-in dataset: real photographs, ImageNet-like sizes, deterministic bytes."""

import importlib.util
import io
import os

import numpy as np
import pytest
from PIL import Image

from dali_pipes import open_source
from dali_pipes.tools.sample_data import PHOTOS, SampleDatasetConfig, make_image, make_sample_dataset, photo_path


def test_layout_counts_and_determinism(tmp_path):
    cfg = SampleDatasetConfig(classes=3, train_per_class=4, val_per_class=2, seed=5)
    stats = make_sample_dataset(str(tmp_path / "a"), cfg, workers=2, progress=False)
    make_sample_dataset(str(tmp_path / "b"), cfg, workers=1, progress=False)
    assert (stats["train"], stats["val"]) == (12, 6)
    train, val = open_source(str(tmp_path / "a" / "train")), open_source(str(tmp_path / "a" / "val"))
    assert (train.num_samples, val.num_samples, len(train.classes)) == (12, 6, 3)
    for path in train.files + val.files:
        assert open(path, "rb").read() == open(path.replace(f"{tmp_path}/a", f"{tmp_path}/b"), "rb").read()
    other = make_image(SampleDatasetConfig(seed=6), "train", 0, 0)
    assert other != make_image(SampleDatasetConfig(seed=5), "train", 0, 0)


def test_images_look_like_imagenet():
    cfg = SampleDatasetConfig()
    sizes, sides = [], []
    for label in range(len(PHOTOS) + 2):  # beyond the photographs: colour-cast classes
        for index in range(3):
            data = make_image(cfg, "train", label, index)
            with Image.open(io.BytesIO(data)) as img:
                assert img.format == "JPEG" and img.mode == "RGB"
                sides += [img.width, img.height]
                pixels = np.asarray(img, np.float32)
            assert pixels.std() > 10  # not flat
            sizes.append(len(data))
    assert 245 <= min(sides) and max(sides) <= 610
    assert 70_000 < np.mean(sizes) < 160_000  # ImageNet's mean is ~110 KB
    assert all(os.path.exists(photo_path(*p)) for p in PHOTOS)


def test_missing_photographs_name_the_extra(tmp_path, monkeypatch):
    """scikit-image and matplotlib are the optional extra [sample]; without them, an ImportError
    says what to install, before any folder is made or worker started."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    make_sample_dataset(str(tmp_path / "few"), SampleDatasetConfig(classes=2, train_per_class=1, val_per_class=0),
                        workers=1, progress=False)  # the first classes' photographs come from scikit-image
    with pytest.raises(ImportError, match=r"matplotlib is not installed.*pip install '\.\[sample\]' "
                                          r"\(from the dali_pipes checkout\)"):
        make_sample_dataset(str(tmp_path / "all"), SampleDatasetConfig(classes=10), progress=False)
    assert not (tmp_path / "all").exists()


@pytest.mark.parametrize("bad", [dict(classes=0), dict(val_per_class=-1), dict(min_side=700)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="need"):
        SampleDatasetConfig(**bad)


def test_sample_writes_any_size_as_a_folder_and_as_tfrecord_shards(tmp_path):
    """dali-pipes sample --train-per-class N --tfrecord-shards K (issue 28: benchmark-scale data; tiny N here):
    the same images, bytes and labels, as an image folder and as indexed TFRecord shards, for each split."""
    from dali_pipes.data.formats import read_sample
    from dali_pipes.tools.cli import main
    out = tmp_path / "bench"
    assert main(["sample", str(out), "--classes", "3", "--train-per-class", "5", "--val-per-class", "2",
                 "--tfrecord-shards", "4", "--workers", "2"]) == 0
    for split, count, shards in (("train", 15, 4), ("val", 6, 4)):
        folder, records = open_source(str(out / split)), open_source(str(out / "tfrecord" / split))
        assert (folder.kind, records.kind) == ("folder", "tfrecord")
        assert folder.num_samples == records.num_samples == count and len(records.files) == shards
        assert all(os.path.basename(f).startswith(f"{split}-") for f in records.files)
        samples = lambda source: sorted((s.label, s.data) for s in map(read_sample, source.refs()))
        assert samples(folder) == samples(records)
