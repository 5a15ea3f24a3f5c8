"""DataLoader's call form, read into DaliLoader's terms.

DaliLoader takes `torch.utils.data.DataLoader`'s arguments with DataLoader's meaning, so that a
script swaps the class name and nothing else:
  * the dataset: a torchvision ImageFolder / DatasetFolder (anything with `samples`, and `root`), a
    Subset or a ConcatDataset of them, is read as its sample list and class mapping (no rescan); its `transform` is
    read as the DALI graph (transforms.py) and its `target_transform` maps the labels once, here.
    What DataLoader would run as Python per sample and DALI cannot is refused, naming it: a `loader=`
    other than torchvision's default, a torchvision subclass's own `__len__`, and any dataset's own
    `__getitem__` (torchvision's or torch's own are read) unless the dataset declares, with `dali_sample`, that
    its items are transform(image) and the label in that structure (the lines to add are named);
  * images are read as the default loader (PIL's convert("RGB")) reads them: no EXIF rotation, 16-bit
    PNGs as PIL reduces them (read_as_pil; AugmentConfig's exif_orientation and png16 choose otherwise);
  * `sampler`: a DistributedSampler (its own __iter__) gives the rank, world size, seed, shuffle and
    drop_last; a RandomSampler or SequentialSampler over the whole dataset means shuffle or not; any other
    sampler (WeightedRandomSampler, SubsetRandomSampler, a repeated-augmentation sampler, a script's own) is
    read as DataLoader reads it: its indices drawn every epoch and fed to DALI (run/sampled.py);
    a batch_sampler or a worker_init_fn is refused (DALI batches by itself, and has no worker processes);
  * `collate_fn`: run on the batch's samples as per-sample views of DALI's output, in the structure the
    dataset's `__getitem__` returns (run/batch_mix.py); default_collate (None), the references' exact
    `M(*default_collate(batch))` around torchvision's MixUp / CutMix and timm's FastCollateMixup take a translated
    fast path, as does `batch_transform=` (any fn(images, labels) -> (images, targets));
  * without a sampler a dataset object is read whole by every process, as DataLoader reads it, except
    where a Lightning Trainer would give a DataLoader built there a DistributedSampler (its hooks under a
    distributed strategy, use_distributed_sampler=True) or where Hugging Face Accelerate runs on several
    processes (accelerator.prepare shards DataLoaders and passes DaliLoader through): there it is sharded as
    Lightning or prepare() would shard it;
  * `shuffle=True` or a random transform means train mode; `drop_last` is DataLoader's. The reader
    shuffles a dataset object only where DataLoader would: `shuffle=True` or a sampler that shuffles.
    `shuffle` unset or False, or a sampler that does not shuffle (DistributedSampler(shuffle=False),
    SequentialSampler), keeps storage order (each rank on its own slice every epoch) while a random
    transform stays random;
Called the dali_pipes way (a location first, `train=`), the rank comes from torch.distributed or
torchrun and train keeps DALI's own full batches (drop_last unset), as before.
Here: the call and the sampler. The dataset objects are read in torchvision_datasets.py and hf_datasets.py, the
running framework is told in running_framework.py, and what the loader keeps of DataLoader's surface is
loader_surface.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from dali_pipes.data.samples import SampleKeys
from dali_pipes.graph.augment_config import AugmentConfig
from dali_pipes.graph.transforms import TransformError, augment_from_transform
from dali_pipes.hf_datasets import hf_sample_form, is_hf_dataset, read_hf_dataset
from dali_pipes.run.batch_mix import DEFAULT_FORM, BatchTransform, SampleForm, batch_transform_of, runs_collate
from dali_pipes.running_framework import accelerate_shard, lightning_shard
from dali_pipes.torchvision_datasets import read_dataset, sample_form_of

LOCATION_TYPES = (str, os.PathLike, list)


@dataclass
class DataLoaderCall:
    """What a DaliLoader call means, whichever form it took."""
    location: Any              # a Source, a location, or None when `dataset` is a dataset object
    dataset: Any               # the user's dataset object, or None (the keyword form)
    samples: list | None       # [(path, label)] read from the dataset object
    classes: list | None
    root: str
    augment_args: dict         # from the dataset's transform
    train: bool
    drop_last: bool
    dali_drop: bool            # keyword-form train with drop_last unset: DALI's DROP policy
    shuffle: bool              # the reader shuffles (and rotates the ranks' slices per epoch): train, unless told not
    sampler: Any               # the user's sampler, or None
    sampler_drop_last: bool
    rank: int | None
    world_size: int | None
    seed: int
    batch_size: int            # checked: a positive int
    keys: SampleKeys | None = None  # a datasets.Dataset's image and label columns
    collate_fn: Any = None     # the user's, kept as DataLoader keeps it (timm's loop sets .mixup_enabled on it)
    batch_transform: BatchTransform | None = None  # what collate_fn or batch_transform= does to each batch
    drawn: bool = False        # the sampler's indices are drawn every epoch and fed to DALI (run/sampled.py)


def resolve_call(dataset: Any, *, batch_size: Any, shuffle: bool | None, sampler: Any, batch_sampler: Any,
                 collate_fn: Any, drop_last: bool | None, train: bool | None, seed: int | None, generator: Any,
                 rank: int | None, world_size: int | None, is_location: bool,
                 worker_init_fn: Any = None, batch_transform: Any = None) -> DataLoaderCall:
    """Check DataLoader's arguments and resolve them (DataLoader's defaults for a dataset object)."""
    if batch_size is None or isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r} (DALI always batches)")
    _refuse_unsupported(batch_sampler, worker_init_fn)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle (as in DataLoader)")
    samples: list | None = None
    classes: list | None = None
    files: Any = None
    keys: SampleKeys | None = None
    augment_args: dict[str, Any] = {}
    root, random_transform = "", False
    form: SampleForm | None = DEFAULT_FORM  # what a collate_fn that is run gets per sample
    if not is_location:
        samples, files, keys, classes, root, transform, form = read_dataset_object(dataset, collate_fn)
        augment_args, random_transform = _augment_of(dataset, transform, root, keys)
    drawn = read_sampler(sampler, None if samples is None else len(samples))
    if drawn.get("world_size") is not None and (rank, world_size) != (None, None) \
            and (rank, world_size) != (drawn["rank"], drawn["world_size"]):
        raise ValueError(f"rank={rank}, world_size={world_size} contradict the sampler's rank {drawn['rank']} "
                         f"of {drawn['world_size']}; pass one of them")
    if train is None:  # a transform says train or val; a sampler's default shuffle=True alone does not
        train = bool(shuffle or random_transform) if augment_args else bool(shuffle or drawn.get("shuffle"))
    if augment_args and random_transform != train:
        raise ValueError(f"{root}: a {'random' if random_transform else 'deterministic'} transform in "
                         f"{'train' if train else 'val'} mode; DaliLoader's train graph starts with "
                         f"RandomResizedCrop, its val graph with Resize + CenterCrop")
    sampler_drop_last = bool(drawn.get("drop_last", False))
    rank_, world_ = _rank_and_world(drawn, rank, world_size, bool(train), is_location)
    if not is_location and not train and sampler_drop_last and samples is not None:  # DistributedSampler drops
        assert world_ is not None  # the sampler's world size                          # the last N % world
        samples = samples[:len(samples) // world_ * world_]
    dali_drop = is_location and train and drop_last is not False
    seed = seed if seed is not None else drawn.get("seed", _generator_seed(generator))
    location = files if files is not None else None if not is_location else dataset
    return DataLoaderCall(location, None if is_location else dataset, samples, classes,
                          root, augment_args, bool(train), bool(drop_last if drop_last is not None else dali_drop),
                          dali_drop, _reader_shuffles(bool(train), shuffle, drawn, is_location), sampler,
                          sampler_drop_last, rank_, world_, seed, batch_size,
                          keys, collate_fn, batch_transform_of(collate_fn, batch_transform, seed, form),
                          bool(drawn.get("drawn")))


def _rank_and_world(drawn: dict, rank: int | None, world_size: int | None, train: bool,
                    is_location: bool) -> tuple[int | None, int | None]:
    """The (rank, world size) the call reads as: a sharding sampler's, else the keywords'; a dataset object is read
    whole by every process (DataLoader's semantics) unless Lightning or Accelerate runs and nothing was given."""
    if is_location:
        return (rank, world_size) if drawn.get("world_size") is None else (drawn["rank"], drawn["world_size"])
    framework = (lightning_shard() or accelerate_shard(train)) \
        if drawn.get("world_size") is None and (rank, world_size) == (None, None) else None
    rank_ = drawn.get("rank", rank if rank is not None else framework[0] if framework else 0)
    world_ = drawn.get("world_size", world_size if world_size is not None else framework[1] if framework
                       else None if rank is not None else 1)  # a rank alone: the world size of the job
    return rank_, world_


def _reader_shuffles(train: bool, shuffle: bool | None, drawn: dict, is_location: bool) -> bool:
    """Whether DALI's reader shuffles. A random transform alone never reorders the data: DataLoader's shuffle
    defaults to False, so a dataset object is shuffled only by shuffle=True or a sampler that shuffles; a location
    in train shuffles unless told not to (shuffle=False, or a sampler that does not)."""
    if is_location:
        return train and shuffle is not False and bool(drawn.get("shuffle", True))
    return train and bool(shuffle or drawn.get("shuffle"))


def read_dataset_object(dataset: Any, collate_fn: Any = None) -> tuple[list | None, Any, SampleKeys | None,
                                                                       list | None, str, Any, SampleForm | None]:
    """(samples, files, keys, classes, root, transform, sample form) of a dataset object: a datasets.Dataset read
    from its Arrow files, as a Parquet location is (its samples' form read from one row where a collate_fn is run
    on them), else a torchvision dataset's sample list."""
    if is_hf_dataset(dataset):
        files, keys, classes, root, transform = read_hf_dataset(dataset)
        form = hf_sample_form(dataset, keys) if runs_collate(collate_fn) else None
        return None, files, keys, classes, root, transform, form
    samples, classes, root, transform = read_dataset(dataset)
    return samples, None, None, classes, root, transform, sample_form_of(dataset)


def _augment_of(dataset: Any, transform: Any, root: str, keys: SampleKeys | None) -> tuple[dict, bool]:
    """augment_from_transform of a dataset object's transform; a refusal names how to build the loader without it."""
    try:
        return augment_from_transform(transform)
    except TransformError as e:
        raise TransformError(e.step, e.problem, transform_fix(dataset, root, keys)) from None


def transform_fix(dataset: Any, root: str, keys: SampleKeys | None) -> str:
    """How to build the loader without the dataset's transform, as code that runs: its images' location (a
    datasets.Dataset: its Arrow files, with its columns) and the loader's own keywords. Keywords given beside the
    dataset object would not help: its transform is read whatever comes with it."""
    if keys is not None:
        files = "[f['filename'] for f in dataset.cache_files]"
        columns = "" if (keys.image_column, keys.label_column) == ("image", "label") else \
            f"keys=SampleKeys(image_column={keys.image_column!r}, label_column={keys.label_column!r}), "
        return (f"pass the Dataset's files with the loader's own keywords: DaliLoader({files}, {columns}"
                f"image_size=..., crop_ratio=..., ...)")
    if type(dataset).__name__ in ("ImageFolder", "DatasetFolder"):
        return f"pass its folder with the loader's own keywords: DaliLoader({root!r}, image_size=..., ...)"
    return "pass the images' location (a folder or a file list) with the loader's own keywords: " \
        "DaliLoader(PATH, image_size=..., crop_ratio=..., ...)"


def read_as_pil(augment: AugmentConfig, call: DataLoaderCall) -> AugmentConfig:
    """`augment` with how images are read decided where it says None. A dataset object is read as DataLoader
    + torchvision's default loader read it (PIL: no EXIF rotation; 16-bit PNGs reduced as convert("RGB")
    does); a location, DALI's way. png16="pil" adds a per-sample branch to the graph (graph.decode_rgb), so
    it is taken only where the dataset lists .png files: a JPEG dataset keeps the graph it always had."""
    pil = call.dataset is not None  # a torchvision dataset's files, or a datasets.Dataset's images (PIL too)
    exif = augment.exif_orientation if augment.exif_orientation is not None else not pil
    lists_png = pil and any(str(path).lower().endswith(".png") for path, _ in call.samples or [])
    return replace(augment, exif_orientation=exif, png16=augment.png16 or ("pil" if lists_png else "scale"))


def _refuse_unsupported(batch_sampler: Any, worker_init_fn: Any) -> None:
    if batch_sampler is not None:
        raise ValueError("batch_sampler is not supported: DALI forms the batches itself (batch_size, shuffle, "
                         "and a DistributedSampler for the rank); pass those instead")
    if worker_init_fn is not None:  # DataLoader calls it in each worker process; DALI decodes on its own threads
        raise ValueError(f"worker_init_fn={getattr(worker_init_fn, '__name__', worker_init_fn)!r} is not supported: "
                         f"DaliLoader has no worker processes to call it in (DALI reads and decodes on its own "
                         f"threads); seed the augmentation with seed= (or generator=), and run other per-process "
                         f"setup once before building the loader")


def read_sampler(sampler: Any, num_samples: int | None = None) -> dict:
    """What a sampler says in DaliLoader's terms: rank, world_size, shuffle, seed, drop_last; "drawn" for a
    sampler DALI's reader cannot stand in for, whose indices the loader draws every epoch (run/sampled.py).
    DALI's reader stands in for a DistributedSampler (the rank's shard), a SequentialSampler and a plain
    RandomSampler (shuffle=False / True) over the whole dataset of `num_samples`, each of their own class or a
    subclass that draws no other indices (its __iter__ and __len__ theirs)."""
    from torch.utils.data import DistributedSampler, RandomSampler, SequentialSampler
    if sampler is None:
        return {}
    covers = num_samples is None or _len(sampler) == num_samples
    if _draws_as(sampler, DistributedSampler):  # the rank's shard: DALI's slices of it
        return {"rank": int(sampler.rank), "world_size": int(sampler.num_replicas),
                "shuffle": bool(getattr(sampler, "shuffle", False)), "seed": int(getattr(sampler, "seed", 0)),
                "drop_last": bool(getattr(sampler, "drop_last", False))}
    if _draws_as(sampler, SequentialSampler) and covers:
        return {"shuffle": False}
    if _draws_as(sampler, RandomSampler) and not sampler.replacement and sampler._num_samples is None and covers:
        return {"shuffle": True, "seed": _generator_seed(getattr(sampler, "generator", None))}
    if not hasattr(sampler, "__iter__"):
        raise TypeError(f"sampler {type(sampler).__name__} is not iterable: a sampler yields dataset indices "
                        f"(torch.utils.data.Sampler), as DataLoader reads it")
    if hasattr(sampler, "num_replicas") and hasattr(sampler, "rank"):  # a per-rank sampler: the rank it draws for
        return {"drawn": True, "rank": int(sampler.rank), "world_size": int(sampler.num_replicas)}
    return {"drawn": True}


def _draws_as(sampler: Any, cls: type) -> bool:
    """`sampler` is a `cls` whose indices are cls's: neither __iter__ nor __len__ overridden below it."""
    return isinstance(sampler, cls) and all(getattr(type(sampler), method) is getattr(cls, method)
                                            for method in ("__iter__", "__len__"))


def _len(sampler: Any) -> int | None:
    try:
        return len(sampler)
    except TypeError:  # a sampler without a length
        return None


def _generator_seed(generator: Any) -> int:
    return int(generator.initial_seed()) & 0x7FFFFFFF if generator is not None else 0
