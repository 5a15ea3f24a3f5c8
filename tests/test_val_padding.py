"""Validation and the last batches as DataLoader yields them, through real DALI on CPU: the three
val_padding modes over 1-4 ranks, train's short last batch, and resume / elastic resume across a
short batch or a repeat. Labels are sample indices, so every batch says which samples it holds."""

import collections
import dataclasses

import pytest

from dali_pipes import DaliLoader

N = 23  # does not divide by 2, 3 or 4
BATCH = 3




def loaders(source, world_size, **kw):
    kw = {"batch_size": BATCH, "image_size": 16, "device": "cpu", "num_threads": 1, **kw}
    return [DaliLoader(source, rank=r, world_size=world_size, **kw) for r in range(world_size)]


def epoch(loader):
    return [labels.tolist() for _, labels in loader]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_repeat_is_the_default_and_matches_distributed_sampler(numbered_source, world_size):
    ranks = loaders(numbered_source, world_size, train=False)
    per_rank = -(-N // world_size)
    for _ in range(2):
        seen = collections.Counter()
        for loader in ranks:
            batches = epoch(loader)
            assert len(batches) == len(loader) == -(-per_rank // BATCH)  # DataLoader's len, equal on every rank
            assert [len(b) for b in batches] == [BATCH] * (len(batches) - 1) + [per_rank - BATCH * (len(batches) - 1)]
            assert len(loader.sampler) == per_rank
            seen.update(l for b in batches for l in b)
        assert min(seen) >= 0 and set(seen) == set(range(N))  # real labels only, every sample
        assert sum(seen.values()) == per_rank * world_size  # the few extra ones are repeats


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_none_yields_each_sample_exactly_once(numbered_source, world_size):
    ranks = loaders(numbered_source, world_size, train=False, val_padding="none")
    for _ in range(2):
        labels = [l for loader in ranks for b in epoch(loader) for l in b]
        assert sorted(labels) == list(range(N))
    assert max(len(l) for l in ranks) - min(len(l) for l in ranks) <= 1


def test_small_data_against_world_times_batch(numbered_source):
    """5 samples on 4 ranks at batch 3: every rank gets one non-empty batch of real labels."""
    small = dataclasses.replace(numbered_source, files=numbered_source.files[:5], labels=numbered_source.labels[:5])
    ranks = loaders(small, 4, train=False)
    batches = [epoch(loader) for loader in ranks]
    assert [len(b) for b in batches] == [1] * 4 and all(len(b[0]) == 2 for b in batches)
    assert {l for b in batches for l in b[0]} == set(range(5)) and min(l for b in batches for l in b[0]) >= 0


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_train_drop_last_false_yields_real_short_batches(numbered_source, world_size):
    """The DataLoader default in train: each rank's last short batch, real samples, no repeats."""
    ranks = loaders(numbered_source, world_size, train=True, drop_last=False, shuffle_buffer=8)
    for _ in range(2):  # shards rotate: another rank holds the larger shard next epoch
        labels = []
        for loader in ranks:
            batches = epoch(loader)
            larger = -(-N // world_size)  # the larger shard's samples (ceil)
            assert len(batches) == len(loader) == -(-larger // BATCH)
            labels += [l for b in batches for l in b]
        assert sorted(labels) == list(range(N))


def labels_after(loader, batches):
    it = iter(loader)
    return [next(it)[1].tolist() for _ in range(batches)]


@pytest.mark.parametrize("mode", ["repeat", "none", "label"])
@pytest.mark.parametrize("stop", [2, 3, 8])  # 8 = after the last batch of an epoch of 8
def test_resume_across_a_short_batch_or_a_repeat(numbered_source, mode, stop):
    reference = loaders(numbered_source, 1, train=False, val_padding=mode)[0]
    expected = epoch(reference) + epoch(reference)
    loader = loaders(numbered_source, 1, train=False, val_padding=mode)[0]
    first = labels_after(loader, stop)
    state = loader.state_dict()
    resumed = loaders(numbered_source, 1, train=False, val_padding=mode)[0]
    resumed.load_state_dict(state)
    rest = []
    while len(first) + len(rest) < len(expected):
        rest += epoch(resumed)
    assert first + rest == expected


def test_resume_of_train_with_short_batches(numbered_source):
    kw = dict(train=True, drop_last=False, shuffle_buffer=8, seed=3)
    reference = loaders(numbered_source, 2, **kw)[1]
    expected = epoch(reference) + epoch(reference)
    loader = loaders(numbered_source, 2, **kw)[1]
    first = labels_after(loader, len(loader))  # ends with the short batch, before the epoch's end
    resumed = loaders(numbered_source, 2, **kw)[1]
    resumed.load_state_dict(loader.state_dict())
    assert first + epoch(resumed) == expected


def test_state_from_another_mode_is_refused(numbered_source):
    loader = loaders(numbered_source, 1, train=False)[0]
    labels_after(loader, 1)
    other = loaders(numbered_source, 1, train=False, val_padding="label")[0]
    with pytest.raises(ValueError, match="val_padding"):
        other.load_state_dict(loader.state_dict())


def test_elastic_resume_in_repeat_mode_delivers_the_rest_with_real_labels(numbered_source):
    old = loaders(numbered_source, 2, train=False)
    delivered = [l for loader in old for b in labels_after(loader, 2) for l in b]
    states = [loader.state_dict() for loader in old]
    new = loaders(numbered_source, 3, train=False)
    for loader in new:
        loader.load_state_dict(states)
    rest = [epoch(loader) for loader in new]
    assert len({len(b) for b in rest}) == 1 and all(len(b[-1]) >= 1 for b in rest)  # equal counts, none empty
    labels = [l for b in rest for batch in b for l in batch]
    assert min(labels) >= 0 and set(labels) | set(delivered) == set(range(N))
    assert not set(labels) & set(delivered)  # nothing delivered is read again
    after = [l for loader in new for b in epoch(loader) for l in b]  # then this world's own epochs
    assert set(after) == set(range(N))


def test_elastic_resume_of_train_with_short_batches_reads_every_sample(numbered_source):
    """DataLoader's drop_last=False in train: an elastic resume reads all of the rest, the tail included."""
    kw = dict(train=True, drop_last=False, shuffle_buffer=8, seed=3)
    old = loaders(numbered_source, 2, **kw)
    delivered = [l for loader in old for b in labels_after(loader, 1) for l in b]
    states = [loader.state_dict() for loader in old]
    (new,) = loaders(numbered_source, 1, **kw)
    new.load_state_dict(states)
    rest = [l for b in epoch(new) for l in b]
    assert sorted(delivered + rest) == list(range(N))


def test_more_ranks_than_samples_is_refused_naming_both(numbered_source):
    small = dataclasses.replace(numbered_source, files=numbered_source.files[:3], labels=numbered_source.labels[:3])
    with pytest.raises(ValueError, match="3 samples over 4 ranks leave a rank with none; use at most 3 ranks"):
        loaders(small, 4, train=False)
