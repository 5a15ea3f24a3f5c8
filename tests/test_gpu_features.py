"""Issue 33's GPU features, each once, as one short test run on "cpu" and on "gpu" (`-m gpu`, skipped without
CUDA): the same code on either device, so the CPU variant proves the test's logic in every run and the GPU
variant, run by the prepared device run's gpu-tests step (dali_pipes_bench/gpu_session.py, whose `features`
step maps each feature to its test here), proves the feature on the device.

Each checks an outcome exactly: counts, labels, shapes, dtype and device of the outputs, and equality with a
reference where one exists. Mixup / CutMix on the device (targets rows sum to 1, class sums the class counts);
random erasing (one exact square of the fill per image); AugMix (the plain run's labels, other pixels); the val
cache (its replayed epochs are today's batches); a drawn WeightedRandomSampler (DataLoader's order); a
progressive-resizing size change (the new size, the run at that size); hybrid decode (the CPU graph's batches);
Parquet and the s3 shard cache feeding the decode (the same batches as the same images read from local files);
a mid-epoch resume (the uninterrupted run's remaining batches); hw_decoder_load="auto" (searched on a GPU's mixed
decoder only, the batches of the choice fixed)."""

from __future__ import annotations

import collections

import pytest
import torch

from dali_pipes import DaliLoader, open_source
from dali_pipes.data.formats import tfrecord

from conftest import assert_placed, jpeg_bytes, write_numbered

pytest_plugins = ["s3_server"]  # fixtures: s3 (a bucket on a local moto server)

N = 14  # images, label i = sample i: a label names its sample; 14 is no multiple of the batch (4)
BATCH = 4
DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
# on CPU every comparison is exact; on a GPU the images of two graphs that differ only where a GPU resizes or
# normalises may differ by rounding: at most 2 levels of 255, in normalised units (the smallest std, 0.224)
ROUNDING = {"cpu": 0.0, "gpu": 2 / (255 * 0.224)}


def kw(device: str, **more) -> dict:
    return {"batch_size": BATCH, "image_size": 16, "device": device, "num_threads": 1, "seed": 5,
            "shuffle_buffer": 8, **more}


def batches(loader, epochs: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every batch of `epochs` epochs, each checked on the loader's device: images float32 (N, 3, H, W)."""
    out = []
    for _ in range(epochs):
        for images, labels in loader:
            assert_placed((images, labels), host_outputs=(0, 1) if loader.device == "cpu" else ())
            assert images.dtype == torch.float32 and images.dim() == 4 and images.shape[1] == 3
            out.append((images.clone(), labels.clone()))
    return out


def assert_same(got, expected, tolerance: float = 0.0) -> None:
    """The same batches: labels exactly, images exactly (within `tolerance`, a GPU's rounding)."""
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in expected]
    for (x, _), (e, _) in zip(got, expected):
        assert x.shape == e.shape and x.device == e.device
        assert (x - e).abs().max().item() <= tolerance


def labels_of(got) -> list[int]:
    return [y for _, labels in got for y in labels.tolist()]


@pytest.fixture(scope="module")
def numbered_list(tmp_path_factory) -> str:
    return write_numbered(str(tmp_path_factory.mktemp("numbered")), N)


# ---------------------------------------------------------------------------------------------
# Batch transforms and augmentations on the device
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_mixup_cutmix_on_the_device(numbered_list, device, torchvision):
    """The references' Mixup / CutMix collate_fn, translated and run on the loader's device: one-hot targets
    mixed, each row summing to 1, each class's sum its count (a sample is mixed with one of its batch)."""
    from torch.utils.data import default_collate
    from torchvision.transforms import v2
    mixup_cutmix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=N), v2.CutMix(alpha=1.0, num_classes=N)])
    loader = DaliLoader(numbered_list, train=True, collate_fn=lambda b: mixup_cutmix(*default_collate(b)),
                        **kw(device))
    got = batches(loader, epochs=2)
    assert len(got) == 2 * (N // BATCH) and all(y.shape == (BATCH, N) for _, y in got)
    targets = torch.cat([y for _, y in got]).cpu()
    assert targets.dtype == torch.float32 and torch.allclose(targets.sum(1), torch.ones(len(targets)))
    assert (targets.max(1).values < 1).any()  # mixed rows among them
    plain = DaliLoader(numbered_list, train=True, **kw(device))  # the same samples, unmixed
    drawn = collections.Counter(labels_of(batches(plain, epochs=2)))
    assert torch.allclose(targets.sum(0), torch.tensor([float(drawn[c]) for c in range(N)]), atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_random_erasing_on_the_device(numbered_list, device):
    """random_erasing=1 with a fixed area (1/4) and ratio (1): every image has exactly one 8 x 8 square of the
    fill (0 in all 3 channels, which a normalised uint8 pixel never is) and nothing else of it."""
    loader = DaliLoader(numbered_list, train=True, random_erasing=1.0, random_erasing_area=(0.25, 0.25),
                        random_erasing_ratio=(1.0, 1.0), **kw(device))
    got = batches(loader)
    assert len(got) == N // BATCH
    for images, _ in got:
        for image in images.cpu():
            erased = (image == 0).all(0)
            rows, cols = erased.any(1).nonzero().flatten(), erased.any(0).nonzero().flatten()
            assert erased.sum() == 64 and rows.numel() == cols.numel() == 8
            assert rows[-1] - rows[0] == cols[-1] - cols[0] == 7  # one square, not scattered pixels


@pytest.mark.parametrize("device", DEVICES)
def test_augmix_on_the_device(numbered_list, device):
    """auto_augment="augmix": the plain run's samples in its order (the reader draws alike), images of its
    shape and range (AugMix mixes uint8 images) but other pixels."""
    plain = batches(DaliLoader(numbered_list, train=True, **kw(device)))
    mixed = batches(DaliLoader(numbered_list, train=True, auto_augment="augmix", augmix_width=1, augmix_depth=1,
                               **kw(device)))  # one chain of one step: a small graph, built in seconds
    assert [y.tolist() for _, y in mixed] == [y.tolist() for _, y in plain]
    assert all(x.shape == (BATCH, 3, 16, 16) for x, _ in mixed)
    low, high = (0 - 0.485) / 0.229, (1 - 0.406) / 0.225  # normalised uint8's bounds
    assert all(x.min() >= low - 1e-4 and x.max() <= high + 1e-4 for x, _ in mixed)
    assert any(not torch.equal(x, p) for (x, _), (p, _) in zip(mixed, plain))


# ---------------------------------------------------------------------------------------------
# Loader features around the graph
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_val_cache_in_device_memory(numbered_list, device):
    """Val epochs 2 and 3 come from the cache (in the device's memory) and are today's batches."""
    cached = DaliLoader(numbered_list, train=False, val_cache_bytes=10 ** 7, **kw(device))
    today = DaliLoader(numbered_list, train=False, **kw(device))
    for _ in range(3):
        assert_same(batches(cached), batches(today), tolerance=1e-5)  # torch's normalisation against DALI's
    view = cached.stats()["val_cache"]
    assert view["state"] == "filled" and view["epochs_replayed"] == 2


@pytest.mark.parametrize("device", DEVICES)
def test_drawn_sampler_feeds_the_graph_in_dataloaders_order(numbered_list, device):
    """A WeightedRandomSampler's draw (repeats and all) is what the graph reads, in DataLoader's order:
    sample i has label i, so the labels are the sampler's indices, epoch after epoch."""
    from torch.utils.data import WeightedRandomSampler
    sampler = lambda: WeightedRandomSampler(torch.linspace(0.1, 2.0, N), 18,
                                            generator=torch.Generator().manual_seed(7))
    loader = DaliLoader(numbered_list, sampler=sampler(), train=True, drop_last=False, **kw(device))
    reference = sampler()
    for _ in range(2):
        drawn = list(reference)
        got = batches(loader)
        assert [len(y) for _, y in got] == [4, 4, 4, 4, 2] and labels_of(got) == drawn
    assert loader.stats()["sampler"] == {"sampler": "WeightedRandomSampler", "drawn": 18}


@pytest.mark.parametrize("device", DEVICES)
def test_progressive_resizing_size_change_rebuilds(numbered_list, device):
    """image_size {0: 16, 1: 24}: epoch 0 at 16 px, then a rebuild, and epoch 1 is a 24 px run's epoch 1."""
    scheduled = DaliLoader(numbered_list, train=True, **kw(device, image_size={0: 16, 1: 24}))
    first, second = batches(scheduled), batches(scheduled)
    assert {x.shape for x, _ in first} == {(BATCH, 3, 16, 16)} and {x.shape for x, _ in second} == {(BATCH, 3, 24, 24)}
    assert scheduled.image_size == 24 and "rebuild" in {e[0] for e in scheduled.stats()["events"]}
    at_24 = DaliLoader(numbered_list, train=True, **kw(device, image_size=24))
    batches(at_24)
    assert_same(second, batches(at_24))


@pytest.mark.parametrize("device", DEVICES)
def test_hybrid_decode_gives_the_cpu_graphs_batches(numbered_list, device):
    """decode_device="cpu": libjpeg-turbo decodes, the rest runs on `device`; val's batches are the CPU
    graph's (labels exactly; pixels up to the GPU resize's rounding)."""
    hybrid = batches(DaliLoader(numbered_list, train=False, decode_device="cpu", **kw(device)))
    on_cpu = batches(DaliLoader(numbered_list, train=False, **kw("cpu")))
    assert len(hybrid) == -(-N // BATCH) and labels_of(hybrid) == list(range(N))
    assert_same([(x.cpu(), y.cpu()) for x, y in hybrid], on_cpu, ROUNDING[device])


@pytest.mark.parametrize("device", DEVICES)
def test_mid_epoch_resume(numbered_list, device):
    """A state taken after 2 batches, loaded into a new loader: the uninterrupted run's remaining batches of
    this epoch and the next, images and labels exactly."""
    whole = batches(DaliLoader(numbered_list, train=True, **kw(device)), epochs=2)
    interrupted = DaliLoader(numbered_list, train=True, **kw(device))
    it = iter(interrupted)
    head = [next(it), next(it)]
    state = interrupted.state_dict()
    resumed = DaliLoader(numbered_list, train=True, **kw(device))
    resumed.load_state_dict(state)
    rest = batches(resumed, epochs=2)
    assert len(head) + len(rest) == len(whole) == 2 * (N // BATCH)
    assert_same([(x.clone(), y.clone()) for x, y in head] + rest, whole)


# ---------------------------------------------------------------------------------------------
# Data from Parquet and from s3 through the shard cache, decoded on the device
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_parquet_feeds_the_decode(numbered_list, tmp_path, device):
    """A Parquet file (pyarrow: a binary image column, an int label) of the numbered images: its val batches
    are the file list's, image for image."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    images = [jpeg_bytes(i, 24 + i % 5, 32) for i in range(N)]  # write_numbered's images
    pq.write_table(pa.table({"image": pa.array(images, pa.binary()), "label": pa.array(range(N), pa.int32())}),
                   str(tmp_path / "train.parquet"), row_group_size=5)
    got = batches(DaliLoader(str(tmp_path / "train.parquet"), train=False, **kw(device)))
    assert labels_of(got) == list(range(N))
    assert_same(got, batches(DaliLoader(numbered_list, train=False, **kw(device))))


@pytest.fixture
def bucket(request):
    """The s3 fixture (a bucket on a local moto server), or a skip where moto or boto3 is missing (a device
    run packed --without tests): checked before the session's server would fail to start."""
    pytest.importorskip("boto3", reason="s3:// support needs boto3: pip install '.[s3]' (from the dali_pipes checkout)")
    pytest.importorskip("moto.server", reason="the S3 tests need a local S3 server: pip install 'moto[server]'")
    return request.getfixturevalue("s3")


@pytest.mark.parametrize("device", DEVICES)
def test_s3_shard_cache_feeds_the_decode(numbered_list, bucket, tmp_path, monkeypatch, device):
    """TFRecord shards in a bucket, fetched to local files by the shard cache (the default remote feed) and
    read by DALI from there: their val batches are those of the same shards on local disk, image for image."""
    s3 = bucket
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    local = tmp_path / "local"
    local.mkdir()
    shards = [[] for _ in range(3)]
    for i in range(N):
        shards[i % 3].append(tfrecord.frame_record(tfrecord.encode_example(
            {"image/encoded": jpeg_bytes(i, 24 + i % 5, 32), "image/class/label": i})))
    for s, records in enumerate(shards):
        name = f"train-{s:05d}-of-00003"
        (local / name).write_bytes(b"".join(records))
        s3.put(f"train/{name}", b"".join(records))
    remote = DaliLoader(s3.url("train/"), train=False, remote_feed="cache", **kw(device))
    try:
        got = batches(remote)
        assert sorted(labels_of(got)) == list(range(N)) and remote.source.location.startswith("s3://")
        assert_same(got, batches(DaliLoader(open_source(str(local)), train=False, **kw(device))))
    finally:
        remote.close()


# ---------------------------------------------------------------------------------------------
# hw_decoder_load="auto"
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_hw_decoder_load_auto(tmp_path, monkeypatch, device):
    """hw_decoder_load="auto" from an empty tuning memory: the tuner tries settings by rebuilding the graph;
    the load is searched on a GPU's mixed decoder (and remembered), never on a CPU decode; the batches are a
    loader's with the chosen values fixed (labels exactly; on a GPU pixels up to the decoders' rounding, as the
    trials before the choice decoded at other loads)."""
    from dali_pipes.run import tuning
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    source = open_source(write_numbered(str(tmp_path), 240))
    common = dict(batch_size=2, image_size=16, device=device, train=True, seed=3, shuffle_buffer=16)
    auto = DaliLoader(source, hw_decoder_load="auto", **common)
    got = batches(auto)
    view = auto.stats()["tuned"]
    assert view["done"] and len(view["trials"]) >= 2 and "rebuild" in {e[0] for e in auto.stats()["events"]}
    chosen = view["chosen"]
    loads = {t.get("hw_decoder_load") for t in view["trials"]}
    if device == "gpu":
        assert len(loads) >= 2 and chosen["hw_decoder_load"] in tuning.HW_LOADS, view
    else:
        assert loads == {None} and "hw_decoder_load" not in chosen, view
    fixed = DaliLoader(source, num_threads=chosen["num_threads"], prefetch_queue_depth=chosen["prefetch_queue_depth"],
                       hw_decoder_load=chosen.get("hw_decoder_load", 0.65),
                       **common)
    expected = batches(fixed)
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in expected]
    if device == "cpu":
        assert_same(got, expected)
    else:  # the decoders' rounding between loads (tests/test_tuning.py measures it): mean under 2 levels
        levels = torch.cat([(x - e).abs().flatten() for (x, _), (e, _) in zip(got, expected)]) * 255 * 0.225
        assert levels.mean() < 2
