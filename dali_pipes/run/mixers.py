"""What a collate_fn or a mixing object means, read and never run: torchvision's MixUp / CutMix (v2, and the
references' v1 RandomMixUp / RandomCutMix, and RandomChoice / RandomApply of them) and timm's Mixup /
FastCollateMixup as MixSettings (their attributes read by class name; neither library is imported), and a
collate_fn whose code is exactly the references' `return M(*default_collate(batch))` (its bytecode compared
with that template, compiled by the same interpreter). batch_mix.py applies what is read here."""

from __future__ import annotations

import dis
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.data import default_collate

TORCHVISION_MIXERS = {"MixUp": "mixup", "CutMix": "cutmix", "RandomMixUp": "mixup", "RandomCutMix": "cutmix"}
TIMM_MIXERS = ("Mixup", "FastCollateMixup")
ACCEPTED = ("timm's FastCollateMixup in mode 'batch' as the collate_fn, read; any other collate_fn, run on "
            "per-sample views; or batch_transform=fn, any fn(images, labels) -> (images, targets), run on each "
            "batch on the device")

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




def read_collate(collate_fn: Any) -> tuple[MixSettings, Any] | None:
    """(what the collate_fn mixes, the mixing object) where the translation is provably what running it does:
    timm's FastCollateMixup itself, or code that is exactly `return M(*default_collate(batch))` (_exact_mixer)
    with M torchvision's MixUp / CutMix / RandomChoice of them (or the references' v1 classes) whose settings
    the translation reproduces. None for anything else: DataLoader's default_collate, or a collate_fn to run.
    timm's Mixup is run, not read: it asserts an even batch, which the translation would not."""
    if collate_fn is None or collate_fn is default_collate:
        return None
    if type(collate_fn).__name__ == "FastCollateMixup":  # timm's collate_fn itself: takes uint8 samples, never run
        return _checked(mixer_settings(collate_fn), collate_fn), collate_fn
    if is_mixer(collate_fn):  # DataLoader would call it with a list of samples
        raise ValueError(f"collate_fn={name_of(collate_fn)} is a batch transform, not a collate function (DataLoader "
                         f"calls it with a list of samples); pass batch_transform={name_of(collate_fn)}")
    mixer = _exact_mixer(collate_fn)
    if mixer is None or type(mixer).__name__ in TIMM_MIXERS:
        return None
    try:
        settings = mixer_settings(mixer)
    except ValueError:  # settings the translation does not reproduce: running it does
        return None
    return (settings, mixer) if settings is not None else None


def _template_closure() -> Callable[[list], Any]:
    mixer: Any = None
    return lambda batch: mixer(*default_collate(batch))


def _template_global(batch: list) -> Any:
    return _MIXER(*default_collate(batch))  # type: ignore[name-defined]  # noqa: F821 (compiled, never run)


def _template_argument(batch: list, mixer: Any) -> Any:
    return mixer(*default_collate(batch))


_SKIPPED_OPS = ("RESUME", "COPY_FREE_VARS", "MAKE_CELL", "PUSH_NULL", "NOP", "CACHE", "EXTENDED_ARG")
_TEMPLATE_ROLES = {"batch": "batch", "mixer": "mixer", "_MIXER": "mixer", "default_collate": "default_collate"}


def _shape(code: Any, role: Callable[[str], str | None]) -> tuple | None:
    """A code object's instructions with every name load replaced by the loaded value's role; None when a name
    has no role. Loads of closures, globals and locals read alike (the same value, found another way)."""
    out = []
    for ins in dis.get_instructions(code):
        if ins.opname in _SKIPPED_OPS:
            continue
        if ins.opname.startswith("LOAD_") and ins.opname not in ("LOAD_CONST", "LOAD_ATTR", "LOAD_METHOD"):
            found = role(ins.argval)
            if found is None:
                return None
            out.append(("LOAD", found))
        else:
            out.append((ins.opname, ins.argval))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _template_shapes() -> frozenset:
    templates = (_template_closure(), _template_global, _template_argument)
    return frozenset(_shape(t.__code__, _TEMPLATE_ROLES.get) for t in templates)


def _exact_mixer(collate_fn: Any) -> Any:
    """M when collate_fn's code is exactly `return M(*default_collate(batch))` (a def or lambda; M from its
    closure, its globals, a default or a functools.partial's arguments) and M is a mixer (is_mixer); else None."""
    fn, bound = collate_fn, {}
    if isinstance(fn, functools.partial):
        fn = fn.func
        names = fn.__code__.co_varnames if inspect.isfunction(fn) else ()
        bound = {**dict(zip(names, collate_fn.args)), **collate_fn.keywords}
    if not inspect.isfunction(fn) or fn.__code__.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
        return None
    code = fn.__code__
    params = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    defaults = dict(zip(params[code.co_argcount - len(fn.__defaults__ or ()):code.co_argcount], fn.__defaults__ or ()))
    bound = {**defaults, **(fn.__kwdefaults__ or {}), **bound}
    free = [name for name in params if name not in bound]
    try:
        cells = {name: cell.cell_contents for name, cell in zip(code.co_freevars, fn.__closure__ or ())}
    except ValueError:  # an empty cell: a name not yet assigned
        return None
    found: list = []

    def role(name: str) -> str | None:
        if free == [name]:
            return "batch"
        value = bound.get(name, cells.get(name, fn.__globals__.get(name, _MISSING)))
        if value is default_collate:
            return "default_collate"
        if value is not _MISSING and is_mixer(value):
            found.append(value)
            return "mixer"
        return None

    return found[0] if len(free) == 1 and _shape(code, role) in _template_shapes() else None


_MISSING = object()


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
        raise ValueError(f"{name_of(mixer)} cannot be read as a batch mix; DaliLoader reads {ACCEPTED}")
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
            raise ValueError(f"{name_of(op)}: labels_getter other than 'default' is not supported (DaliLoader's "
                             f"batches are (images, labels))")
        if kind in alphas and alphas[kind] != float(op.alpha):
            raise ValueError(f"{name_of(obj)}: two {type(op).__name__} with different alphas")
        alphas[kind] = float(op.alpha)
        shares[kind] += weight * float(getattr(op, "p", 1.0))
        classes.add(op.num_classes)
    if None in classes or len(classes) != 1:
        raise ValueError(f"{name_of(obj)}: num_classes={sorted(classes, key=str)}; give every MixUp / CutMix the same "
                         f"num_classes (torchvision needs it for index labels too)")
    prob = shares["mixup"] + shares["cutmix"]
    return MixSettings(num_classes=int(classes.pop()), mixup_alpha=alphas.get("mixup", 0.0),
                       cutmix_alpha=alphas.get("cutmix", 0.0), prob=prob,
                       switch_prob=shares["cutmix"] / prob if prob else 0.0)


def _timm_settings(obj: Any) -> MixSettings:
    if obj.mode != "batch":
        raise ValueError(f"{name_of(obj)}(mode={obj.mode!r}) is not supported: only mode='batch' (one lambda per "
                         f"batch, timm's default); 'pair' and 'elem' draw per sample")
    if getattr(obj, "cutmix_minmax", None) is not None:
        raise ValueError(f"{name_of(obj)}(cutmix_minmax={obj.cutmix_minmax}) is not supported: only cutmix_alpha")
    if getattr(obj, "multi_label", False):
        raise ValueError(f"{name_of(obj)}(multi_label=True) is not supported: DaliLoader's labels are class indices")
    if not (obj.mixup_alpha > 0 or obj.cutmix_alpha > 0):
        raise ValueError(f"{name_of(obj)}: mixup_alpha and cutmix_alpha are both 0 (timm refuses it at the first "
                         f"batch)")
    return MixSettings(num_classes=int(obj.num_classes), mixup_alpha=float(obj.mixup_alpha),
                       cutmix_alpha=float(obj.cutmix_alpha), prob=float(obj.mix_prob),
                       switch_prob=float(obj.switch_prob), label_smoothing=float(obj.label_smoothing),
                       pairing="flip", box="timm", correct_lam=bool(obj.correct_lam))


def name_of(obj: Any) -> str:
    return getattr(obj, "__name__", None) or type(obj).__name__
