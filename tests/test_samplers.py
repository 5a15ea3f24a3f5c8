"""Samplers and dataset wrappers against DataLoader itself: the same torchvision ImageFolder read by
torch.utils.data.DataLoader and by DaliLoader, each sample an image of its own class, so a label names its
sample and the batches' labels are the samples, in order.

Checked: WeightedRandomSampler, SubsetRandomSampler, RandomSampler with replacement, a repeated-augmentation
sampler on 2 ranks (in one process, and once under torchrun) and a script's own sampler give DataLoader's
samples in DataLoader's order, epoch after epoch, with DataLoader's len(loader) and len(loader.sampler); a
mid-epoch resume continues exactly (images too); elastic resume is refused for a per-rank sampler and replays
any other; a bad image met in a drawn order is named or excluded; Subset remainder loaders and ConcatDataset
read exactly their samples; DistributedSampler stays the rank's shard unless a subclass draws other indices."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from samplers_job import RepeatedAugmentationSampler
from torch.utils.data import (
    ConcatDataset,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from dali_pipes import DaliLoader, DatasetError
from dali_pipes.tools.convert import write_tfrecords

from conftest import write_one_per_class

N = 22  # images, one per class: 22 is no multiple of the batch (4) nor of the ranks (2)
JOB = os.path.join(os.path.dirname(__file__), "samplers_job.py")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_one_per_class(str(tmp_path_factory.mktemp("samplers") / "images"), N)


@pytest.fixture
def tv(torchvision):
    from torchvision import datasets, transforms
    return datasets, transforms


def train_transform(T):
    return T.Compose([T.RandomResizedCrop(16, scale=(0.5, 1.0)), T.RandomHorizontalFlip(), T.ToTensor()])


def val_transform(T):  # draws no random numbers: DataLoader's transforms then leave torch's global generator alone
    return T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor()])


def epochs(loader, sampler=None, count: int = 3) -> list[list[list[int]]]:
    """The labels (sample ids) of each batch of `count` epochs, set_epoch called as scripts call it."""
    out = []
    for epoch in range(count):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        out.append([labels.tolist() for _, labels in loader])
    return out


class ListSampler(Sampler[int]):
    """A script's own sampler: a fixed list of indices, repeats and all."""

    def __init__(self, indices: list[int]) -> None:
        self.indices = indices

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


@pytest.mark.parametrize("drop_last", [False, True])
def test_weighted_random_sampler_gives_dataloaders_samples_in_order(images, tv, drop_last):
    datasets, T = tv
    dataset = datasets.ImageFolder(images, train_transform(T))
    weights = torch.linspace(0.1, 2.0, N)

    def sampler():
        return WeightedRandomSampler(weights, 30, generator=torch.Generator().manual_seed(7))

    ours = DaliLoader(dataset, batch_size=4, sampler=sampler(), drop_last=drop_last)
    theirs = DataLoader(dataset, batch_size=4, sampler=sampler(), drop_last=drop_last)
    assert (len(ours), len(ours.sampler)) == (len(theirs), len(theirs.sampler)) == (7 if drop_last else 8, 30)
    got, expected = epochs(ours), epochs(theirs)
    assert got == expected
    assert any(len(set(sum(epoch, []))) < 30 for epoch in got)  # drawn with replacement: repeats are yielded
    assert ours.stats()["sampler"] == {"sampler": "WeightedRandomSampler", "drawn": 30}


@pytest.mark.parametrize("make", [
    lambda: SubsetRandomSampler(range(3, 17)),
    lambda: WeightedRandomSampler(torch.ones(N), 13),
    lambda: RandomSampler(range(N), replacement=True, num_samples=9),
], ids=["subset_random", "weighted", "random_with_replacement"])
def test_samplers_on_torchs_global_generator_draw_what_dataloader_draws(images, tv, make):
    """Without a generator of their own they draw from torch's global one, after DataLoader's iterator has taken
    its one int64 (its workers' base seed): DaliLoader takes it too, so the draws and the global generator's
    state after each epoch are DataLoader's."""
    datasets, T = tv
    dataset = datasets.ImageFolder(images, val_transform(T))
    torch.manual_seed(11)
    expected = epochs(DataLoader(dataset, batch_size=4, sampler=make()))
    after = torch.get_rng_state()
    torch.manual_seed(11)
    assert epochs(DaliLoader(dataset, batch_size=4, sampler=make())) == expected
    assert torch.equal(torch.get_rng_state(), after)


def test_a_scripts_own_sampler_and_a_distributed_sampler_that_draws_otherwise_are_read_exactly(images, tv):
    datasets, T = tv
    dataset = datasets.ImageFolder(images, train_transform(T))
    listed = [5, 5, 0, 21, 3, 5, 9]
    ours = DaliLoader(dataset, batch_size=3, sampler=ListSampler(listed))
    assert epochs(ours, count=2) == [[[5, 5, 0], [21, 3, 5], [9]]] * 2

    class EvenOnly(DistributedSampler):  # overrides __iter__: its indices are not DistributedSampler's shard
        def __iter__(self):
            return iter([i for i in super().__iter__() if i % 2 == 0])

        def __len__(self):
            return len([i for i in super().__iter__() if i % 2 == 0])

    for rank in range(2):
        sampler, reference = (EvenOnly(dataset, num_replicas=2, rank=rank, seed=3) for _ in range(2))
        got = epochs(DaliLoader(dataset, batch_size=4, sampler=sampler), sampler, 2)
        assert got == epochs(DataLoader(dataset, batch_size=4, sampler=reference), reference, 2)
    plain = DaliLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, num_replicas=2, rank=0))
    assert "sampler" not in plain.stats()  # a DistributedSampler itself: the rank's shard, DALI's own slices


def repeated_aug(dataset, rank: int, world: int = 2) -> RepeatedAugmentationSampler:
    return RepeatedAugmentationSampler(dataset, world, rank, multiple=8)  # N=22: 16 kept, 8 per rank


def test_repeated_augmentation_sampler_on_two_ranks_gives_dataloaders_samples(images, tv):
    """num_replicas and rank, as a DistributedSampler has: read as DataLoader reads it, not as the rank's
    shard (which gave 11 unique images per rank where DataLoader gives 8, each image up to 3 times)."""
    datasets, T = tv
    dataset = datasets.ImageFolder(images, train_transform(T))
    for rank in range(2):
        ours_sampler, their_sampler = repeated_aug(dataset, rank), repeated_aug(dataset, rank)
        ours = DaliLoader(dataset, batch_size=4, sampler=ours_sampler)
        theirs = DataLoader(dataset, batch_size=4, sampler=their_sampler)
        assert (len(ours), len(ours.sampler)) == (len(theirs), len(theirs.sampler)) == (2, 8)
        got = epochs(ours, ours_sampler)
        assert got == epochs(theirs, their_sampler)
        assert all(len(set(sum(epoch, []))) < 8 for epoch in got)  # repeats, delivered as DataLoader delivers them
        assert ours.shard.rank == rank and ours.shard.world_size == 2 and not ours.supports_elastic


def resume_case(kind: str, dataset):
    """(make the sampler, DaliLoader keywords) of a resume case; the sampler made the same way twice."""
    if kind == "weighted":
        return lambda: WeightedRandomSampler(torch.linspace(1, 3, N), 26, generator=torch.Generator().manual_seed(5))
    if kind == "subset_random":  # torch's global generator
        return lambda: SubsetRandomSampler(list(range(2, 20)))
    return lambda: RepeatedAugmentationSampler(dataset, 2, 1, multiple=2)  # 11 of rank 1's: 3 batches


@pytest.mark.parametrize("kind", ["weighted", "subset_random", "repeated_augmentation"])
def test_a_mid_epoch_resume_continues_exactly(images, tv, kind):
    """A state taken after 2 batches of epoch 1: a new loader with a new sampler (made as the first was) draws
    the same order again and yields the rest of the epoch, images included, then the same next epoch (the
    script restores torch's global generator from its checkpoint, as training scripts do)."""
    datasets, T = tv
    dataset = datasets.ImageFolder(images, train_transform(T))
    make = resume_case(kind, dataset)
    torch.manual_seed(3)
    first_sampler = make()
    first = DaliLoader(dataset, batch_size=4, sampler=first_sampler, seed=9)
    epochs(first, first_sampler, 1)
    if hasattr(first_sampler, "set_epoch"):
        first_sampler.set_epoch(1)
    it = iter(first)
    head = [next(it)[1].tolist() for _ in range(2)]
    state, rng = first.state_dict(), torch.get_rng_state()
    rest = [(images_.clone(), labels.tolist()) for images_, labels in it]
    following = epochs(first, None, 1)  # epoch 2 (set_epoch(2) below, the same for a sampler that has one)

    torch.manual_seed(1234)  # another process: its own global state until the script restores the saved one
    second_sampler = make()
    second = DaliLoader(dataset, batch_size=4, sampler=second_sampler, seed=9)
    second.load_state_dict(state)
    torch.set_rng_state(rng)
    if hasattr(second_sampler, "set_epoch"):
        second_sampler.set_epoch(1)
    resumed = list(second)
    assert [labels.tolist() for _, labels in resumed] == [labels for _, labels in rest] and head
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(resumed, rest))  # the crops too
    assert epochs(second, None, 1) == following


def test_a_resume_between_epochs_and_an_abandoned_epoch_go_on_as_dataloader_does(images, tv):
    """A state taken after an epoch's last batch resumes at the next epoch's draw (crops included); an epoch the
    loop leaves midway is over, as DataLoader's is: the next iteration is the next epoch's draw."""
    datasets, T = tv
    dataset = datasets.ImageFolder(images, train_transform(T))

    def sampler():
        return WeightedRandomSampler(torch.ones(N), 12, generator=torch.Generator().manual_seed(4))

    first = DaliLoader(dataset, batch_size=4, sampler=sampler(), seed=2)
    epochs(first, count=1)
    state = first.state_dict()
    expected = [(images_.clone(), labels.tolist()) for images_, labels in first]
    second = DaliLoader(dataset, batch_size=4, sampler=sampler(), seed=2)
    second.load_state_dict(state)
    got = list(second)
    assert [labels.tolist() for _, labels in got] == [labels for _, labels in expected]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, expected))

    ours, theirs = DaliLoader(dataset, batch_size=4, sampler=sampler()), DataLoader(dataset, batch_size=4,
                                                                                  sampler=sampler())
    for loader in (ours, theirs):
        for _ in loader:
            break  # the loop leaves the epoch after its first batch
    assert epochs(ours, count=2) == epochs(theirs, count=2)


def test_a_sampler_that_cannot_be_read_is_named(images, tv):
    """An index past the dataset, a batch where an index belongs, an order that a resume cannot draw again."""
    datasets, T = tv
    dataset = datasets.ImageFolder(images, train_transform(T))
    with pytest.raises(ValueError, match=f"sampler ListSampler drew index {N}, but the dataset has {N} samples"):
        next(iter(DaliLoader(dataset, batch_size=4, sampler=ListSampler([0, N]))))
    with pytest.raises(ValueError, match="sampler ListSampler yielded something that is not one dataset index"):
        next(iter(DaliLoader(dataset, batch_size=4, sampler=ListSampler([[0, 1], [2, 3]]))))

    class Rotating(ListSampler):  # keeps its own state between draws, out of any generator's reach
        def __iter__(self):
            self.indices = self.indices[1:] + self.indices[:1]
            return iter(self.indices)

    loader = DaliLoader(dataset, batch_size=2, sampler=Rotating(list(range(8))))
    epochs(loader, count=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="sampler Rotating drew another order on resume than the interrupted epoch's"):
        DaliLoader(dataset, batch_size=2, sampler=Rotating(list(range(8)))).load_state_dict(state)


def test_elastic_resume_refuses_a_per_rank_sampler_and_replays_any_other(images, tv):
    datasets, T = tv
    dataset = datasets.ImageFolder(images, train_transform(T))
    states = []
    for rank in range(2):
        loader = DaliLoader(dataset, batch_size=4, sampler=repeated_aug(dataset, rank))
        next(iter(loader))
        states.append(loader.state_dict())
    three = DaliLoader(dataset, batch_size=4, sampler=repeated_aug(dataset, 0, world=3))
    with pytest.raises(ValueError, match=r"RepeatedAugmentationSampler draws each rank's indices from its "
                                         r"num_replicas \(3\).*Resume on 2 ranks"):
        three.load_state_dict(states)

    def weighted(seed):
        return WeightedRandomSampler(torch.ones(N), 20, generator=torch.Generator().manual_seed(seed))

    dealt = DaliLoader(dataset, batch_size=4, sampler=weighted(0), rank=0, world_size=2)
    next(iter(dealt))
    with pytest.raises(ValueError, match=r"WeightedRandomSampler's draw is dealt out over 3 ranks"):
        DaliLoader(dataset, batch_size=4, sampler=weighted(0), rank=0, world_size=3).load_state_dict(
            [dealt.state_dict(), dealt.state_dict()])
    states, rests = [], []
    for process in range(2):  # two processes, each reading the whole draw (DataLoader's way: no rank given)
        loader = DaliLoader(dataset, batch_size=4, sampler=weighted(process))
        assert loader.supports_elastic
        it = iter(loader)
        next(it)
        states.append(loader.state_dict())
        rests.append([labels.tolist() for _, labels in it])
    resumed = DaliLoader(dataset, batch_size=4, sampler=weighted(9))  # one process now: it goes on with the first's
    resumed.load_state_dict(states)
    assert [labels.tolist() for _, labels in resumed] == rests[0]


def test_a_sampler_on_ranks_is_dealt_out_as_lightnings_distributed_sampler_wrapper_deals_it(images, tv):
    """rank=/world_size= (or a Lightning Trainer's distributed strategy, running_framework.lightning_shard) with a
    sampler that knows no ranks: each rank its share of the draw, as Lightning wraps such a DataLoader's sampler."""
    wrapper = pytest.importorskip("lightning.fabric.utilities.distributed").DistributedSamplerWrapper
    datasets, T = tv
    dataset = datasets.ImageFolder(images, train_transform(T))

    def weighted():
        return WeightedRandomSampler(torch.linspace(1, 2, N), 15, generator=torch.Generator().manual_seed(6))

    for rank in range(2):
        ours = DaliLoader(dataset, batch_size=4, sampler=weighted(), rank=rank, world_size=2)
        theirs = DataLoader(dataset, batch_size=4, sampler=wrapper(weighted(), num_replicas=2, rank=rank,
                                                                    shuffle=False))
        assert len(ours) == len(theirs) == 2 and epochs(ours) == epochs(theirs)


def test_a_bad_image_in_a_drawn_order_is_named_or_excluded(tmp_path, tv):
    datasets, T = tv
    root = write_one_per_class(str(tmp_path / "images"), 10)
    bad = os.path.join(root, "c04", "image.jpg")
    with open(bad, "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 not a JPEG after its first bytes" * 8)
    dataset = datasets.ImageFolder(root, train_transform(T))
    listed = [1, 2, 3, 0, 5, 4, 6, 4, 7]
    with pytest.raises(DatasetError, match="c04/image.jpg"):
        for _ in DaliLoader(dataset, batch_size=3, sampler=ListSampler(listed)):
            pass
    with pytest.warns(UserWarning, match="c04/image.jpg"):
        got = sum(epochs(DaliLoader(dataset, batch_size=3, sampler=ListSampler(listed), skip_bad=True), count=1)[0],
                  [])
    assert got == [-1 if i == 4 else i for i in listed]  # excluded in place, every other sample where it was


def test_subset_remainder_loaders_read_exactly_their_samples(images, tv):
    """pytorch/examples' validate(): DistributedSampler(drop_last=True) on the ranks, then the tail through
    Subset(val_dataset, range(a, b)) read on every rank; and a Subset of a Subset, indices out of order."""
    datasets, T = tv
    dataset = datasets.ImageFolder(images, val_transform(T))
    tail = torch.utils.data.Subset(dataset, range(20, N))
    assert epochs(DaliLoader(tail, batch_size=4), count=1) == epochs(DataLoader(tail, batch_size=4), count=1)
    nested = torch.utils.data.Subset(torch.utils.data.Subset(dataset, list(range(N))[::-1]), [3, 0, 7, 7, 1])
    assert epochs(DaliLoader(nested, batch_size=2), count=1) == epochs(DataLoader(nested, batch_size=2), count=1) \
        == [[[18, 21], [14, 14], [20]]]


def test_concat_dataset_reads_every_part_in_order_and_refuses_mixed_transforms(images, tmp_path, tv):
    datasets, T = tv
    other = write_one_per_class(str(tmp_path / "other"), 5, first=N)
    first = datasets.ImageFolder(images, train_transform(T))
    second = datasets.ImageFolder(other, train_transform(T), target_transform=lambda y: 100 + y)
    concat = ConcatDataset([first, torch.utils.data.Subset(second, [4, 0, 2])])
    ours, theirs = DaliLoader(concat, batch_size=4), DataLoader(concat, batch_size=4)
    assert len(ours) == len(theirs) == 7 and epochs(ours, count=1) == epochs(theirs, count=1)

    def sampler():
        return SubsetRandomSampler([0, 24, 23, 5, 22], generator=torch.Generator().manual_seed(2))

    assert epochs(DaliLoader(concat, batch_size=2, sampler=sampler()), count=2) == \
        epochs(DataLoader(concat, batch_size=2, sampler=sampler()), count=2)
    mixed = ConcatDataset([first, datasets.ImageFolder(other, val_transform(T))])
    with pytest.raises(ValueError, match=f"ConcatDataset: {images} has transform .*RandomResizedCrop.* and {other} "
                                         f"has transform .*CenterCrop"):
        DaliLoader(mixed, batch_size=4)


def test_a_drawn_sampler_over_shards_is_refused_naming_what_works(images, tmp_path):
    out = str(tmp_path / "tfr")
    from dali_pipes import open_source
    write_tfrecords(open_source(images), out, shards=2, progress=False)
    with pytest.raises(ValueError, match="WeightedRandomSampler.*image files.*DistributedSampler or shuffle=True"):
        DaliLoader(out, batch_size=4, train=True, image_size=16, sampler=WeightedRandomSampler(torch.ones(N), N))


def test_repeated_augmentation_under_torchrun_gives_dataloaders_samples_on_each_rank(images, tmp_path, torchvision):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([os.path.dirname(JOB), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           JOB, images, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.load(open(tmp_path / f"rank{rank}.json")) for rank in range(2)]
    for result in results:
        assert result["ours"] == result["theirs"] and result["len"] == [2, 2, 8]
    delivered = [sorted(sum(result["ours"][0], [])) for result in results]
    assert delivered[0] != delivered[1]  # each rank its own part of the repeated draw
