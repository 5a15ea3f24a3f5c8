"""Batch transforms: a collate_fn run on DALI's batch, or Mixup and CutMix translated, on the batch's device.

DALI batches by itself. A collate_fn is honoured as DataLoader honours it: it is run (RunCollate) on the batch's
samples as per-sample views of DALI's output, in the structure the dataset's __getitem__ returns (SampleForm: an
(image, label) tuple for torchvision datasets, a dict where the dataset says so), so that stacking, dict building,
a flag, a clamp or a mixer behave as under DataLoader. Two forms take a translated fast path instead, where it is
provably the same: DataLoader's default_collate (None), which stacks the views back into DALI's batch; and code
that is exactly the references' `return M(*default_collate(batch))` (its bytecode compared with that template,
compiled by the same interpreter: _exact_mixer) with M torchvision's MixUp / CutMix / RandomChoice of them, whose
mix is then applied to the batch with the objects' own semantics (MixSettings), never their code. timm's
FastCollateMixup, which takes uint8 samples DALI does not produce, is read the same way:
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
to read them; a collate_fn that is run, and a callable given as batch_transform, run with torch's, numpy's and
Python's global generators seeded from that key and put back afterwards. torchvision and timm are never imported.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch.utils.data import default_collate

from dali_pipes.run.mixers import MixSettings, mixer_settings, read_collate
from dali_pipes.run.mixers import name_of as _name

MIX_KINDS = ("none", "mixup", "cutmix")
BatchKey = tuple[int, int, int]  # (rank, epoch, batch index)
# What a dataset's __getitem__ returns, with the roles "image" and "label" in place of the values: a tuple
# ("image", "label") for torchvision's datasets, or a dict such as {"image": "image", "label": "label"}
SampleForm = tuple[str, ...] | dict[str, str]
DEFAULT_FORM: SampleForm = ("image", "label")


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
    """What DaliLoader applies to each batch it cut (loader.cut_batch), before pinning: it returns the batch the
    loader yields ((images, targets) from the fast paths; whatever a collate_fn that is run returns)."""

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, key: BatchKey) -> Any: ...


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


def run_seeded(fn: Callable[..., Any], args: tuple, seed: int, key: BatchKey, like: torch.Tensor) -> Any:
    """fn(*args) with the global generators (torch's CPU one and `like`'s CUDA device's, numpy's, Python's) seeded
    from the batch's key, then put back: its draws depend on the key alone, and the training loop's own random
    streams are untouched."""
    derived = int(batch_rng(seed, key).integers(2**31))
    saved = random.getstate(), np.random.get_state()
    devices = [like.device.index if like.device.index is not None else torch.cuda.current_device()] \
        if like.is_cuda else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.random.default_generator.manual_seed(derived)
            for device in devices:
                with torch.cuda.device(device):
                    torch.cuda.manual_seed(derived)
            random.seed(derived)
            np.random.seed(derived)
            return fn(*args)
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])


class SeededCallable:
    """A batch_transform= callable, run seeded from the batch's key (run_seeded)."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], Any], seed: int) -> None:
        self.fn, self.seed = fn, seed

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, key: BatchKey) -> tuple[torch.Tensor,
                                                                                          torch.Tensor]:
        out = run_seeded(self.fn, (images, labels), self.seed, key, images)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"batch_transform {_name(self.fn)} returned {type(out).__name__}; it must return "
                            f"(images, targets)")
        return out[0], out[1]


NOT_CARRIED = "-"  # the role of a key of a dict sample that DaliLoader does not carry (a datasets row's PIL image)


def check_form(form: Any, where: str) -> SampleForm:
    """`form` (a dataset's dali_sample) checked: a tuple or dict whose values are "image" and "label", once each
    (and in a dict, NOT_CARRIED for keys a collate_fn is told are not carried)."""
    roles = [r for r in form.values() if r != NOT_CARRIED] if isinstance(form, dict) \
        else list(form) if isinstance(form, tuple) else None
    if roles is None or sorted(roles) != ["image", "label"]:
        raise ValueError(f"{where}: dali_sample={form!r} must be what __getitem__ returns with \"image\" and "
                         f"\"label\" in place of its values, e.g. (\"image\", \"label\") or {{\"image\": \"image\", "
                         f"\"label\": \"label\"}}")
    return form


class Row(dict):
    """A dict sample whose keys DaliLoader does not carry (`absent`) are named when read."""
    absent: tuple[str, ...] = ()

    def __missing__(self, key: Any) -> Any:
        if key in self.absent:
            raise KeyError(f"{key!r}: DaliLoader does not carry this key of the dataset's samples to a collate_fn "
                           f"(the images are decoded in DALI); it carries {sorted(self)}")
        raise KeyError(key)


def fill(form: SampleForm, image: Any, label: Any) -> Any:
    """`form` with its roles replaced by `image` and `label` (a Row when some keys are not carried)."""
    pick = lambda role: image if role == "image" else label
    if not isinstance(form, dict):
        return tuple(map(pick, form))
    absent = tuple(key for key, role in form.items() if role == NOT_CARRIED)
    if not absent:
        return {key: pick(role) for key, role in form.items()}
    row = Row({key: pick(role) for key, role in form.items() if role != NOT_CARRIED})
    row.absent = absent
    return row


def per_sample_views(images: torch.Tensor, labels: torch.Tensor, form: SampleForm) -> list:
    """The batch's samples as the dataset's __getitem__ returns them: each image a view into `images` (unbind
    copies nothing), each label a Python int (one read of the labels for the whole batch)."""
    return [fill(form, image, label) for image, label in zip(images.unbind(0), labels.tolist())]


class RunCollate:
    """A collate_fn run as DataLoader runs it, on the batch's samples (per_sample_views), seeded from the batch's
    key; what it returns is the batch, as DataLoader yields it."""

    def __init__(self, fn: Callable[[list], Any], seed: int, form: SampleForm) -> None:
        self.fn, self.seed, self.form = fn, seed, form

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, key: BatchKey) -> Any:
        return run_seeded(self.fn, (per_sample_views(images, labels, self.form),), self.seed, key, images)

    def __repr__(self) -> str:
        return f"RunCollate({_name(self.fn)}, {self.form})"


class InForm:
    """A fast path's (images, targets) in the dataset's sample structure, as default_collate builds it from
    dict samples (a dict of batches)."""

    def __init__(self, inner: BatchTransform | None, form: SampleForm) -> None:
        self.inner, self.form = inner, form

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, key: BatchKey) -> Any:
        if self.inner is not None:
            images, labels = self.inner(images, labels, key)
        return fill(self.form, images, labels)


def batch_transform_of(collate_fn: Any, batch_transform: Any, seed: int,
                       form: SampleForm | None = DEFAULT_FORM) -> BatchTransform | None:
    """The batch transform of a DaliLoader call: the collate_fn's translation where it is provably the same
    (read_collate), else the collate_fn run on per-sample views (RunCollate); or batch_transform= (a MixSettings;
    torchvision's or timm's mixing objects read as their MixSettings; any other callable run seeded); the fast
    paths' output in the dataset's sample structure `form` (None: not known, a collate_fn cannot be run). None
    when DALI's (images, labels) is the batch as it is. A collate_fn and batch_transform= at once are refused."""
    default = not runs_collate(collate_fn)
    if batch_transform is not None and collate_fn is not None and collate_fn is not default_collate:
        raise ValueError(f"collate_fn={_name(collate_fn)} and batch_transform= are both given: pass one")
    read = None if collate_fn is None or collate_fn is default_collate else read_collate(collate_fn)
    if not default:
        if form is None:
            raise ValueError(f"collate_fn={_name(collate_fn)}: the structure of the dataset's samples is not known; "
                             f"pass collate_fn=None, which gives (images, labels)")
        return RunCollate(collate_fn, seed, form)
    inner = BatchMix(read[0], seed, read[1]) if read is not None else _given(batch_transform, seed)
    return inner if form is None or form == DEFAULT_FORM else InForm(inner, form)


def runs_collate(collate_fn: Any) -> bool:
    """Whether the collate_fn is run on per-sample views (it is neither default_collate nor read_collate's)."""
    return not (collate_fn is None or collate_fn is default_collate) and read_collate(collate_fn) is None


def _given(batch_transform: Any, seed: int) -> BatchTransform | None:
    if batch_transform is None:
        return None
    if isinstance(batch_transform, MixSettings):  # the dali_pipes way, without torchvision or timm
        return BatchMix(batch_transform, seed)
    if not callable(batch_transform):
        raise TypeError(f"batch_transform={batch_transform!r} is not callable; it must be fn(images, labels) -> "
                        f"(images, targets)")
    settings = mixer_settings(batch_transform)
    return BatchMix(settings, seed, batch_transform) if settings is not None else SeededCallable(batch_transform, seed)
