"""run/batch_mix.py: Mixup and CutMix on DALI's batches with torchvision v2's and timm's semantics, read from a
DataLoader collate_fn (or batch_transform=), drawn per (seed, rank, epoch, batch) so a resume is exact.

Checked: for the same lambda and rectangle, the mixed images and soft targets equal torchvision v2's MixUp /
CutMix and timm's Mixup bit for bit (their own classes: tests/torchvision_side.py, tests/timm_side.py); lambda
follows Beta(alpha, alpha) and CutMix's corrected lambda follows torchvision's own draws over many batches; the
collate forms scripts use are read and others refused naming what is read; DataLoader with the same collate_fn is
the oracle of batch counts, target shapes, row sums and per-class target sums; a mid-epoch resume and a restarted
epoch give exactly the same mixed batches; batch_transform= runs any callable, seeded, leaving the caller's
random streams alone."""

import functools

import numpy as np
import pytest
import torch
from scipy import stats
from torch.utils.data import DataLoader, default_collate

from dali_pipes import DaliLoader
from dali_pipes.run.batch_mix import (
    ACCEPTED,
    MixDraw,
    MixSettings,
    batch_rng,
    cutmix_box,
    draw,
    mix,
    mixer_settings,
    read_collate,
)

COUNTS = (5, 4, 6)  # 15 images, 3 classes
MODULE_MIXER = None  # a script's module-level mixer, named by a module-level lambda (a global, not a closure)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture
def v2(torchvision):
    from torchvision.transforms import v2
    return v2


class Centres:
    """The rectangle centre another library drew, handed to cutmix_box in its order (y, then x)."""

    def __init__(self, *values: int) -> None:
        self.values = list(values)

    def integers(self, high: int) -> int:
        return self.values.pop(0)


def batch(channels_last: bool = False, size: int = 6):
    images = torch.randn(size, 3, 10, 14, generator=torch.Generator().manual_seed(0))
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, torch.tensor([0, 3, 1, 2, 3, 0, 4])[:size]


def beta_draw(alpha: float) -> float:
    """torchvision's draw of lambda (MixUp / CutMix make_params), from torch's global generator."""
    return float(torch.distributions.Beta(torch.tensor([alpha]), torch.tensor([alpha])).sample(()))


@pytest.mark.parametrize("channels_last, size", [(False, 6), (True, 6), (False, 7), (False, 1)])
def test_mixup_equals_torchvision_v2_for_the_same_lambda(v2, channels_last, size):
    """The CPU mixes image by image in place (batch_mix._mixup_in_place): any batch size, either layout."""
    images, labels = batch(channels_last, size)
    mixup = v2.MixUp(alpha=0.4, num_classes=5)
    for seed in range(4):
        torch.manual_seed(seed)
        lam = beta_draw(0.4)
        torch.manual_seed(seed)
        theirs = mixup(images, labels)
        ours = mix(images.clone(), labels, mixer_settings(mixup), MixDraw("mixup", lam))
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
        assert ours[1].shape == (size, 5) and ours[1].dtype == torch.float32


def test_cutmix_equals_torchvision_v2_for_the_same_lambda_and_rectangle(v2):
    images, labels = batch()
    cutmix = v2.CutMix(alpha=1.0, num_classes=5)
    for seed in range(6):
        torch.manual_seed(seed)
        lam = beta_draw(1.0)
        centre_x, centre_y = int(torch.randint(14, (1,))), int(torch.randint(10, (1,)))  # CutMix's order
        torch.manual_seed(seed)
        theirs = cutmix(images, labels)
        box, area_lam = cutmix_box("torchvision", lam, 10, 14, Centres(centre_y, centre_x))
        ours = mix(images.clone(), labels, mixer_settings(cutmix), MixDraw("cutmix", area_lam, box))
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])


def test_timm_mixup_equals_for_the_same_draws(timm):
    from timm.data.mixup import Mixup
    images, labels = batch()
    mixer = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=5)
    settings = mixer_settings(mixer)
    assert (settings.pairing, settings.box, settings.label_smoothing, settings.switch_prob) == ("flip", "timm", 0.1,
                                                                                                 0.5)
    kinds = set()
    for seed in range(8):
        np.random.seed(seed)
        theirs = mixer(images.clone(), labels)
        np.random.seed(seed)  # timm's draws, in timm's order: apply?, cutmix?, lambda, centre y, centre x
        assert np.random.rand() < mixer.mix_prob
        cut = np.random.rand() < mixer.switch_prob
        lam = float(np.random.beta(1.0, 1.0) if cut else np.random.beta(0.8, 0.8))
        if cut:
            box, lam = cutmix_box("timm", lam, 10, 14, Centres(np.random.randint(10), np.random.randint(14)))
            drawn = MixDraw("cutmix", lam, box)
        else:
            drawn = MixDraw("mixup", lam)
        ours = mix(images.clone(), labels, settings, drawn)
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
        kinds.add(drawn.kind)
    assert kinds == {"mixup", "cutmix"}


@pytest.mark.parametrize("size", [7, 1])
def test_timm_pairing_of_an_odd_batch_is_timms_formula(size):
    """timm asserts an even batch; DaliLoader's last batch may be odd: the middle image pairs with itself."""
    images, labels = batch(size=size)
    settings = MixSettings(num_classes=5, mixup_alpha=1.0, pairing="flip", box="timm")
    ours = mix(images.clone(), labels, settings, MixDraw("mixup", 0.3))
    assert torch.equal(ours[0], images * 0.3 + images.flip(0).mul_(1.0 - 0.3))


def test_lambda_follows_beta_and_switch_and_prob_their_probabilities():
    settings = MixSettings(num_classes=10, mixup_alpha=0.2, cutmix_alpha=1.0, prob=0.8, switch_prob=0.3,
                           correct_lam=False)
    draws = [draw(settings, batch_rng(7, (0, 0, i)), 224, 224) for i in range(6000)]
    kinds = [d.kind for d in draws]
    mixed = 6000 - kinds.count("none")
    assert abs(mixed / 6000 - 0.8) < 4 * np.sqrt(0.8 * 0.2 / 6000)
    assert abs(kinds.count("cutmix") / mixed - 0.3) < 4 * np.sqrt(0.3 * 0.7 / mixed)
    for kind, alpha in (("mixup", 0.2), ("cutmix", 1.0)):
        lams = [d.lam for d in draws if d.kind == kind]
        assert stats.kstest(lams, stats.beta(alpha, alpha).cdf).pvalue > 1e-3, kind


def test_cutmix_rectangles_follow_torchvisions_own_draws(v2):
    """CutMix's corrected lambda (the rectangle's area, clipped at the border) over many batches: ours and
    torchvision's make_params, two-sample Kolmogorov-Smirnov."""
    cutmix = v2.CutMix(alpha=1.0, num_classes=10)
    torch.manual_seed(0)
    image = torch.zeros(1, 3, 24, 32)
    theirs = [cutmix.make_params([image])["lam_adjusted"] for _ in range(3000)]
    settings = mixer_settings(cutmix)
    ours = [draw(settings, batch_rng(3, (0, 0, i)), 24, 32).lam for i in range(3000)]
    assert stats.ks_2samp(ours, theirs).pvalue > 1e-3


def test_the_collate_forms_scripts_use_are_read(v2, timm):
    from timm.data.mixup import FastCollateMixup, Mixup
    mixup_cutmix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=7), v2.CutMix(alpha=1.0, num_classes=7)],
                                   p=[1, 3])

    def references_collate_fn(batch):  # torchvision's references/classification/train.py shape
        return mixup_cutmix(*default_collate(batch))

    def mix_collate(batch, mixer):
        return mixer(*default_collate(batch))

    global MODULE_MIXER
    MODULE_MIXER = mixup_cutmix  # as a script sets it at its top level
    forms = [references_collate_fn, lambda batch: MODULE_MIXER(*default_collate(batch)),
             functools.partial(mix_collate, mixer=mixup_cutmix)]
    for form in forms:
        settings, source = read_collate(form)
        assert source is mixup_cutmix and settings == MixSettings(num_classes=7, mixup_alpha=0.2, cutmix_alpha=1.0,
                                                                  prob=1.0, switch_prob=0.75)
    fast = FastCollateMixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.9, switch_prob=0.4, num_classes=7)
    timm_mixup = Mixup(cutmix_alpha=1.0, num_classes=7)
    for form, source in ((fast, fast), (lambda batch: timm_mixup(*default_collate(batch)), timm_mixup)):
        settings, found = read_collate(form)
        assert found is source and settings.pairing == "flip" and settings.label_smoothing == 0.1
    assert read_collate(fast)[0].prob == 0.9 and read_collate(fast)[0].switch_prob == 0.4
    assert read_collate(default_collate) is None and read_collate(None) is None


def test_collate_forms_that_cannot_be_read_are_refused_naming_what_is(v2, timm):
    from timm.data.mixup import Mixup
    mixup = v2.MixUp(alpha=0.2, num_classes=3)
    refused = {"is not supported": lambda batch: torch.stack([s[0] for s in batch]),
               "it calls shuffle_rows": lambda batch: shuffle_rows(mixup(*default_collate(batch))),
               "not a collate function": mixup,
               "mode='elem'": lambda batch: elem(*default_collate(batch)),
               "num_classes": lambda batch: no_classes(*default_collate(batch))}
    elem = Mixup(mode="elem", num_classes=3)
    no_classes = v2.CutMix(alpha=1.0)
    for message, collate_fn in refused.items():
        with pytest.raises(ValueError, match=message) as error:
            read_collate(collate_fn)
        if message in ("is not supported", "it calls shuffle_rows"):
            assert ACCEPTED in str(error.value)


def shuffle_rows(pair):
    return pair


def preset(T):
    return T.Compose([T.RandomResizedCrop(16, scale=(0.5, 1.0)), T.ToTensor(), T.Normalize(MEAN, STD)])


def test_dataloader_is_the_oracle_of_counts_shapes_and_class_sums(folder, v2):
    from torchvision import datasets, transforms
    dataset = datasets.ImageFolder(folder, preset(transforms))
    mixup_cutmix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=3), v2.CutMix(alpha=1.0, num_classes=3)])
    collate_fn = lambda batch: mixup_cutmix(*default_collate(batch))
    ours = DaliLoader(dataset, batch_size=4, shuffle=True, collate_fn=collate_fn)
    theirs = DataLoader(dataset, batch_size=4, shuffle=True, collate_fn=collate_fn)
    assert len(ours) == len(theirs) == 4 and ours.collate_fn is collate_fn
    for loader in (ours, theirs):
        batches = list(loader)
        assert len(batches) == 4 and [len(t) for _, t in batches] == [4, 4, 4, 3]
        assert all(i.shape[1:] == (3, 16, 16) and t.shape[1:] == (3,) and t.dtype == torch.float32
                   for i, t in batches)
        targets = torch.cat([t for _, t in batches])
        assert torch.allclose(targets.sum(1), torch.ones(15))  # each row a distribution
        # mixing pairs each sample with another of the same batch: the per-class sums stay the class counts
        assert torch.allclose(targets.sum(0), torch.tensor(COUNTS, dtype=torch.float32))


def test_a_mid_epoch_resume_and_a_restarted_epoch_give_the_same_mixed_batches(folder, v2):
    mixup_cutmix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=3), v2.CutMix(alpha=1.0, num_classes=3)])
    collate_fn = lambda batch: mixup_cutmix(*default_collate(batch))
    make = lambda: DaliLoader(folder, batch_size=4, train=True, device="cpu", image_size=16, num_threads=1, seed=5,
                              collate_fn=collate_fn)
    first = make()
    whole = [list(first), list(first)]  # two epochs
    assert any(t.max() < 1 for epoch in whole for _, t in epoch)  # mixed batches among them
    again = make()
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(list(again), whole[0]))
    interrupted = make()
    it = iter(interrupted)
    head = [next(it), next(it)]
    state = interrupted.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed) + list(resumed)
    for got, want in zip(head + rest, whole[0] + whole[1]):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert len(head + rest) == len(whole[0]) + len(whole[1])


def test_batch_transform_runs_any_callable_seeded_and_leaves_the_callers_streams(folder):
    def noisy(images, labels):
        return images + torch.rand(()), torch.nn.functional.one_hot(labels, 3).float() * np.random.rand()

    make = lambda: DaliLoader(folder, batch_size=4, train=True, device="cpu", image_size=16, num_threads=1, seed=2,
                              batch_transform=noisy)
    torch.manual_seed(11)
    np.random.seed(11)
    runs = [list(make()) for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[1].shape == (len(a[1]), 3)
    after = (torch.rand(()), np.random.rand())
    torch.manual_seed(11)
    np.random.seed(11)
    assert after == (torch.rand(()), np.random.rand())  # the loop's own random streams were not drawn from


def test_timms_mixup_enabled_is_read_at_every_batch(folder, timm):
    from timm.data.mixup import FastCollateMixup
    collate_fn = FastCollateMixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=3)
    loader = DaliLoader(folder, batch_size=4, train=True, device="cpu", image_size=16, num_threads=1,
                        collate_fn=collate_fn)
    loader.collate_fn.mixup_enabled = False  # timm's train loop at mixup_off_epoch (through its PrefetchLoader)
    for _, targets in loader:
        assert sorted(set(targets.flatten().tolist())) == pytest.approx([0.1 / 3, 0.9 + 0.1 / 3])


class RandomMixUp:
    """The attributes of torchvision's references/classification/transforms.py RandomMixUp (its default collate
    without --use-v2); the class is the references', not the package's, so a stand-in of that shape."""

    def __init__(self, num_classes: int, p: float = 0.5, alpha: float = 1.0, inplace: bool = False) -> None:
        self.num_classes, self.p, self.alpha, self.inplace = num_classes, p, alpha, inplace

    def __call__(self, batch, target):
        raise AssertionError("DaliLoader reads it, never calls it")


class RandomCutMix(RandomMixUp):
    pass


def test_the_references_v1_classes_are_read_with_their_p(tv_transforms):
    """Choose, then apply with the chosen one's p (v1 RandomChoice, then RandomMixUp(p) / RandomCutMix(p)) is
    mix with prob = sum of choice x p, then cutmix with its share: here mixup 1/2, cutmix 1/4, neither 1/4."""
    choice = tv_transforms.RandomChoice([RandomMixUp(10, p=1.0, alpha=0.2), RandomCutMix(10, p=0.5, alpha=1.0)])
    settings, source = read_collate(lambda batch: choice(*default_collate(batch)))
    assert source is choice and (settings.mixup_alpha, settings.cutmix_alpha) == (0.2, 1.0)
    assert settings.prob == pytest.approx(0.75) and settings.switch_prob == pytest.approx(1 / 3)


def test_batch_transform_takes_mix_settings_and_never_two_mixes(folder, v2):
    settings = MixSettings(num_classes=3, cutmix_alpha=1.0)
    loader = DaliLoader(folder, batch_size=4, train=True, device="cpu", image_size=16, num_threads=1,
                        batch_transform=settings)
    assert [tuple(t.shape) for _, t in loader] == [(4, 3)] * 3  # 15 samples, DALI's full batches
    mixup = v2.MixUp(alpha=0.2, num_classes=3)
    with pytest.raises(ValueError, match="pass one"):
        DaliLoader(folder, batch_size=4, train=True, device="cpu", image_size=16, batch_transform=settings,
                   collate_fn=lambda batch: mixup(*default_collate(batch)))
    with pytest.raises(TypeError, match="not callable"):
        DaliLoader(folder, batch_size=4, train=True, device="cpu", image_size=16, batch_transform=3)


@pytest.fixture
def tv_transforms(torchvision):
    from torchvision import transforms
    return transforms
