"""baseline.py: the DataLoader + PIL baseline's split against torch's own DistributedSampler; what it refuses."""

import re

import pytest
from torch.utils.data import DistributedSampler

from dali_pipes.baseline import ShardSampler, TorchLoader
from dali_pipes.graph.augment import AugmentConfig
from dali_pipes.run.dist import Shard

from conftest import write_folder


@pytest.mark.parametrize("n, world", [(23, 1), (23, 2), (23, 4), (8, 3)])
def test_val_split_is_distributed_samplers_without_padding(n, world):
    for rank in range(world):
        ours = [i for _, i in ShardSampler(n, Shard(rank, world), train=False, seed=0)]
        theirs = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False))
        assert ours == [i for i in theirs[:len(ours)]] and len(ours) == len(range(rank, n, world))


def test_train_split_reads_each_sample_at_most_once_per_epoch():
    ranks = [ShardSampler(23, Shard(r, 3), train=True, seed=5) for r in range(3)]
    indices = [i for s in ranks for _, i in s]
    assert len(indices) == len(set(indices)) == (23 // 3) * 3 and all(len(s) == 23 // 3 for s in ranks)


def test_a_closed_loader_says_so(tmp_path):
    """Iterating a closed TorchLoader names that, rather than failing on a None."""
    write_folder(str(tmp_path), counts=(2, 2))
    loader = TorchLoader(str(tmp_path), batch_size=2, train=False, image_size=16, num_workers=0)
    assert [labels.tolist() for _, labels in loader] == [[0, 0], [1, 1]]
    loader.close()
    with pytest.raises(ValueError, match=r"the loader is closed \(close\(\) was called\)"):
        next(iter(loader))


@pytest.mark.parametrize("train, settings, named", [
    (True, dict(color_jitter=0.4), "color_jitter=0.4"),
    (True, dict(auto_augment="randaugment"), "auto_augment='randaugment'"),
    (True, dict(random_erasing=0.25), "random_erasing=0.25"),
    (True, dict(color_jitter=0.4, random_erasing=0.25), "color_jitter=0.4, random_erasing=0.25"),
    (False, dict(val_stretch=True), "val_stretch=True"),
    (False, dict(interpolation="bicubic"), "interpolation='bicubic'"),
    (True, dict(exif_orientation=True), "exif_orientation=True"),
    (False, dict(png16="scale"), "png16='scale'"),
])
def test_settings_the_baseline_does_not_implement_are_refused_by_name(tmp_path, train, settings, named):
    """A comparison with DaliLoader must compare one recipe: the baseline refuses what it would ignore."""
    write_folder(str(tmp_path), counts=(2, 2))
    augment = AugmentConfig(image_size=16, **settings)
    with pytest.raises(ValueError, match=rf"TorchLoader .*does not implement {re.escape(named)}.*DaliLoader"):
        TorchLoader(str(tmp_path), batch_size=2, train=train, augment=augment, num_workers=0)


def test_settings_of_the_other_mode_do_not_stop_it(tmp_path):
    """Train-only settings on a val loader (and val-only ones on a train loader) do nothing in DALI either."""
    write_folder(str(tmp_path), counts=(2, 2))
    augment = AugmentConfig(image_size=16, color_jitter=0.4, auto_augment="randaugment", random_erasing=0.25)
    assert len(TorchLoader(str(tmp_path), batch_size=2, train=False, augment=augment, num_workers=0)) == 2
    train = TorchLoader(str(tmp_path), batch_size=2, train=True, num_workers=0,
                        augment=AugmentConfig(image_size=16, val_stretch=True))
    assert [tuple(images.shape) for images, _ in train] == [(2, 3, 16, 16)] * 2
