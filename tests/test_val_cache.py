"""The val cache (run/val_cache.py) through real DALI on CPU: the uint8 graph normalised in torch gives today's
images; later val epochs come from the cache without decoding (the files are gone by then), with today's
batches, counts, labels and padding; a resume in an epoch given from the cache is exact; a cache over its
budget is not used, with one log line; train never caches."""

import logging
import os
import shutil

import pytest
import torch

from dali_pipes import DaliLoader, open_source
from dali_pipes.config import LoaderConfig
from dali_pipes.errors import DatasetError
from dali_pipes.run.contract import Contract

from conftest import jpeg_bytes

N = 23  # no small world size divides it: short last batches, repeats and padding everywhere
BATCH = 3
ENOUGH = 10 ** 7


def loader(source, cache=ENOUGH, **kw):
    kw = {"batch_size": BATCH, "image_size": 16, "device": "cpu", "num_threads": 1, "train": False, **kw}
    return DaliLoader(source, val_cache_bytes=cache, **kw)


def epoch(loader):
    return [(images.clone(), labels.clone()) for images, labels in loader]


def assert_same(cached, today, exact=False):
    """The same batches: labels and shapes exactly, images within float rounding (exactly, with `exact`)."""
    assert [l.tolist() for _, l in cached] == [l.tolist() for _, l in today]
    for (x, _), (y, _) in zip(cached, today):
        assert x.shape == y.shape and x.dtype == y.dtype and x.stride() == y.stride()
        assert torch.equal(x, y) if exact else (x.float() - y.float()).abs().max() <= 1e-6


@pytest.mark.parametrize("augment", [{}, {"float16": True}, {"channels_last": True}, {"mean": (0, 0, 0),
                                                                                      "std": (1, 1, 1)}],
                         ids=["float32", "float16", "channels_last", "ToTensor"])
def test_uint8_normalised_in_torch_equals_dalis_normalised_output(numbered_source, augment):
    cached, today = loader(numbered_source, **augment), loader(numbered_source, cache=0, **augment)
    for _ in range(3):  # the first epoch through DALI's uint8 graph, the next two from the cache
        assert_same(epoch(cached), epoch(today))
    assert cached.stats()["val_cache"]["epochs_replayed"] == 2 and today.stats()["val_cache"]["state"] == "off"


def test_later_val_epochs_come_from_the_cache_without_decoding(numbered, tmp_path):
    """After the first val epoch the images are overwritten with garbage of the same size and modification time
    (what the cache's check of the files cannot see): the cache's epochs are the first one's, image for image; a
    loader without the cache cannot decode them any more."""
    folder = tmp_path / "data"
    shutil.copytree(os.path.dirname(numbered), folder)
    source = open_source(str(folder / "list.txt"))
    cached, plain = loader(source), loader(source, cache=0)
    first = epoch(cached)
    for name in os.listdir(folder):
        if name.endswith(".jpg"):
            st = os.stat(folder / name)
            (folder / name).write_bytes(b"\0" * st.st_size)
            os.utime(folder / name, ns=(st.st_atime_ns, st.st_mtime_ns))
    for _ in range(2):
        assert_same(epoch(cached), first, exact=True)
    stats = cached.stats()
    assert stats["val_cache"] | {"bytes": None} == {"state": "filled", "budget_bytes": ENOUGH, "bytes": None,
                                                    "batches": 8, "epochs_replayed": 2, "needed_bytes": None}
    assert stats["val_cache"]["bytes"] >= 8 * BATCH * 3 * 16 * 16  # uint8 images, with labels and sample ids
    assert stats["batches"] == 8 and stats["images"] == N  # the clock timed the epoch given from the cache
    with pytest.raises(DatasetError, match="decoding failed"):  # DALI would have to decode them
        epoch(plain)


def test_a_val_image_changed_or_deleted_between_epochs_is_never_given_from_the_cache(numbered, tmp_path, caplog):
    """Image 1 rewritten after the first epoch: the next epoch reads it anew (the batches of a loader without the
    cache), and fills the cache again; then image 4 deleted: the error of a loader without the cache."""
    folder = tmp_path / "data"
    shutil.copytree(os.path.dirname(numbered), folder)
    source = open_source(str(folder / "list.txt"))
    cached = loader(source)
    first = epoch(cached)
    (folder / "001.jpg").write_bytes(jpeg_bytes(200, 24, 32))
    with caplog.at_level(logging.WARNING, logger="dali_pipes"):
        changed = epoch(cached)
    assert_same(changed, epoch(loader(source, cache=0)))
    assert not torch.equal(changed[0][0], first[0][0])  # image 1 is in the first batch
    assert "val cache: the val files changed since it filled" in caplog.text
    assert_same(epoch(cached), changed, exact=True)  # filled again from the new files
    assert cached.stats()["val_cache"]["epochs_replayed"] == 1
    os.remove(folder / "004.jpg")
    with pytest.raises(DatasetError, match="No such file or directory") as plain:
        epoch(loader(source, cache=0))
    with pytest.raises(DatasetError, match="No such file or directory") as from_cache:
        epoch(cached)
    assert str(from_cache.value) == str(plain.value)


@pytest.mark.parametrize("val_padding", ["repeat", "label", "none"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_batches_counts_labels_and_padding_are_todays(numbered_source, val_padding, world_size):
    for rank in range(world_size):
        kw = {"rank": rank, "world_size": world_size, "val_padding": val_padding}
        cached, today = loader(numbered_source, **kw), loader(numbered_source, cache=0, **kw)
        for _ in range(3):
            got, expected = epoch(cached), epoch(today)
            assert len(cached) == len(today) == len(got)
            assert_same(got, expected)
        assert cached.samples_per_epoch == today.samples_per_epoch
        assert cached.stats()["val_cache"]["epochs_replayed"] == 2


LONGER = {"rank": 0, "world_size": 4, "batch_size": 5, "val_padding": "none"}  # DALI's epoch: 2 batches, the rank's: 1


@pytest.mark.parametrize("kw, stop", [({}, 0), ({}, 2), ({}, 7), ({}, 8), (LONGER, 1)],
                         ids=["at the epoch's start", "mid-epoch", "before its last batch", "after its last batch",
                              "after its last batch, DALI's epoch longer"])
def test_a_state_taken_in_an_epoch_given_from_the_cache_resumes_exactly(numbered_source, kw, stop):
    first = loader(numbered_source, **kw)
    epoch(first)  # fills the cache
    batches = iter(first)  # epoch 2, from the cache
    for _ in range(stop):
        next(batches)
    state = first.state_dict()
    rest = [(x.clone(), l.clone()) for x, l in batches] + epoch(first)  # and the next epoch
    for cache in (ENOUGH, 0):  # resumed with the cache (empty: from DALI) or without it
        resumed = loader(numbered_source, cache=cache, **kw)
        resumed.load_state_dict(state)
        got = epoch(resumed) + (epoch(resumed) if stop < len(first) else [])  # the epoch's rest, the next one
        assert_same(got, rest, exact=bool(cache))


def test_a_state_of_a_loader_without_the_cache_resumes_in_one_with_it(numbered_source):
    plain = loader(numbered_source, cache=0)
    batches = iter(plain)
    for _ in range(3):
        next(batches)
    state = plain.state_dict()
    rest = [(x.clone(), l.clone()) for x, l in batches]
    resumed = loader(numbered_source)
    resumed.load_state_dict(state)
    assert_same(epoch(resumed), rest)
    assert resumed.stats()["val_cache"]["state"] == "empty"  # a resumed epoch is not whole: the next one fills
    assert_same(epoch(resumed), epoch(loader(numbered_source, cache=0)))
    assert resumed.stats()["val_cache"]["state"] == "filled"


def test_a_cache_over_its_budget_is_not_used_with_one_log_line(numbered_source, caplog):
    small = loader(numbered_source, cache=1000)
    today = loader(numbered_source, cache=0)
    with caplog.at_level(logging.WARNING, logger="dali_pipes"):
        for _ in range(3):
            assert_same(epoch(small), epoch(today))
    lines = [r.getMessage() for r in caplog.records if "val cache" in r.getMessage()]
    needed = small.stats()["val_cache"]["needed_bytes"]
    assert len(lines) == 1 and lines[0].startswith(f"val cache: not used; this rank's val epoch takes about {needed} "
                                                   f"bytes (8 batches of {needed // 8}), over val_cache_bytes=1000")
    assert small.stats()["val_cache"] | {"needed_bytes": None} == {
        "state": "over budget", "budget_bytes": 1000, "bytes": 0, "batches": 0, "epochs_replayed": 0,
        "needed_bytes": None}


def test_train_and_a_reader_that_shuffles_never_cache(numbered_source):
    """Their epochs differ: random crops and flips, another order."""
    from dali_pipes.graph.augment_config import AugmentConfig
    from dali_pipes.run.pipeline import PipelineSpec
    from dali_pipes.run.val_cache import ValCache
    train = loader(numbered_source, train=True)
    epoch(train)
    epoch(train)
    assert train.stats()["val_cache"]["state"] == "off" and train.stats()["val_cache"]["epochs_replayed"] == 0
    shuffled = ValCache(ENOUGH, PipelineSpec(contract=Contract(False, BATCH, False), shuffle=True), AugmentConfig())
    assert shuffled.describe()["state"] == "off" and shuffled.spec.normalize


def test_the_budget_is_a_flag_and_a_byte_count(numbered_source):
    from train.train import get_args_parser
    assert get_args_parser().parse_args(["--val-cache-bytes", "8000000000"]).val_cache_bytes == 8_000_000_000
    assert LoaderConfig().val_cache_bytes == 0  # opt-in: it holds memory all run
    with pytest.raises(ValueError, match="val_cache_bytes must be a byte count >= 0"):
        loader(numbered_source, cache=-1)


@pytest.mark.gpu
def test_on_a_gpu_the_cache_is_in_gpu_memory_and_gives_todays_batches(numbered_source):
    from conftest import assert_placed
    cached, today = loader(numbered_source, device="gpu"), loader(numbered_source, cache=0, device="gpu")
    for _ in range(3):
        got, expected = epoch(cached), epoch(today)
        for batch in got:
            assert_placed(batch)  # images and labels on the GPU, as without the cache
        assert [l.tolist() for _, l in got] == [l.tolist() for _, l in expected]
        assert max((x - y).abs().max().item() for (x, _), (y, _) in zip(got, expected)) <= 1e-5  # GPU rounding
    assert cached.stats()["val_cache"]["state"] == "filled" and cached.stats()["val_cache"]["epochs_replayed"] == 2
