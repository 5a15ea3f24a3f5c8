"""DaliLoader on CPU with real DALI: outputs against a PIL/numpy reference, exact epochs per rank
for world sizes 1-4, resume equality, determinism, errors, and no leaks."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from dali_pipes import DaliLoader, open_source
from dali_pipes.graph.augment_config import IMAGENET_MEAN, IMAGENET_STD

from conftest import assert_placed

N = 23  # does not divide by 2, 3 or 4




def loaders(source, world_size, **kw):
    kw = {"batch_size": 3, "image_size": 16, "device": "cpu", "num_threads": 1, **kw}
    return [DaliLoader(source, rank=r, world_size=world_size, **kw) for r in range(world_size)]


def epoch_labels(loader):
    return [labels.tolist() for _, labels in loader]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_val_label_padding_yields_every_sample_exactly_once_across_ranks(numbered_source, world_size):
    ranks = loaders(numbered_source, world_size, train=False, val_padding="label")
    assert len({len(l) for l in ranks}) == 1  # equal batch counts, else DDP hangs
    for _ in range(2):  # and again the next epoch
        real = []
        for loader in ranks:
            batches = epoch_labels(loader)
            assert len(batches) == len(loader) and all(len(b) == 3 for b in batches)
            real += [l for b in batches for l in b if l >= 0]
        assert sorted(real) == list(range(N))
    assert sum(l.samples_per_epoch for l in ranks) == N


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_train_reads_each_sample_at_most_once_per_epoch(numbered_source, world_size):
    ranks = loaders(numbered_source, world_size, train=True, shuffle_buffer=8)
    expected_batches = (N // world_size) // 3
    seen_over_epochs = set()
    for _ in range(3):
        labels = []
        for loader in ranks:
            batches = epoch_labels(loader)
            assert len(batches) == len(loader) == expected_batches
            labels += [l for b in batches for l in b]
        assert len(labels) == len(set(labels)) == world_size * expected_batches * 3
        assert min(labels) >= 0
        seen_over_epochs |= set(labels)
    assert len(seen_over_epochs) > world_size * expected_batches * 3  # shards rotate / reshuffle


def test_outputs_shape_dtype_range_and_layouts(numbered_source):
    loader = DaliLoader(numbered_source, batch_size=4, train=True, device="cpu", image_size=16)
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 16, 16) and images.dtype == torch.float32 and images.device.type == "cpu"
    assert labels.shape == (4,) and labels.dtype == torch.int64
    lo = min((0 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
    hi = max((1 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
    assert lo - 1e-4 <= images.min() and images.max() <= hi + 1e-4
    assert images.cuda(non_blocking=True).shape if torch.cuda.is_available() else True
    half = DaliLoader(numbered_source, batch_size=4, train=False, device="cpu", image_size=16, channels_last=True,
                      float16=True)
    images, _ = next(iter(half))
    assert images.shape == (4, 3, 16, 16) and images.dtype == torch.float16
    assert images.is_contiguous(memory_format=torch.channels_last)


def _reference_val(data, size=16, crop_ratio=0.875):
    """Independent reference: PIL decode, antialiased bilinear resize of the shorter side,
    centre crop, ImageNet normalisation."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    short = round(size / crop_ratio)
    w, h = img.size
    new = (short, round(h * short / w)) if w <= h else (round(w * short / h), short)
    img = img.resize(new, Image.BILINEAR)
    left, top = round((new[0] - size) / 2), round((new[1] - size) / 2)
    pixels = np.asarray(img.crop((left, top, left + size, top + size)), np.float32) / 255
    return ((pixels - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)


def test_val_output_matches_a_pil_reference(tmp_path):
    """Smooth photographs-like images (gradients), 60-90 px, resized to 18 and cropped to 16.
    Tolerance: mean |diff| < 0.03 and max |diff| < 0.25 in normalised units (about 2 and 15
    grey levels): JPEG decoders and resize filters differ in rounding, not in content."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(6):
        h, w = rng.integers(60, 91, size=2)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        pixels = np.stack([xx / w * 200 + 20, yy / h * 180 + 30, (xx + yy) / (w + h) * 150 + 50], -1)
        Image.fromarray(pixels.astype(np.uint8)).save(tmp_path / f"{i}.jpg", quality=95)
        lines.append(f"{i}.jpg {i}\n")
    (tmp_path / "list.txt").write_text("".join(lines))
    loader = DaliLoader(str(tmp_path / "list.txt"), batch_size=6, train=False, device="cpu", image_size=16)
    images, labels = next(iter(loader))
    for image, label in zip(images.numpy(), labels.tolist()):
        ref = _reference_val((tmp_path / f"{label}.jpg").read_bytes())
        diff = np.abs(image - ref)
        assert diff.mean() < 0.03 and diff.max() < 0.25, (label, diff.mean(), diff.max())


def test_train_flips_about_half(tmp_path):
    """Left half dark, right half bright: a flipped output is bright on the left."""
    pixels = np.zeros((64, 64, 3), np.uint8)
    pixels[:, 32:] = 230
    lines = []
    for i in range(40):
        Image.fromarray(pixels).save(tmp_path / f"{i}.jpg", quality=95)
        lines.append(f"{i}.jpg 0\n")
    (tmp_path / "list.txt").write_text("".join(lines))
    loader = DaliLoader(str(tmp_path / "list.txt"), batch_size=20, train=True, device="cpu", image_size=16,
                        random_area=(0.9, 1.0), random_aspect_ratio=(1.0, 1.0), seed=1)
    flips = []
    for _ in range(10):
        for images, _ in loader:
            flips += (images[:, 0, :, :4].mean((1, 2)) > images[:, 0, :, -4:].mean((1, 2))).tolist()
    assert len(flips) == 400 and 0.4 < np.mean(flips) < 0.6


def test_same_seed_same_batches(numbered_source):
    a, b, c = (DaliLoader(numbered_source, batch_size=4, train=True, device="cpu", image_size=16, seed=s,
                          shuffle_buffer=8) for s in (3, 3, 4))
    batches = [[(x.clone(), y.clone()) for x, y in loader] for loader in (a, b, c)]
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(batches[0], batches[1]))
    assert not all(torch.equal(x1, x3) for (x1, _), (x3, _) in zip(batches[0], batches[2]))


@pytest.mark.parametrize("stop_epoch,stop_batch", [(0, 1), (0, 4), (1, 0), (1, 3)])
def test_resume_yields_exactly_the_uninterrupted_batches(numbered_source, stop_epoch, stop_batch):
    """Save after batch `stop_batch` of epoch `stop_epoch` (4 = the epoch's last: an epoch
    boundary), restore into a fresh loader: every later batch, through two more epoch
    boundaries, is identical in images and labels."""
    kw = dict(batch_size=4, train=True, device="cpu", image_size=16, seed=5, shuffle_buffer=8)
    original = DaliLoader(numbered_source, **kw)
    reference, state = [], None
    for epoch in range(3):
        for i, (images, labels) in enumerate(original):
            if state is not None:
                reference.append((images.clone(), labels.clone()))
            if (epoch, i) == (stop_epoch, stop_batch):
                state = original.state_dict()
    resumed = DaliLoader(numbered_source, **kw)
    resumed.load_state_dict(state)
    got = []
    while resumed.epoch < 3:
        got += [(x.clone(), y.clone()) for x, y in resumed]
    assert len(got) == len(reference) == 15 - (5 * stop_epoch + stop_batch + 1)
    for (x1, y1), (x2, y2) in zip(reference, got):
        assert torch.equal(y1, y2) and torch.equal(x1, x2)


def test_abandoned_epoch_is_finished_before_the_next(numbered_source):
    loader = DaliLoader(numbered_source, batch_size=3, train=False, device="cpu", image_size=16)
    first = next(iter(loader))[1].tolist()
    assert first == [0, 1, 2]
    assert epoch_labels(loader)[0] == [0, 1, 2]  # a new iter() is a new epoch from the start
    assert loader.epoch == 2


def test_stats_tell_the_seconds_from_construction_to_the_first_batch(numbered):
    """Opening the data, building the pipeline and its first decodes: what a user waits before step 1."""
    import time
    start = time.perf_counter()
    loader = DaliLoader(numbered, batch_size=4, train=True, device="cpu", image_size=16, num_threads=1)
    assert loader.stats()["first_batch_s"] is None
    batches = iter(loader)
    next(batches)
    first = loader.stats()["first_batch_s"]
    assert 0 < first <= time.perf_counter() - start
    next(batches)
    assert loader.stats()["first_batch_s"] == first  # the first batch only, never later ones


def test_len_is_stable_and_set_epoch_is_accepted(numbered_source):
    loader = DaliLoader(numbered_source, batch_size=4, train=True, device="cpu", image_size=16)
    lengths = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        lengths.append(sum(1 for _ in loader))
    assert lengths == [len(loader)] * 3 == [5] * 3
    assert loader.num_samples == N and loader.samples_per_epoch == 20


def test_a_closed_loader_says_so(numbered):
    """A loader used after close() names that, rather than failing on a None deep inside."""
    loader = DaliLoader(numbered, batch_size=4, train=True, device="cpu", image_size=16)
    loader.close()
    with pytest.raises(ValueError, match=r"the loader's pipeline is closed \(close\(\) was called\)"):
        len(loader)
    with pytest.raises(ValueError, match="the loader's pipeline is closed"):
        next(iter(loader))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(batch_size=0), ValueError, "batch_size must be a positive integer, got 0"),
    (dict(rank=2, world_size=2), ValueError, r"rank 2 is not in \[0, world_size=2\)"),
    (dict(device="tpu"), ValueError, "device must be one of .*'tpu'"),
    (dict(batch_size=24), ValueError, "less than one batch of 24 per rank"),
    (dict(auto_augment="cutmix"), ValueError, "auto_augment must be one of"),
    (dict(num_threads="4"), ValueError, "num_threads must be a count or 'auto', got '4'"),
    (dict(prefetch_queue_depth="3"), ValueError, "prefetch_queue_depth must be a count or 'auto', got '3'"),
])
def test_bad_arguments(numbered_source, kwargs, error, match):
    with pytest.raises(error, match=match):
        DaliLoader(numbered_source, **{"batch_size": 4, "train": True, "device": "cpu", **kwargs})


def test_rank_and_world_size_from_the_environment(numbered_source, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = DaliLoader(numbered_source, batch_size=3, train=False, device="cpu", image_size=16)
    assert (loader.shard.rank, loader.shard.world_size) == (1, 2)
    assert [l for b in epoch_labels(loader) for l in b if l >= 0] == list(range(11, 23))


@pytest.mark.parametrize("policy", ["autoaugment", "randaugment", "trivialaugment"])
def test_auto_augment_policies_run(numbered_source, policy):
    loader = DaliLoader(numbered_source, batch_size=4, train=True, device="cpu", image_size=16, auto_augment=policy,
                        color_jitter=0.4)
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 16, 16) and torch.isfinite(images).all()


def test_process_exits_cleanly_with_a_live_loader(numbered_source, tmp_path):
    import subprocess
    import sys
    code = ("from dali_pipes import DaliLoader\n"
            f"l = DaliLoader({numbered_source.location!r}, batch_size=3, train=True, device='cpu', image_size=16)\n"
            "next(iter(l))\nprint('ok')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


@pytest.mark.gpu
def test_gpu_and_cpu_agree_in_val(numbered_source):
    gpu = DaliLoader(numbered_source, batch_size=4, train=False, device="gpu", image_size=16)
    cpu = DaliLoader(numbered_source, batch_size=4, train=False, device="cpu", image_size=16)
    for (xg, yg), (xc, yc) in zip(gpu, cpu):
        assert_placed((xg, yg))  # labels on the GPU too
        assert_placed((xc, yc), host_outputs=(0, 1))
        assert torch.equal(yg.cpu(), yc)
        assert (xg.float().cpu() - xc).abs().mean() < 0.05  # nvJPEG vs libjpeg-turbo rounding


@pytest.mark.parametrize("fmt", ["folder", "tfrecord", "webdataset"])
def test_labels_match_the_source_for_every_format(jpeg_folder, tmp_path, fmt):
    from dali_pipes.tools.convert import write_tfrecords, write_webdataset
    location = jpeg_folder
    if fmt != "folder":
        location = str(tmp_path / fmt)
        (write_tfrecords if fmt == "tfrecord" else write_webdataset)(open_source(jpeg_folder), location, shards=2,
                                                                    progress=False)
    ranks = loaders(open_source(location), 2, train=False, batch_size=4)
    labels = sorted(l for loader in ranks for b in epoch_labels(loader) for l in b if l >= 0)
    assert labels == [0] * 4 + [1] * 3 + [2] * 5  # jpeg_folder: 4 cats, 3 dogs, 5 fish


def test_a_throwaway_iter_changes_nothing(numbered_source):
    """Frameworks probe loaders with iter() and drop it (Lightning does): a resumed loader must still
    yield exactly the rest of its epoch, and an unread iterator must not finish the epoch."""
    (loader,) = loaders(numbered_source, 1, train=True)
    first = iter(loader)
    next(first)
    state = loader.state_dict()
    rest = [labels.tolist() for _, labels in first]
    (resumed,) = loaders(numbered_source, 1, train=True)
    resumed.load_state_dict(state)
    iter(resumed)  # the probe
    assert [labels.tolist() for _, labels in resumed] == rest


def test_augment_and_augmentation_keywords_together_are_refused_before_the_data_is_opened(tmp_path):
    """Two answers to one question are refused at once: a location that does not exist is never looked at."""
    from dali_pipes import AugmentConfig
    with pytest.raises(ValueError, match="pass either augment=AugmentConfig"):
        DaliLoader(str(tmp_path / "not-there"), batch_size=2, device="cpu", augment=AugmentConfig(), color_jitter=0.4)
