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
    settings, found = read_collate(fast)
    assert found is fast and settings.pairing == "flip" and settings.label_smoothing == 0.1
    assert read_collate(fast)[0].prob == 0.9 and read_collate(fast)[0].switch_prob == 0.4
    assert read_collate(default_collate) is None and read_collate(None) is None
    timm_mixup = Mixup(cutmix_alpha=1.0, num_classes=7)  # asserts an even batch: run (None), not read
    assert read_collate(lambda batch: timm_mixup(*default_collate(batch))) is None


def test_collate_forms_that_cannot_be_read_are_run_and_a_mixer_as_collate_fn_refused(v2, timm):
    """Issue 32: forms other than the references' exact one are run (read_collate None), not refused; a mixer
    passed as the collate_fn itself is refused, naming batch_transform=, and so are FastCollateMixup settings
    the translation cannot reproduce (it cannot be run on DALI's float images)."""
    from timm.data.mixup import FastCollateMixup, Mixup
    mixup = v2.MixUp(alpha=0.2, num_classes=3)
    elem = Mixup(mode="elem", num_classes=3)
    no_classes = v2.CutMix(alpha=1.0)
    run = [lambda batch: torch.stack([s[0] for s in batch]), lambda batch: shuffle_rows(mixup(*default_collate(batch))),
           lambda batch: elem(*default_collate(batch)), lambda batch: no_classes(*default_collate(batch))]
    assert [read_collate(collate_fn) for collate_fn in run] == [None] * 4
    with pytest.raises(ValueError, match="not a collate function.*batch_transform="):
        read_collate(mixup)
    with pytest.raises(ValueError, match="mode='elem'"):
        read_collate(FastCollateMixup(mode="elem", num_classes=3))


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


# --- issue 32: a collate_fn is run on per-sample views, unless it is provably the translated form ---------------

def val_preset(T):
    return T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor(), T.Normalize(MEAN, STD)])


def both_loaders(dataset, collate_fn, **args):
    """(DaliLoader's batches, DataLoader's batches) of one epoch each, the same arguments."""
    return list(DaliLoader(dataset, collate_fn=collate_fn, **args)), list(DataLoader(dataset, collate_fn=collate_fn,
                                                                                     **args))


def test_a_flag_gated_mixup_collate_honours_the_flag_as_dataloader_does(folder, v2):
    """Issue 32: a collate_fn that closes over a v2 MixUp but mixes only when a flag is set gave soft targets
    for every batch; it is run, so with the flag off the labels are DataLoader's hard labels, exactly."""
    from torchvision import datasets, transforms
    dataset = datasets.ImageFolder(folder, val_preset(transforms))
    mixup = v2.MixUp(alpha=0.2, num_classes=3)
    flags = {"mix": False}

    def collate_fn(batch):
        images, labels = default_collate(batch)
        return mixup(images, labels) if flags["mix"] else (images, labels)

    ours, theirs = both_loaders(dataset, collate_fn, batch_size=4)
    assert [t.tolist() for _, t in ours] == [t.tolist() for _, t in theirs]  # hard labels, in DataLoader's order
    assert all(t.dtype == torch.int64 and i.shape == j.shape for (i, t), (j, _) in zip(ours, theirs))
    assert all((i - j).abs().mean() < 0.1 for (i, _), (j, _) in zip(ours, theirs))  # the same images, resized apart
    flags["mix"] = True  # read at every batch, as DataLoader calls the function at every batch
    ours, theirs = both_loaders(dataset, collate_fn, batch_size=4)
    assert [tuple(t.shape) for _, t in ours] == [tuple(t.shape) for _, t in theirs] == [(4, 3)] * 3 + [(3, 3)]


def test_a_collate_that_mixes_half_the_batches_leaves_the_others_hard(folder, v2):
    """Issue 32: `random.random() < 0.5` mixed every batch; run per batch (Python's generator seeded from the
    batch's key), about half are mixed, the others carry DataLoader's hard labels; the same seed, the same ones."""
    import random

    from torchvision import datasets, transforms
    dataset = datasets.ImageFolder(folder, val_preset(transforms))
    mixup = v2.MixUp(alpha=0.2, num_classes=3)

    def collate_fn(batch):
        images, labels = default_collate(batch)
        return mixup(images, labels) if random.random() < 0.5 else (images, labels)

    make = lambda: DaliLoader(dataset, batch_size=1, collate_fn=collate_fn, seed=4)
    loader, hard = make(), [t.tolist() for _, t in DataLoader(dataset, batch_size=1)]
    kinds = [["hard" if t.ndim == 1 else "mixed" for _, t in loader] for _ in range(3)]  # 3 epochs of 15
    assert 9 <= sum(epoch.count("mixed") for epoch in kinds) <= 36  # Binomial(45, 0.5): 4.5 sd either side
    labels = [t for _, t in make()]
    assert [t.tolist() for t in labels if t.ndim == 1] == [h for h, kind in zip(hard, kinds[0]) if kind == "hard"]
    assert kinds[0] == ["hard" if t.ndim == 1 else "mixed" for t in labels]  # the batch's key decides
    theirs = [t.ndim for _, t in DataLoader(dataset, batch_size=1, collate_fn=collate_fn)]
    assert set(theirs) <= {1, 2}


def test_a_clamp_after_mixing_holds(folder, v2):
    """Issue 32: a collate_fn that clamps after mixing was read as the mix alone (the clamp dropped)."""
    from torchvision import datasets, transforms
    dataset = datasets.ImageFolder(folder, val_preset(transforms))
    mixup = v2.MixUp(alpha=0.2, num_classes=3)

    def collate_fn(batch):
        images, targets = mixup(*default_collate(batch))
        return images.clamp(-1.0, 1.0), targets

    ours, theirs = both_loaders(dataset, collate_fn, batch_size=4)
    assert max(i.abs().max() for i, _ in DaliLoader(dataset, batch_size=4)) > 1.5  # there is something to clamp
    for batches in (ours, theirs):
        assert all(i.min() >= -1.0 and i.max() <= 1.0 for i, _ in batches)
        assert [tuple(t.shape) for _, t in batches] == [(4, 3)] * 3 + [(3, 3)]


def test_the_samples_are_views_of_dalis_batch_in_the_datasets_structure(folder, torchvision):
    """What a run collate_fn is handed: the dataset's item structure ((CHW tensor, int) for torchvision), each
    image a view into DALI's batch (no copy); collate_fn=None and default_collate keep the fast path."""
    from torchvision import datasets, transforms
    dataset = datasets.ImageFolder(folder, val_preset(transforms))
    seen = []

    def collate_fn(batch):
        seen.append(batch)
        return default_collate(batch)

    batches = list(DaliLoader(dataset, batch_size=4, collate_fn=collate_fn))
    for samples, (images, labels) in zip(seen, batches):
        assert all(type(s) is tuple and len(s) == 2 and type(s[1]) is int for s in samples)
        assert [s[1] for s in samples] == labels.tolist() and torch.equal(torch.stack([s[0] for s in samples]), images)
        base, step = samples[0][0].data_ptr(), samples[0][0].numel() * samples[0][0].element_size()
        assert [s[0].data_ptr() for s in samples] == [base + k * step for k in range(len(samples))]  # one buffer
        assert all(s[0]._base is not None and s[0].shape == (3, 16, 16) for s in samples)
    for fast in (None, default_collate):
        assert DaliLoader(dataset, batch_size=4, collate_fn=fast).batch_transform is None


def test_only_the_references_exact_form_is_translated(v2, timm):
    """The translation (BatchMix) stands in only for code that is exactly `return M(*default_collate(batch))`
    (closure, global or partial): anything else around the same mixer is run as it is."""
    from timm.data.mixup import Mixup

    from dali_pipes.run.batch_mix import BatchMix, RunCollate, batch_transform_of
    mixup = v2.MixUp(alpha=0.2, num_classes=3)

    def references(batch):
        return mixup(*default_collate(batch))

    def with_a_step(batch):
        images, labels = default_collate(batch)
        return mixup(images * 1.0, labels)

    timm_mixup = Mixup(mixup_alpha=0.8, num_classes=3)  # asserts an even batch: run, so that it still does
    assert isinstance(batch_transform_of(references, None, 0), BatchMix)
    for other in (with_a_step, lambda batch: mixup(*default_collate(batch[:2])),
                  lambda batch: timm_mixup(*default_collate(batch)), lambda batch: batch):
        assert isinstance(batch_transform_of(other, None, 0), RunCollate), other
