"""Hugging Face `datasets` objects read as DaliLoader reads them: a Dataset split as its Arrow files (read as a
Parquet location is), its Image and ClassLabel columns, and the torchvision transform its with_transform /
set_transform function applies. `datasets` is never imported here: a Dataset is told by its class's module."""

from __future__ import annotations

import os
from typing import Any

from dali_pipes.data.samples import SampleKeys
from dali_pipes.run.batch_mix import NOT_CARRIED, SampleForm

HF_DATASET_TYPES = ("Dataset", "DatasetDict", "IterableDataset", "IterableDatasetDict")


def is_hf_dataset(dataset: Any) -> bool:
    """A Hugging Face `datasets` object (told by its class's module: datasets is never imported here)."""
    return any(c.__module__.split(".")[0] == "datasets" and c.__name__ in HF_DATASET_TYPES
               for c in type(dataset).__mro__)


def read_hf_dataset(dataset: Any) -> tuple[list[str], SampleKeys, list | None, str, Any]:
    """(its Arrow files, its image and label columns, the ClassLabel names, their folder, the torchvision
    transform its with_transform / set_transform applies) of a datasets.Dataset split. What cannot be read
    from its files is refused, naming why: a DatasetDict, a streaming dataset, rows chosen by an indices mapping
    (select, shuffle, filter), a dataset held in memory only."""
    kind = type(dataset).__name__
    if kind.endswith("Dict"):
        raise TypeError(f"DaliLoader reads one split: pass dataset[{next(iter(dataset), 'train')!r}], not the "
                        f"{kind} of splits {list(dataset)}")
    if kind != "Dataset":
        raise TypeError(f"a streaming {kind} has no files to read ahead; load it with streaming=False, or pass "
                        f"its Parquet files' location")
    if getattr(dataset, "_indices", None) is not None:  # datasets' own (private) name for the mapping
        raise ValueError("the Dataset's rows are chosen by an indices mapping (select, shuffle, filter, sort) over "
                         "its files; write them out first: dataset = dataset.flatten_indices() (DaliLoader shuffles "
                         "by itself with shuffle=True)")
    files = [entry["filename"] for entry in dataset.cache_files]
    if not files:
        raise ValueError("the Dataset is held in memory only (no Arrow files): save it, dataset.save_to_disk(PATH), "
                         "and pass datasets.load_from_disk(PATH), or write it with dataset.to_parquet(PATH)")
    image, label, classes = hf_columns(dataset.features)
    return files, SampleKeys(image_column=image, label_column=label), classes, os.path.dirname(files[0]), \
        hf_transform(dataset)


def hf_sample_form(dataset: Any, keys: SampleKeys) -> SampleForm:
    """What a datasets.Dataset's rows are after its transform, as roles: its first row read once (its transform
    run on it, as DataLoader runs it on every row), the one tensor in it the image, the label column the label,
    other keys (the decoded PIL image, other columns) not carried, named to a collate_fn that reads them."""
    import torch
    row = dataset[0]
    tensors = [key for key, value in row.items() if isinstance(value, torch.Tensor)] if isinstance(row, dict) else []
    if len(tensors) != 1 or keys.label_column not in row:
        found = {k: type(v).__name__ for k, v in row.items()} if isinstance(row, dict) else type(row).__name__
        raise ValueError(f"the Dataset's transform gives rows {found}; a collate_fn is run on rows with one image "
                         f"tensor and the label column {keys.label_column!r}: return the batch with one key added "
                         f"(batch['pixel_values'] = [transform(image) for image in batch['image']])")
    roles = {tensors[0]: "image", keys.label_column: "label"}
    return {key: roles.get(key, NOT_CARRIED) for key in row}


def hf_columns(features: Any) -> tuple[str, str, list | None]:
    """(image column, label column, class names) of a datasets.Features: its Image feature and its ClassLabel
    (else a column named "label")."""
    kinds = {name: type(feature).__name__ for name, feature in features.items()}
    images = [name for name, kind in kinds.items() if kind == "Image"]
    labels = [name for name, kind in kinds.items() if kind == "ClassLabel"] or [n for n in kinds if n == "label"]
    if len(images) != 1 or not labels:
        raise ValueError(f"the Dataset's features {kinds} need one Image column and a ClassLabel (or 'label') "
                         f"column; pass the Parquet files' location with --image-column / --label-column instead")
    names = getattr(features[labels[0]], "names", None)
    return images[0], labels[0], list(names) if names else None


def hf_transform(dataset: Any) -> Any:
    """The torchvision transform a Dataset's with_transform / set_transform function applies to each image:
    the one torchvision transform object the function refers to (a global, a closure, a default). None without
    a transform (augment_from_transform refuses that as for ImageFolder); ValueError naming the function when it
    refers to none or to several."""
    found = dataset.format or {}
    function = found.get("format_kwargs", {}).get("transform") if found.get("type") == "custom" else None
    if function is None or _is_torchvision_transform(function):
        return function
    code = getattr(function, "__code__", None)
    referred = [cell.cell_contents for cell in getattr(function, "__closure__", None) or ()]
    referred += [function.__globals__.get(name) for name in code.co_names] if code is not None else []
    referred += list(getattr(function, "__defaults__", None) or ())
    transforms = list({id(obj): obj for obj in referred if _is_torchvision_transform(obj)}.values())
    if len(transforms) != 1:
        what = getattr(function, "__qualname__", repr(function))
        raise ValueError(f"{what}: the Dataset's transform function refers to {len(transforms)} torchvision "
                         f"transforms; DaliLoader runs one (a Compose) in DALI and cannot run Python per sample: "
                         f"give with_transform a function that applies one torchvision transform to each image")
    return transforms[0]


def _is_torchvision_transform(obj: Any) -> bool:
    return type(obj).__module__.startswith("torchvision.transforms")
