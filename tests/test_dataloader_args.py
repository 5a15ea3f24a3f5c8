"""The class-name swap: DaliLoader called exactly as torch.utils.data.DataLoader is, around a torchvision
ImageFolder and its transform, against DataLoader itself on the same dataset (torchvision's Python code
from the side install in tests/torchvision_side.py; nothing of torchvision in the library).

Checked: the DALI graph takes the transform's arguments; batches have DataLoader's count, shapes, dtypes,
labels and (val) pixel values within resize tolerance; DistributedSampler's rank, drop_last and
set_epoch; DataLoader's attributes as real scripts read them; refusals that name what is unsupported."""

import collections
import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from dali_pipes import DaliLoader, open_source

from conftest import write_folder

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
COUNTS = (5, 4, 6)  # 15 images: not a multiple of the batches used below
N = sum(COUNTS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("swap") / "images"
    write_folder(str(root), counts=COUNTS)
    return str(root)


@pytest.fixture
def tv(torchvision):
    from torchvision import datasets, transforms
    return datasets, transforms


def val_transform(T):
    return T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor(), T.Normalize(MEAN, STD)])


def train_transform(T):
    return T.Compose([T.RandomResizedCrop(16, scale=(0.5, 1.0)), T.RandomHorizontalFlip(0.3),
                      T.ColorJitter(0.2, 0.2, 0.2), T.ToTensor(), T.Normalize(MEAN, STD)])


def test_val_swap_matches_dataloader(folder, tv):
    datasets, T = tv
    dataset = datasets.ImageFolder(folder, val_transform(T))
    ours = DaliLoader(dataset, batch_size=4, shuffle=False, num_workers=1, pin_memory=True)
    theirs = DataLoader(dataset, batch_size=4, shuffle=False, num_workers=0)  # no fork: DALI threads live in this process
    assert (ours.augment.image_size, ours.augment.crop_ratio) == (16, 0.8) and not ours.train
    assert ours.augment.mean == MEAN and ours.augment.std == STD
    assert len(ours) == len(theirs) == 4 and ours.dataset is dataset and len(ours.sampler) == N
    pairs = list(zip(ours, theirs))
    assert len(pairs) == len(theirs)
    for (images, labels), (ref_images, ref_labels) in pairs:
        assert images.shape == ref_images.shape and images.dtype == ref_images.dtype == torch.float32
        assert labels.dtype == ref_labels.dtype == torch.int64 and labels.tolist() == ref_labels.tolist()
        # the same resize + centre crop + normalisation: DALI's and PIL's bilinear antialiased resizes differ
        # by a few levels at most (std 0.229 makes 1/255 ~ 0.017 here)
        assert (images - ref_images).abs().mean() < 0.06, (images - ref_images).abs().mean()
    assert [len(l) for (_, l), _ in pairs] == [4, 4, 4, 3]  # the last batch short, no padding


def test_train_swap_reads_the_transform_and_counts_like_dataloader(folder, tv):
    datasets, T = tv
    dataset = datasets.ImageFolder(folder, train_transform(T))
    ours = DaliLoader(dataset, batch_size=4, shuffle=True, num_workers=2, pin_memory=True, persistent_workers=True,
                      prefetch_factor=2)
    cfg = ours.augment
    assert ours.train and (cfg.image_size, cfg.random_area, cfg.flip_probability) == (16, (0.5, 1.0), 0.3)
    assert cfg.random_aspect_ratio == pytest.approx((3 / 4, 4 / 3)) and cfg.color_jitter == pytest.approx(0.2)
    theirs = DataLoader(dataset, batch_size=4, shuffle=True)
    assert len(ours) == len(theirs) and ours.drop_last is False and ours.batch_sampler is None
    lo = min((0 - m) / s for m, s in zip(MEAN, STD)) - 1e-3
    hi = max((1 - m) / s for m, s in zip(MEAN, STD)) + 1e-3
    for _ in range(2):
        sizes, labels = [], collections.Counter()
        for (images, target), (ref, _) in zip(ours, theirs):
            assert images.shape[1:] == ref.shape[1:] == (3, 16, 16) and images.dtype == ref.dtype
            assert lo <= images.min() and images.max() <= hi
            sizes.append(len(target))
            labels.update(target.tolist())
        assert sizes == [4, 4, 4, 3]  # DataLoader's drop_last=False: the last batch short, every sample once
        assert labels == collections.Counter(dataset.targets)


@pytest.mark.parametrize("batch,drop_last", [(1, False), (4, True), (7, False), (15, False), (16, False)])
def test_len_is_dataloaders(folder, tv, batch, drop_last):
    datasets, T = tv
    dataset = datasets.ImageFolder(folder, val_transform(T))
    ours = DaliLoader(dataset, batch_size=batch, drop_last=drop_last)
    theirs = DataLoader(dataset, batch_size=batch, drop_last=drop_last)
    assert len(ours) == len(theirs) == sum(1 for _ in ours)


def test_distributed_val_as_pytorch_examples_counts_every_sample_once(folder, tv):
    """DistributedSampler(shuffle=False, drop_last=True) per rank, then the tail through a Subset of
    loader.dataset, as pytorch/examples' validate() does: every sample counted exactly once."""
    datasets, T = tv
    dataset = datasets.ImageFolder(folder, val_transform(T))
    world, counted = 2, collections.Counter()
    loaders = []
    for rank in range(world):
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False, drop_last=True)
        loader = DaliLoader(dataset, batch_size=4, shuffle=False, num_workers=2, pin_memory=True, sampler=sampler)
        assert len(loader.sampler) == N // world and len(loader.dataset) == N and loader.sampler is sampler
        loaders.append(loader)
        for _, target in loader:
            counted.update(target.tolist())
    assert sum(counted.values()) == (N // world) * world
    if len(loaders[0].sampler) * world < len(loaders[0].dataset):  # pytorch/examples' remainder logic
        tail = Subset(loaders[0].dataset, range(len(loaders[0].sampler) * world, len(loaders[0].dataset)))
        for _, target in DaliLoader(tail, batch_size=4, shuffle=False, num_workers=2, pin_memory=True):
            counted.update(target.tolist())
    assert counted == collections.Counter(dataset.targets)


def test_distributed_sampler_gives_rank_seed_shuffle_and_set_epoch(folder, tv):
    datasets, T = tv
    dataset = datasets.ImageFolder(folder, train_transform(T))
    sampler = DistributedSampler(dataset, num_replicas=3, rank=2, seed=11)
    loader = DaliLoader(dataset, batch_size=2, sampler=sampler)
    assert (loader.shard.rank, loader.shard.world_size, loader.seed, loader.train) == (2, 3, 11, True)
    assert len(loader.sampler) == len(sampler) == 5 and len(loader) == 3
    sampler.set_epoch(4)  # a script that resumed its model at epoch 4
    assert sum(len(t) for _, t in loader) == 5
    assert loader.epoch == 5 and loader.state_dict()["loader"]["epoch"] == 5


def test_timm_and_examples_probes_work_on_the_keyword_form(folder):
    loader = DaliLoader(folder, batch_size=4, train=True, device="cpu", image_size=16, num_threads=1)
    # timm's _set_loader_epoch and Lightning's _set_sampler_epoch
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(0)
    elif hasattr(loader.batch_sampler, "set_epoch"):
        loader.batch_sampler.set_epoch(0)
    elif hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(0)
    source = open_source(folder)
    assert len(loader.dataset) == N and loader.dataset.classes == source.classes
    assert loader.dataset.class_to_idx == {c: i for i, c in enumerate(source.classes)}
    assert loader.dataset.targets == source.labels and len(loader.dataset.samples) == N
    assert len(loader.sampler) == len(loader) * 4 and loader.drop_last is True  # today's train default
    loader.sampler.set_epoch(1)  # reaches the loader
    assert sum(1 for _ in loader) == len(loader) and loader.epoch == 2


def test_dataloader_arguments_it_cannot_honour_are_refused(folder, tv):
    datasets, T = tv
    dataset = datasets.ImageFolder(folder, val_transform(T))
    with pytest.raises(ValueError, match="batch_sampler"):
        DaliLoader(dataset, batch_sampler=[[0, 1]])
    with pytest.raises(ValueError, match="collate_fn"):
        DaliLoader(dataset, batch_size=2, collate_fn=lambda batch: batch)
    with pytest.raises(ValueError, match="WeightedRandomSampler"):
        DaliLoader(dataset, batch_size=2, sampler=torch.utils.data.WeightedRandomSampler([1.0] * N, N))
    with pytest.raises(ValueError, match="mutually exclusive"):
        DaliLoader(dataset, batch_size=2, shuffle=True, sampler=DistributedSampler(dataset, 2, 0))
    with pytest.raises(TypeError, match="TensorDataset"):
        DaliLoader(torch.utils.data.TensorDataset(torch.zeros(4, 3)), batch_size=2)
    assert DaliLoader(dataset, batch_size=2, collate_fn=torch.utils.data.default_collate).collate_fn is not None


def test_target_transform_and_subset_are_read(folder, tv):
    datasets, T = tv
    dataset = datasets.ImageFolder(folder, val_transform(T), target_transform=lambda y: 10 + y)
    subset = Subset(dataset, [14, 0, 7])
    labels = [t.tolist() for _, t in DaliLoader(subset, batch_size=2)]
    assert labels == [[10 + dataset.targets[14], 10 + dataset.targets[0]], [10 + dataset.targets[7]]]


def test_explicit_index_cache_dir_wins_over_a_writable_shard_folder(folder, tmp_path):
    from dali_pipes.convert import write_tfrecords
    out = str(tmp_path / "tfr")
    write_tfrecords(open_source(folder), out, shards=2, progress=False)
    for name in os.listdir(out):
        if name.endswith(".idx"):
            os.remove(os.path.join(out, name))
    cache = str(tmp_path / "cache")
    loader = DaliLoader(out, batch_size=4, train=False, device="cpu", image_size=16, index_cache_dir=cache)
    assert sum(len(t) for _, t in loader) == N
    assert not [n for n in os.listdir(out) if n.endswith(".idx")]  # nothing written beside the shards
    assert all(p.startswith(cache) for p in loader.source.index_files)
    assert np.all([os.path.exists(p) for p in loader.source.index_files])


def test_relative_root_and_a_val_sampler_left_at_its_default_shuffle(folder, tv, monkeypatch):
    """ImageFolder("images") from its parent folder (torchvision lists root-joined paths); a val
    DistributedSampler built with its default shuffle=True: the deterministic transform says val."""
    datasets, T = tv
    monkeypatch.chdir(os.path.dirname(folder))
    dataset = datasets.ImageFolder(os.path.basename(folder), val_transform(T))
    loader = DaliLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, num_replicas=2, rank=0))
    assert not loader.train and sum(len(t) for _, t in loader) == -(-N // 2)
