"""Batch transforms: Mixup and CutMix (and any callable) on each batch after DALI, on the batch's device.

DataLoader scripts mix in their collate_fn: torchvision's references pass
`collate_fn=lambda batch: mixup_cutmix(*default_collate(batch))` around a v2 RandomChoice([MixUp, CutMix]), timm
passes its FastCollateMixup as the collate_fn. DALI batches by itself, so DaliLoader reads what such a collate_fn
mixes (read_collate: the objects in its closure, the globals it names, a functools.partial's arguments, or the
collate_fn itself) and mixes the batch it cut, with the objects' own semantics (MixSettings), never their code:
  * torchvision v2 MixUp / CutMix (and the references' v1 RandomMixUp / RandomCutMix): lambda ~ Beta(alpha,
    alpha), sample i mixed with sample i - 1 (roll(1, 0)), CutMix's rectangle and lambda as torchvision draws
    them; RandomChoice's p picks one per batch; targets one-hot (N, num_classes) float, mixed by lambda;
  * timm's Mixup / FastCollateMixup (mode 'batch'): prob, switch_prob, label_smoothing, correct_lam, sample i
    with sample N - 1 - i (flip(0)), timm's rectangle; mixup_enabled is read at every batch (timm's loop turns
    it off at mixup_off_epoch). FastCollateMixup mixes uint8 images before normalisation and rounds; here the
    normalised float images are mixed (the same up to that rounding: normalisation is affine);
  * batch_transform=fn: any callable (images, labels) -> (images, targets), run as it is.
Randomness: each batch's draws come from (seed, rank, epoch, batch index) alone, so that a resumed or restarted
epoch draws the same lambdas and rectangles. The draws are host scalars (numpy), so a GPU batch is never synced
to read them; a callable given as batch_transform runs with torch's, numpy's and Python's global generators
seeded from that key and put back afterwards. torchvision and timm are never imported.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np
import torch

MIX_KINDS = ("none", "mixup", "cutmix")
TORCHVISION_MIXERS = {"MixUp": "mixup", "CutMix": "cutmix", "RandomMixUp": "mixup", "RandomCutMix": "cutmix"}
TIMM_MIXERS = ("Mixup", "FastCollateMixup")
ACCEPTED = ("a collate_fn that calls torchvision v2's MixUp / CutMix (or a RandomChoice of them) on "
            "default_collate(batch), as torchvision's references do; timm's FastCollateMixup, or timm's Mixup on "
            "default_collate(batch); or batch_transform=fn, any fn(images, labels) -> (images, targets), run on each "
            "batch on the device")
BatchKey = tuple[int, int, int]  # (rank, epoch, batch index)


@dataclass(frozen=True)
class MixSettings:
    """One batch-level Mixup / CutMix, as torchvision's or timm's objects describe it."""
    num_classes: int
    mixup_alpha: float = 0.0      # 0: never mixup
    cutmix_alpha: float = 0.0     # 0: never cutmix
    prob: float = 1.0             # a batch is mixed with this probability (else one-hot targets, images as they are)
    switch_prob: float = 0.5      # with both: the share of mixed batches that take cutmix
    label_smoothing: float = 0.0  # timm's: targets (1 - s + s / C) and s / C before mixing
    pairing: str = "roll"         # sample i's partner: i - 1 ("roll", torchvision) or N - 1 - i ("flip", timm)
    box: str = "torchvision"      # cutmix's rectangle as torchvision or timm draws it
    correct_lam: bool = True      # cutmix's lambda from the rectangle's clipped area (torchvision always)


@dataclass(frozen=True)
class MixDraw:
    """One batch's draw: which mix, its lambda, and cutmix's rectangle (y1, y2, x1, x2)."""
    kind: str
    lam: float = 1.0
    box: tuple[int, int, int, int] = (0, 0, 0, 0)


def draw(settings: MixSettings, rng: np.random.Generator, height: int, width: int) -> MixDraw:
    """One batch's MixDraw from `rng`: mixed with probability prob; cutmix with switch_prob when both alphas are
    set; lambda ~ Beta(alpha, alpha) of the chosen one; cutmix's rectangle from lambda (cutmix_box)."""
    s = settings
    if rng.random() >= s.prob or not (s.mixup_alpha > 0 or s.cutmix_alpha > 0):
        return MixDraw("none")
    cutmix = s.cutmix_alpha > 0 and (s.mixup_alpha <= 0 or rng.random() < s.switch_prob)
    alpha = s.cutmix_alpha if cutmix else s.mixup_alpha
    lam = float(rng.beta(alpha, alpha))
    if not cutmix:
        return MixDraw("mixup", lam)
    box, area_lam = cutmix_box(s.box, lam, height, width, rng)
    return MixDraw("cutmix", area_lam if s.correct_lam else lam, box)


def cutmix_box(style: str, lam: float, height: int, width: int,
               rng: np.random.Generator) -> tuple[tuple[int, int, int, int], float]:
    """((y1, y2, x1, x2), 1 - the rectangle's share of the image) around a uniform centre. torchvision's: half
    sides int(0.5 * sqrt(1 - lam) * side), clipped; timm's: sides int(sqrt(1 - lam) * side), split side // 2
    before the centre and (side + 1) // 2 after, clipped."""
    cy, cx = int(rng.integers(height)), int(rng.integers(width))
    ratio = math.sqrt(1.0 - lam)
    if style == "torchvision":
        half_h, half_w = int(0.5 * ratio * height), int(0.5 * ratio * width)
        box = (max(cy - half_h, 0), min(cy + half_h, height), max(cx - half_w, 0), min(cx + half_w, width))
    else:
        cut_h, cut_w = int(height * ratio), int(width * ratio)
        box = (max(cy - cut_h // 2, 0), min(cy + (cut_h + 1) // 2, height), max(cx - cut_w // 2, 0),
               min(cx + (cut_w + 1) // 2, width))
    return box, 1.0 - (box[1] - box[0]) * (box[3] - box[2]) / float(height * width)


def mix(images: torch.Tensor, labels: torch.Tensor, settings: MixSettings,
        drawn: MixDraw) -> tuple[torch.Tensor, torch.Tensor]:
    """(mixed images, soft targets (N, num_classes) float32) of one batch, on its device. `images` is mixed in
    place (DaliLoader's own batch, fresh each step), with the float operations torchvision's and timm's objects
    use, so the values are theirs bit for bit for the same draw."""
    partner = (lambda t: t.roll(1, 0)) if settings.pairing == "roll" else (lambda t: t.flip(0))
    if drawn.kind != "none" and not images.is_cuda:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # see _mix_on_cpu
        try:
            _mix_on_cpu(images, drawn, settings.pairing)
        finally:
            torch.set_num_threads(threads)
    elif drawn.kind == "mixup":  # on the GPU one temporary batch, handed back by the caching allocator at once
        theirs = partner(images).mul_(1.0 - drawn.lam)  # read before images change
        images.mul_(drawn.lam).add_(theirs)
    elif drawn.kind == "cutmix":
        y1, y2, x1, x2 = drawn.box
        images[..., y1:y2, x1:x2] = partner(images[..., y1:y2, x1:x2])
    return images, soft_targets(labels, settings, drawn.lam, partner)


def _mix_on_cpu(images: torch.Tensor, drawn: MixDraw, pairing: str) -> None:
    """mix() on the CPU, image by image, on one thread. A batch-sized temporary there is a fresh allocation whose
    page faults cost more than the arithmetic (2x measured at 64 x 3 x 224 x 224), so partners are read before
    they are overwritten (roll: from the last image down, the first taking the last as it was; flip: pair by pair)
    through one image's scratch. One thread: DALI's threads keep the cores busy, and torch's intra-op threads
    then wait on each other at every operation (measured: 10 ms of CPU on one thread, 430 ms on two).
    Mixup: image * lam + partner * (1 - lam), the products rounded apart, as theirs."""
    y1, y2, x1, x2 = drawn.box if drawn.kind == "cutmix" else (0, images.shape[-2], 0, images.shape[-1])
    region = lambda i: images[i, ..., y1:y2, x1:x2]
    n, lam = len(images), drawn.lam
    scratch = [torch.empty_like(region(0)), torch.empty_like(region(0))]

    def take(i: int, source: torch.Tensor) -> None:  # image i from its partner's pixels in `source`
        if drawn.kind == "cutmix":
            region(i).copy_(source)
        else:
            region(i).mul_(lam).add_(torch.mul(source, 1.0 - lam, out=scratch[1]))

    if pairing == "roll":
        scratch[0].copy_(region(n - 1))
        for i in range(n - 1, 0, -1):
            take(i, region(i - 1))
        take(0, scratch[0])
        return
    for i in range(n // 2):
        j = n - 1 - i
        scratch[0].copy_(region(i))
        take(i, region(j))
        take(j, scratch[0])
    if n % 2 and drawn.kind == "mixup":  # the middle image pairs with itself
        take(n // 2, region(n // 2).clone())


def soft_targets(labels: torch.Tensor, settings: MixSettings, lam: float,
                 partner: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """One-hot (label-smoothed) targets mixed by lam with the partners'. A padding label (-1, val_padding=
    "label") gets an all-zero row rather than a device-side index error."""
    off = settings.label_smoothing / settings.num_classes
    on = 1.0 - settings.label_smoothing + off
    valid = labels >= 0
    index = labels.long().clamp(min=0).view(-1, 1)
    one_hot = torch.full((len(labels), settings.num_classes), off, device=labels.device).scatter_(1, index, on)
    one_hot = one_hot * valid.view(-1, 1)  # x 1.0 leaves real rows exact
    return partner(one_hot).mul_(1.0 - lam).add_(one_hot.mul(lam))


def batch_rng(seed: int, key: BatchKey) -> np.random.Generator:
    """The generator of one batch's draws: a function of (seed, rank, epoch, batch index) alone."""
    return np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, *key])


class BatchTransform(Protocol):
    """What DaliLoader applies to each batch it cut (loader.cut_batch), before pinning."""

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, key: BatchKey) -> tuple[torch.Tensor,
                                                                                          torch.Tensor]: ...


class BatchMix:
    """Mixup / CutMix read from torchvision's or timm's objects (`source`), drawn per batch from its key."""

    def __init__(self, settings: MixSettings, seed: int, source: Any = None) -> None:
        self.settings, self.seed, self.source = settings, seed, source

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, key: BatchKey) -> tuple[torch.Tensor,
                                                                                          torch.Tensor]:
        enabled = getattr(self.source, "mixup_enabled", True)  # timm's loop switches it off mid-run
        drawn = draw(self.settings, batch_rng(self.seed, key), images.shape[-2], images.shape[-1]) if enabled \
            else MixDraw("none")
        return mix(images, labels, self.settings, drawn)

    def __repr__(self) -> str:
        return f"BatchMix({self.settings})"


class SeededCallable:
    """A batch_transform= callable, run with the global generators (torch's CPU one and the batch's CUDA
    device's, numpy's, Python's) seeded from the batch's key, then put back: its draws depend on the key
    alone, and the training loop's own random streams are untouched."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int) -> None:
        self.fn, self.seed = fn, seed

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, key: BatchKey) -> tuple[torch.Tensor,
                                                                                          torch.Tensor]:
        derived = int(batch_rng(self.seed, key).integers(2**31))
        saved = random.getstate(), np.random.get_state()
        devices = [images.device.index if images.device.index is not None else torch.cuda.current_device()] \
            if images.is_cuda else []
        try:
            with torch.random.fork_rng(devices=devices):
                torch.random.default_generator.manual_seed(derived)
                for device in devices:
                    with torch.cuda.device(device):
                        torch.cuda.manual_seed(derived)
                random.seed(derived)
                np.random.seed(derived)
                out = self.fn(images, labels)
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"batch_transform {_name(self.fn)} returned {type(out).__name__}; it must return "
                            f"(images, targets)")
        return out[0], out[1]


def batch_transform_of(collate_fn: Any, batch_transform: Any, seed: int) -> BatchTransform | None:
    """The batch transform of a DaliLoader call: batch_transform= (a MixSettings; torchvision's or timm's mixing
    objects read as their MixSettings; any other callable run seeded), or what `collate_fn` mixes (read_collate);
    None when neither does anything. Both at once is refused."""
    from_collate = read_collate(collate_fn)
    if batch_transform is not None and from_collate is not None:
        raise ValueError(f"collate_fn={_name(collate_fn)} mixes batches and batch_transform= is given too: pass one")
    if batch_transform is None:
        return BatchMix(from_collate[0], seed, from_collate[1]) if from_collate is not None else None
    if isinstance(batch_transform, MixSettings):  # the dali_pipes way, without torchvision or timm
        return BatchMix(batch_transform, seed)
    if not callable(batch_transform):
        raise TypeError(f"batch_transform={batch_transform!r} is not callable; it must be fn(images, labels) -> "
                        f"(images, targets)")
    settings = mixer_settings(batch_transform)
    return BatchMix(settings, seed, batch_transform) if settings is not None else SeededCallable(batch_transform, seed)


def read_collate(collate_fn: Any) -> tuple[MixSettings, Any] | None:
    """(what the collate_fn mixes, the mixing object), or None for DataLoader's default_collate. Anything else
    is refused naming what is accepted (ACCEPTED)."""
    if collate_fn is None or getattr(collate_fn, "__name__", "") == "default_collate":
        return None
    if type(collate_fn).__name__ == "FastCollateMixup":  # timm's collate_fn itself
        return _checked(mixer_settings(collate_fn), collate_fn), collate_fn
    if is_mixer(collate_fn):  # DataLoader would call it with a list of samples
        raise ValueError(f"collate_fn={_name(collate_fn)} is a batch transform, not a collate function (DataLoader "
                         f"calls it with a list of samples); pass batch_transform={_name(collate_fn)}")
    values, calls_default = _referenced(collate_fn)
    mixers = [v for v in values if is_mixer(v)]
    others = [v for v in values if callable(v) and v not in mixers and not inspect.ismodule(v)
              and getattr(v, "__name__", "") != "default_collate"]
    if len(mixers) != 1 or others or not calls_default:
        found = f" (it calls {', '.join(_name(v) for v in others)})" if others else ""
        raise ValueError(f"collate_fn={_name(collate_fn)} is not supported{found}: batches come out of DALI as "
                         f"(images, labels) tensors, and DaliLoader reads only {ACCEPTED}; do anything else in "
                         f"the training step")
    return _checked(mixer_settings(mixers[0]), mixers[0]), mixers[0]


def _referenced(fn: Any) -> tuple[list, bool]:
    """(the values a collate function can reach: its closure's, the globals it names, a partial's arguments;
    whether it names default_collate)."""
    if isinstance(fn, functools.partial):
        values, calls_default = _referenced(fn.func)
        return values + list(fn.args) + list(fn.keywords.values()), calls_default
    if not inspect.isfunction(fn):
        return [fn], False
    found = inspect.getclosurevars(fn)
    values = [*found.nonlocals.values(), *found.globals.values()]
    names_default = "default_collate" in fn.__code__.co_names or any(
        getattr(v, "__name__", "") == "default_collate" for v in values)
    return values, names_default


def is_mixer(obj: Any) -> bool:
    """torchvision's or timm's Mixup / CutMix object (or a RandomChoice / RandomApply of them), by name."""
    name = type(obj).__name__
    if name in ("RandomChoice", "RandomApply"):
        ops = getattr(obj, "transforms", None)
        return isinstance(ops, (list, tuple, torch.nn.ModuleList)) and len(ops) > 0 and all(
            type(op).__name__ in TORCHVISION_MIXERS for op in ops)
    return name in TORCHVISION_MIXERS or name in TIMM_MIXERS


def _checked(settings: MixSettings | None, mixer: Any) -> MixSettings:
    if settings is None:
        raise ValueError(f"{_name(mixer)} cannot be read as a batch mix; DaliLoader reads {ACCEPTED}")
    return settings


def mixer_settings(obj: Any) -> MixSettings | None:
    """The MixSettings of a torchvision MixUp / CutMix / RandomChoice of them (or the references' RandomMixUp /
    RandomCutMix) or of timm's Mixup / FastCollateMixup, read by class name and attributes; None for anything
    else. Raises ValueError for such an object with settings the batch mix cannot reproduce."""
    name = type(obj).__name__
    if name in TIMM_MIXERS and hasattr(obj, "mixup_alpha"):
        return _timm_settings(obj)
    if name in TORCHVISION_MIXERS and hasattr(obj, "alpha"):
        return _torchvision_settings(obj, [(obj, 1.0)])
    if is_mixer(obj) and name in ("RandomChoice", "RandomApply"):
        ops = list(obj.transforms)
        if name == "RandomApply":
            return _torchvision_settings(obj, [(op, float(obj.p)) for op in ops[:1]]) if len(ops) == 1 else None
        weights = list(obj.p) if getattr(obj, "p", None) is not None else [1.0] * len(ops)
        total = float(sum(weights))
        return _torchvision_settings(obj, [(op, w / total) for op, w in zip(ops, weights)])
    return None


def _torchvision_settings(obj: Any, ops: list[tuple[Any, float]]) -> MixSettings:
    """Choose-then-apply (RandomChoice's weight w, then an op's own p: the references' classes) is the same
    distribution as mix-with-prob, then cutmix with switch_prob: prob = sum of w * p, switch = cutmix's share."""
    alphas: dict[str, float] = {}
    shares: dict[str, float] = {"mixup": 0.0, "cutmix": 0.0}
    classes = set()
    for op, weight in ops:
        kind = TORCHVISION_MIXERS[type(op).__name__]
        getter = getattr(op, "_labels_getter", None)  # v2's; "default" reads the labels from the 2nd argument
        if getter is not None and getattr(getter, "__name__", "") != "_find_labels_default_heuristic":
            raise ValueError(f"{_name(op)}: labels_getter other than 'default' is not supported (DaliLoader's "
                             f"batches are (images, labels))")
        if kind in alphas and alphas[kind] != float(op.alpha):
            raise ValueError(f"{_name(obj)}: two {type(op).__name__} with different alphas")
        alphas[kind] = float(op.alpha)
        shares[kind] += weight * float(getattr(op, "p", 1.0))
        classes.add(op.num_classes)
    if None in classes or len(classes) != 1:
        raise ValueError(f"{_name(obj)}: num_classes={sorted(classes, key=str)}; give every MixUp / CutMix the same "
                         f"num_classes (torchvision needs it for index labels too)")
    prob = shares["mixup"] + shares["cutmix"]
    return MixSettings(num_classes=int(classes.pop()), mixup_alpha=alphas.get("mixup", 0.0),
                       cutmix_alpha=alphas.get("cutmix", 0.0), prob=prob,
                       switch_prob=shares["cutmix"] / prob if prob else 0.0)


def _timm_settings(obj: Any) -> MixSettings:
    if obj.mode != "batch":
        raise ValueError(f"{_name(obj)}(mode={obj.mode!r}) is not supported: only mode='batch' (one lambda per "
                         f"batch, timm's default); 'pair' and 'elem' draw per sample")
    if getattr(obj, "cutmix_minmax", None) is not None:
        raise ValueError(f"{_name(obj)}(cutmix_minmax={obj.cutmix_minmax}) is not supported: only cutmix_alpha")
    if getattr(obj, "multi_label", False):
        raise ValueError(f"{_name(obj)}(multi_label=True) is not supported: DaliLoader's labels are class indices")
    if not (obj.mixup_alpha > 0 or obj.cutmix_alpha > 0):
        raise ValueError(f"{_name(obj)}: mixup_alpha and cutmix_alpha are both 0 (timm refuses it at the first batch)")
    return MixSettings(num_classes=int(obj.num_classes), mixup_alpha=float(obj.mixup_alpha),
                       cutmix_alpha=float(obj.cutmix_alpha), prob=float(obj.mix_prob),
                       switch_prob=float(obj.switch_prob), label_smoothing=float(obj.label_smoothing),
                       pairing="flip", box="timm", correct_lam=bool(obj.correct_lam))


def _name(obj: Any) -> str:
    return getattr(obj, "__name__", None) or type(obj).__name__
