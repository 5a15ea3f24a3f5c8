"""Progressive resizing (resolution.py): schedules, FFCV's ramp, and DaliLoader across a size change on
CPU with real DALI. A schedule's epoch is exactly the epoch of a run at that size throughout, images
included: the size change rebuilds the pipeline from DALI's checkpoint, so the sample order, shard
rotation and random crops go on as one pipeline's would. Resume, elastic resume and the epoch
contract hold across the change."""

import argparse
import hashlib

import pytest
import torch

from dali_pipes import AugmentConfig, DaliLoader, progressive
from dali_pipes.graph.resolution import parse_image_size, schedule_text, size_at
from dali_pipes.options import add_arguments, from_args

N = 23
KW = dict(batch_size=4, train=True, device="cpu", num_threads=1, seed=5, shuffle_buffer=8)
SCHEDULE = {0: 16, 1: 24, 2: 32}




def digest(images: torch.Tensor) -> str:
    return hashlib.sha1(images.numpy().tobytes()).hexdigest()


def epochs(loader, count: int) -> list[tuple[int, list]]:
    """(loader.image_size, [(labels, image shape, image digest) per batch]) for `count` epochs."""
    out = []
    for epoch in range(count):
        loader.set_epoch(epoch)
        size = loader.image_size
        out.append((size, [(y.tolist(), tuple(x.shape), digest(x)) for x, y in loader]))
    return out


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------

def ramp_size(epoch, low, high, start, end, step):
    """progressive's docstring, written out for one epoch."""
    if epoch >= end:
        return high
    if epoch <= start:
        return low
    exact = low + (high - low) * (epoch - start) / (end - start)
    multiple = int(exact // step) * step
    nearest = multiple + step if exact - multiple >= step / 2 else multiple
    return min(high, max(low, nearest))


@pytest.mark.parametrize("args", [(160, 192, 2, 13, 32), (128, 256, 0, 10, 32), (160, 224, 5, 5, 32),
                                  (100, 260, 1, 9, 64), (224, 224, 0, 4, 32)])
def test_progressive_is_the_linear_ramp_rounded_to_step(args):
    schedule = progressive(*args)
    assert isinstance(schedule, dict) and 0 in schedule
    assert [size_at(schedule if len(schedule) > 1 else schedule[0], e) for e in range(args[3] + 5)] == \
        [ramp_size(e, *args) for e in range(args[3] + 5)]
    sizes = list(schedule.values())
    assert all(a != b for a, b in zip(sizes, sizes[1:]))  # an entry only where the size changes


def test_progressive_defaults_are_ffcvs_resnet50_ramp():
    assert progressive() == {0: 160, 8: 192}
    assert progressive(min_size=128, max_size=224, start_epoch=0, end_epoch=3) == {0: 128, 1: 160, 2: 192, 3: 224}


@pytest.mark.parametrize("kwargs,match", [(dict(min_size=0), "min_size must be a positive integer"),
                                          (dict(min_size=256), "min_size <= max_size"),
                                          (dict(start_epoch=14), "start_epoch <= end_epoch"),
                                          (dict(end_epoch=-1), "end_epoch must be an integer >= 0"),
                                          (dict(step=1.5), "step must be a positive integer")])
def test_progressive_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        progressive(**kwargs)


def test_the_flag_takes_a_size_or_a_schedule(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser, AugmentConfig, "augment")
    assert from_args(AugmentConfig, parser.parse_args([])).image_size == 224
    assert from_args(AugmentConfig, parser.parse_args(["--image-size", "192"])).image_size == 192
    cfg = from_args(AugmentConfig, parser.parse_args(["--image-size", "0:160,10:192,16:224"]))
    assert cfg.image_size == {0: 160, 10: 192, 16: 224} and schedule_text(cfg.image_size) == "0:160,10:192,16:224"
    assert [cfg.size_at(e) for e in (0, 9, 10, 15, 16, 90)] == [160, 160, 192, 192, 224, 224]
    assert cfg.val_size == 224 and cfg.for_epoch(3, train=False).image_size == 224
    for bad, said in [("10:192", "size of epoch 0"), ("0:160,0:192", "epoch 0 twice"), ("0:160,5:x", "not a number"),
                      ("0:160,5:-3", "sizes must be positive"), ("0", "positive integer")]:
        with pytest.raises(SystemExit):
            parser.parse_args(["--image-size", bad])
        assert said in capsys.readouterr().err


@pytest.mark.parametrize("value,match", [({3: 160}, "size of epoch 0"), ({0: 160, 4: 0}, "sizes must be positive"),
                                         ({0: 160, "4": 192}, "epochs must be integers"), ({0: 16.5}, "positive"),
                                         (True, "positive integer or a schedule")])
def test_a_bad_schedule_is_refused_before_dali_builds(numbered, value, match):
    with pytest.raises(ValueError, match=match):
        DaliLoader(numbered, image_size=value, **KW)


def test_one_size_schedules_are_that_size_and_val_image_size_is_checked():
    assert AugmentConfig(image_size={0: 192, 5: 192}).image_size == 192
    assert parse_image_size("0:160,4:160,8:192") == {0: 160, 8: 192}
    assert AugmentConfig(image_size={0: 160, 8: 192}, val_image_size=256).val_size == 256
    with pytest.raises(ValueError, match="val_image_size must be a positive integer"):
        AugmentConfig(val_image_size=0)


# ---------------------------------------------------------------------------------------------
# The loader across size changes
# ---------------------------------------------------------------------------------------------

def test_each_epoch_is_the_run_at_its_size(numbered):
    """Epoch e of a schedule = epoch e of a run at size(e) throughout: labels and images."""
    got = epochs(DaliLoader(numbered, image_size={0: 24, 1: 16, 2: 24}, **KW), 3)
    at = {size: epochs(DaliLoader(numbered, image_size=size, **KW), 3) for size in (16, 24)}
    assert [size for size, _ in got] == [24, 16, 24]
    for epoch, (size, batches) in enumerate(got):
        assert {shape for _, shape, _ in batches} == {(4, 3, size, size)}
        assert batches == at[size][epoch][1]
    assert [y for y, _, _ in got[0][1]] != [y for y, _, _ in got[1][1]]  # epochs still differ in order


def test_val_size_is_the_schedules_last_or_val_image_size(numbered):
    val = dict(KW, train=False)
    scheduled = DaliLoader(numbered, image_size=SCHEDULE, **val)
    plain = DaliLoader(numbered, image_size=32, **val)
    assert scheduled.image_size == 32 and epochs(scheduled, 2) == epochs(plain, 2)
    explicit = DaliLoader(numbered, image_size=SCHEDULE, val_image_size=20, crop_ratio=0.5, **val)
    assert epochs(explicit, 1) == epochs(DaliLoader(numbered, image_size=20, crop_ratio=0.5, **val), 1)


@pytest.mark.parametrize("stop", [(1, 2), (0, 4), (1, 4), (1, 0)])
def test_resume_across_a_size_change_gives_the_uninterrupted_batches(numbered, stop):
    """Stop mid-epoch in the second size, or at the boundaries into and out of it, resume in a
    fresh loader: every later batch is the uninterrupted run's, images included, at its size."""
    original = DaliLoader(numbered, image_size=SCHEDULE, **KW)
    reference, state = [], None
    for epoch in range(3):
        original.set_epoch(epoch)
        for i, (x, y) in enumerate(original):
            if state is not None:
                reference.append((y.tolist(), x.shape[-1], digest(x)))
            if (epoch, i) == stop:
                state = original.state_dict()
    assert state["loader"]["image_size"] == "0:16,1:24,2:32"
    resumed = DaliLoader(numbered, image_size=SCHEDULE, **KW)
    resumed.load_state_dict(state)
    got = []
    while resumed.epoch < 3:
        resumed.set_epoch(resumed.next_batch[0])
        got += [(y.tolist(), x.shape[-1], digest(x)) for x, y in resumed]
    assert len(got) == 15 - (5 * stop[0] + stop[1] + 1)
    assert got == reference


def test_a_state_of_another_schedule_is_refused_naming_both(numbered):
    loader = DaliLoader(numbered, image_size=SCHEDULE, **KW)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ValueError, match="taken with image_size 0:16,1:24,2:32, this loader has image_size "
                                         "0:16,2:32; resume with .*--image-size 0:16,1:24,2:32"):
        DaliLoader(numbered, image_size={0: 16, 2: 32}, **KW).load_state_dict(state)
    with pytest.raises(ValueError, match="this loader has image_size 16;"):
        DaliLoader(numbered, image_size=16, **KW).load_state_dict([state])


def test_the_epoch_contract_holds_across_the_size_change(numbered):
    """2 ranks: equal batch counts, each sample at most once per epoch, at every size."""
    loaders = [DaliLoader(numbered, image_size=SCHEDULE, rank=r, world_size=2, **KW) for r in range(2)]
    per_rank = [epochs(loader, 3) for loader in loaders]
    for epoch in range(3):
        assert len(per_rank[0][epoch][1]) == len(per_rank[1][epoch][1]) == N // 2 // 4
        labels = [y for rank in per_rank for batch in rank[epoch][1] for y in batch[0]]
        assert len(labels) == len(set(labels)) and {rank[epoch][0] for rank in per_rank} == {SCHEDULE[epoch]}


def test_elastic_resume_across_a_size_change(numbered):
    """2 ranks stop in epoch 1 (size 24); 1 rank finishes epoch 1 at 24 with what they had not
    yielded, none twice, then runs epoch 2 at 32."""
    old = [DaliLoader(numbered, image_size=SCHEDULE, rank=r, world_size=2, **KW) for r in range(2)]
    yielded = []
    for epoch in range(2):
        iterators = [iter(loader) for loader in old]
        for loader in old:
            loader.set_epoch(epoch)
        for _ in range(1 if epoch else len(old[0])):
            batches = [next(it) for it in iterators]
            if epoch:
                yielded += [y for _, labels in batches for y in labels.tolist()]
    states = [loader.state_dict() for loader in old]
    new = DaliLoader(numbered, image_size=SCHEDULE, **KW)
    new.load_state_dict(states)
    assert new.image_size == 24
    rest = epochs_from(new, 1)
    assert {x for x, _ in rest} == {24}
    labels = yielded + [y for _, ys in rest for y in ys]
    assert len(labels) == len(set(labels)) and N - len(labels) < 4
    new.set_epoch(2)
    assert new.image_size == 32 and {x.shape[-1] for x, _ in new} == {32}


def epochs_from(loader, epoch):
    loader.set_epoch(epoch)
    return [(x.shape[-1], y.tolist()) for x, y in loader]
