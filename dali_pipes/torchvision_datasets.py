"""torchvision image datasets read as DaliLoader reads them: an ImageFolder / DatasetFolder (anything with
`samples` and `root`, or a dataset that declares its items with `dali_sample`), a Subset or a ConcatDataset of
them, as its sample list, class names, root and transform (no rescan; its target_transform applied here). What
DataLoader would run as Python per sample and DALI cannot is refused, naming it: a `loader=` other than
torchvision's default, a torchvision subclass's own `__len__`, a dataset's own `__getitem__` without `dali_sample`.
torchvision is never imported: the objects are read by attribute."""

from __future__ import annotations

import os
from typing import Any

from dali_pipes.data.formats.image_files import IMAGE_EXTENSIONS
from dali_pipes.errors import DatasetError
from dali_pipes.graph.transforms import augment_from_transform
from dali_pipes.run.batch_mix import DEFAULT_FORM, SampleForm, check_form


def read_dataset(dataset: Any) -> tuple[list, list | None, str, Any]:
    """([(absolute path, label)], classes, root, transform) of a torchvision image dataset, of a Subset of one,
    or of a ConcatDataset of them, nested as deep as they come: sample i is the dataset's item i, as DataLoader
    indexes it. Labels go through each dataset's target_transform. The parts of a ConcatDataset need
    transforms that read as the same DALI graph (one graph runs for every sample); classes are kept when every
    part lists the same."""
    if hasattr(dataset, "indices") and hasattr(dataset, "dataset"):  # torch.utils.data.Subset
        samples, classes, root, transform = read_dataset(dataset.dataset)
        try:
            return [samples[int(i)] for i in dataset.indices], classes, root, transform
        except IndexError:
            raise ValueError(f"{root}: a Subset of {type(dataset.dataset).__name__} lists an index past its "
                             f"{len(samples)} samples") from None
    if hasattr(dataset, "datasets") and hasattr(dataset, "cumulative_sizes"):  # torch.utils.data.ConcatDataset
        parts = [read_dataset(part) for part in dataset.datasets]
        _check_one_graph(parts)
        classes = parts[0][1] if all(part[1] == parts[0][1] for part in parts) else None
        return [sample for part in parts for sample in part[0]], classes, parts[0][2], parts[0][3]
    return _read_image_dataset(dataset)


def _check_one_graph(parts: list[tuple[list, list | None, str, Any]]) -> None:
    """Refuse a ConcatDataset whose parts' transforms read as different DALI graphs, naming both."""
    first = augment_from_transform(parts[0][3])
    for _, _, root, transform in parts[1:]:
        if augment_from_transform(transform) != first:
            raise ValueError(f"ConcatDataset: {parts[0][2]} has transform {_one_line(parts[0][3])} and {root} has "
                             f"transform {_one_line(transform)}; DaliLoader runs one DALI graph for every sample, so "
                             f"the parts need the same transform (give them one, or keep DataLoader for this dataset)")


def _one_line(transform: Any) -> str:
    return " ".join(repr(transform).split())


def _read_image_dataset(dataset: Any) -> tuple[list, list | None, str, Any]:
    _refuse_python_code(dataset)
    if not hasattr(dataset, "samples") or not (hasattr(dataset, "root") or hasattr(dataset, "dali_sample")):
        raise TypeError(f"DaliLoader cannot read {type(dataset).__name__}: it reads image files in DALI, so it needs a "
                        f"torchvision ImageFolder / DatasetFolder (anything with .root and .samples), a Subset or "
                        f"ConcatDataset of them, or a dataset location (a folder, file list, TFRecord or WebDataset "
                        f"shards)")
    samples = list(dataset.samples)
    first = os.path.dirname(os.path.abspath(str(samples[0][0]))) if samples else type(dataset).__name__
    root = str(getattr(dataset, "root", "") or first)  # no root (a declared dataset): its first file's folder
    relabel = getattr(dataset, "target_transform", None)
    # torchvision lists root-joined paths; other datasets may list them relative to root: told once, by a sample
    base = "" if not samples or os.path.isabs(str(samples[0][0])) or os.path.exists(str(samples[0][0])) else root
    out = []
    for path, label in samples:
        if not str(path).lower().endswith(IMAGE_EXTENSIONS):
            raise ValueError(f"{path}: not an image file DALI decodes (extensions: {' '.join(IMAGE_EXTENSIONS)})")
        label = relabel(label) if relabel is not None else label
        if isinstance(label, bool) or not isinstance(label, int) and not hasattr(label, "__index__"):
            raise ValueError(f"{path}: label {label!r} is not an integer (DALI yields int64 labels)")
        out.append((os.path.abspath(os.path.join(base, str(path))), int(label)))
    if not out:
        raise ValueError(f"{root}: the dataset holds no samples")
    if hasattr(type(dataset), "__len__") and len(dataset) != len(out):  # __getitem__ declared read (dali_sample)
        raise ValueError(f"{root}: len({type(dataset).__name__}) is {len(dataset)} but .samples lists {len(out)}; "
                         f"DaliLoader reads .samples, DataLoader would index range(len(dataset)): make them agree")
    classes = list(dataset.classes) if hasattr(dataset, "classes") else None
    return out, classes, root, getattr(dataset, "transform", None)


def sample_form_of(dataset: Any) -> SampleForm:
    """What the dataset's __getitem__ returns, as roles (batch_mix.SampleForm): its `dali_sample`, else
    torchvision's (image, label); a Subset's or a ConcatDataset's parts' (the parts must agree)."""
    if hasattr(dataset, "indices") and hasattr(dataset, "dataset"):  # torch.utils.data.Subset
        return sample_form_of(dataset.dataset)
    if hasattr(dataset, "datasets") and hasattr(dataset, "cumulative_sizes"):  # torch.utils.data.ConcatDataset
        forms = [sample_form_of(part) for part in dataset.datasets]
        if any(form != forms[0] for form in forms):
            raise ValueError(f"ConcatDataset: its parts return different structures ({forms}); DataLoader would "
                             f"hand a collate_fn both: give them one")
        return forms[0]
    form = getattr(dataset, "dali_sample", None)
    return DEFAULT_FORM if form is None else check_form(form, type(dataset).__name__)


DEFAULT_LOADERS = ("default_loader", "pil_loader")  # torchvision.datasets.folder's: PIL, then convert("RGB")


def _refuse_python_code(dataset: Any) -> None:
    """Refuse what DataLoader would run per sample and DaliLoader would skip: DALI decodes the files itself
    (as torchvision's default loader does) and cannot call Python per sample at its speed."""
    loader, where = getattr(dataset, "loader", None), getattr(dataset, "root", type(dataset).__name__)
    if loader is not None and not (getattr(loader, "__module__", "") == "torchvision.datasets.folder"
                                   and getattr(loader, "__name__", "") in DEFAULT_LOADERS):
        raise ValueError(f"{where}: {type(dataset).__name__}(loader={getattr(loader, '__name__', loader)!r}) "
                         f"is not supported: DaliLoader decodes the image files in DALI as torchvision's default "
                         f"loader does (PIL, convert('RGB')) and cannot call another; drop loader= (or pass "
                         f"torchvision.datasets.folder.default_loader), or keep DataLoader for this dataset")
    overridden = _overridden(type(dataset), "__len__")
    if overridden:
        raise ValueError(f"{where}: {overridden} overrides torchvision's, and DaliLoader never calls it (it "
                         f"reads .samples, .transform and .target_transform and runs them in DALI); move what it "
                         f"does into a subclass that only sets .samples, or keep DataLoader for this dataset")
    own = _own_getitem(type(dataset))
    if own is not None and getattr(dataset, "dali_sample", None) is None:
        raise unread_getitem(dataset, own, library=_overridden(type(dataset), "__getitem__") is not None)


def unread_getitem(dataset: Any, own: str, library: bool) -> DatasetError:
    """The refusal of a dataset whose own __getitem__ DaliLoader would skip: what is read instead, and the lines
    (at most 3) that declare it read exactly."""
    name = type(dataset).__name__
    lines = [] if hasattr(dataset, "samples") else \
        ["self.samples = [(path, label), ...]  # each image file and its int label, in index order"]
    if getattr(dataset, "transform", None) is None:
        lines.append("self.transform = ...  # the torchvision transform __getitem__ applies to the PIL image")
    lines.append('self.dali_sample = ("image", "label")  # what __getitem__ returns, "image" and "label" in its '
                 'places; a dict: {"image": "image", "label": "label"}')
    problem = (f"{own} {'overrides torchvision' + chr(39) + 's' if library else 'is its own'}, and DaliLoader never "
               f"calls it: it reads the dataset's attributes (.samples: [(image path, int label)] in index order; "
               f".transform, the torchvision transform, run in DALI; .target_transform, .root and .classes where "
               f"present) and decodes each file as PIL's open(path).convert('RGB') does, so whatever {own} does "
               f"besides (a crop, a relabelling, a filter, another loader) would not happen")
    fix = (f"If {own} returns transform(image) and the label of .samples, add to {name}.__init__:\n    "
           + "\n    ".join(lines) + "\nelse move relabelling into target_transform (a torchvision.datasets.ImageFolder "
           "subclass without a __getitem__ of its own is read as it is), or keep DataLoader for this dataset")
    return DatasetError(str(getattr(dataset, "root", name)), problem, fix)


def _own_getitem(cls: type) -> str | None:
    """"Class.__getitem__" where a class of the dataset's own, above torch's and torchvision's, defines it."""
    for base in cls.__mro__:
        if base.__module__.split(".")[0] in ("torch", "torchvision", "builtins", "typing"):
            return None
        if "__getitem__" in vars(base):
            return f"{base.__name__}.__getitem__"
    return None


def _overridden(cls: type, method: str) -> str | None:
    """"Class.method" for `method` defined below the torchvision class `cls` derives from."""
    library = next((base for base in cls.__mro__ if base.__module__.startswith("torchvision.")), None)
    if library is None:  # not a torchvision dataset: its __getitem__ is _own_getitem's
        return None
    return next((f"{base.__name__}.{method}" for base in cls.__mro__[:cls.__mro__.index(library)]
                 if method in vars(base)), None)
