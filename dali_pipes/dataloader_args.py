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
"""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from dataclasses import dataclass, replace
from typing import Any

from dali_pipes.data.formats.image_files import IMAGE_EXTENSIONS
from dali_pipes.data.samples import SampleKeys
from dali_pipes.errors import DatasetError
from dali_pipes.graph.augment_config import AugmentConfig
from dali_pipes.graph.transforms import TransformError, augment_from_transform
from dali_pipes.run.batch_mix import (
    DEFAULT_FORM,
    NOT_CARRIED,
    BatchTransform,
    SampleForm,
    batch_transform_of,
    check_form,
    runs_collate,
)

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
    if is_location:
        rank_, world_ = (rank, world_size) if drawn.get("world_size") is None else (drawn["rank"], drawn["world_size"])
    else:  # a dataset object: DataLoader semantics, every process reads it whole unless a sampler shards it
        framework = (lightning_shard() or accelerate_shard(bool(train))) \
            if drawn.get("world_size") is None and (rank, world_size) == (None, None) else None
        rank_ = drawn.get("rank", rank if rank is not None else framework[0] if framework else 0)
        world_ = drawn.get("world_size", world_size if world_size is not None else framework[1] if framework
                           else None if rank is not None else 1)  # a rank alone: the world size of the job
        if not train and sampler_drop_last and samples is not None:  # DistributedSampler drops the last N % world
            assert world_ is not None  # the sampler's world size
            samples = samples[:len(samples) // world_ * world_]
    dali_drop = is_location and train and drop_last is not False
    seed = seed if seed is not None else drawn.get("seed", _generator_seed(generator))
    # A random transform alone never reorders the data: DataLoader's shuffle defaults to False, so a dataset
    # object is shuffled only by shuffle=True or a sampler that shuffles; a location in train shuffles unless
    # told not to (shuffle=False, or a sampler that does not)
    if is_location:
        reader_shuffle = bool(train) and shuffle is not False and drawn.get("shuffle", True)
    else:
        reader_shuffle = bool(train) and bool(shuffle or drawn.get("shuffle"))
    location = files if files is not None else None if not is_location else dataset
    return DataLoaderCall(location, None if is_location else dataset, samples, classes,
                          root, augment_args, bool(train), bool(drop_last if drop_last is not None else dali_drop),
                          dali_drop, reader_shuffle, sampler, sampler_drop_last, rank_, world_, seed, batch_size,
                          keys, collate_fn, batch_transform_of(collate_fn, batch_transform, seed, form),
                          bool(drawn.get("drawn")))


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


_TRAINERS: list[weakref.ref] = []  # the Lightning trainers set up and not torn down (lightning_trainer.py)


def trainer_started(trainer: Any) -> None:
    """A Lightning Trainer began fit/validate/test/predict (its setup hook, before any *_dataloader hook)."""
    _TRAINERS.append(weakref.ref(trainer))


def trainer_ended(trainer: Any) -> None:
    _TRAINERS[:] = [ref for ref in _TRAINERS if ref() is not None and ref() is not trainer]


def lightning_shard() -> tuple[int, int] | None:
    """(rank, world size) when this loader is built while a Lightning Trainer runs (a LightningModule's or
    LightningDataModule's *_dataloader hooks) under a distributed strategy that gives DataLoaders a
    DistributedSampler (use_distributed_sampler=True, the default). Lightning re-creates only real
    DataLoaders with that sampler; DaliLoader is read here instead, so that a script swapping the class name
    keeps Lightning's sharding. The trainer is the one Lightning's callback entry point noted
    (lightning_trainer.py); a trainer interrupted before its teardown no longer counts once it stops running."""
    running = [t for t in (ref() for ref in _TRAINERS)
               if t is not None and getattr(getattr(t.state, "status", None), "value", None) == "running"]
    if not running:
        return None
    trainer = running[-1]
    connector = getattr(trainer, "_accelerator_connector", None)  # the one setting Lightning keeps no public name for
    if trainer.world_size > 1 and getattr(connector, "use_distributed_sampler", True):
        warnings.warn(f"DaliLoader built under a Lightning Trainer: rank {trainer.global_rank} of "
                      f"{trainer.world_size}, sharded as Lightning shards a DataLoader",
                      stacklevel=4)  # the DaliLoader(...) line
        return trainer.global_rank, trainer.world_size
    return None


def accelerate_shard(train: bool) -> tuple[int, int] | None:
    """(rank, world size) when Hugging Face Accelerate runs on several processes (an Accelerator, or a Trainer's,
    exists). accelerator.prepare() shards a DataLoader but hands any other loader back unchanged, so a dataset
    object is sharded here, as prepare would shard a DataLoader of it; each process reading it whole would train
    on every sample once per rank. Nothing is imported: only an Accelerate already in use counts."""
    state = sys.modules.get("accelerate.state")
    if state is None or not state.is_initialized():
        return None
    shared = state.PartialState()  # the initialised state (a shared singleton), never a new one
    process, world = shared.process_index, shared.num_processes
    if world <= 1:
        return None
    val = "" if train else (f"; val: process {process} reads slice {world - 1 - process} (the longer slices first, "
                            f"so gather_for_metrics can cut the repeats off the last step, exact on 2 processes; "
                            f"where it cannot, pass val_padding='label' and drop labels -1 after gathering)")
    warnings.warn(f"DaliLoader built under Accelerate: rank {process} of {world}, sharded as accelerator.prepare "
                  f"shards a DataLoader (prepare passes a DaliLoader through){val}",
                  stacklevel=4)  # the DaliLoader(...) line (through resolve_call and __init__)
    # Val: DALI's later slices are the longer ones (reader.ReaderModel), and gather_for_metrics keeps a prefix
    # of the last gathered step (run/accelerate_end.py): the longer slices on the first processes put the
    # repeats last. Train keeps rank = process (its slices rotate every epoch).
    return (process if train else world - 1 - process), world


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


class DataLoaderAttributes:
    """DataLoader's attributes, set as DataLoader sets them (timm, pytorch/examples and Lightning read them).
    There are no worker processes: num_workers and the rest are kept as given, and reported."""
    drop_last: bool
    collate_fn: Any
    batch_sampler: None
    num_workers: int
    pin_memory: bool
    timeout: float
    prefetch_factor: int | None
    persistent_workers: bool
    generator: Any
    worker_init_fn: None  # refused unless None (resolve_call)
    multiprocessing_context: Any
    batch_transform: BatchTransform | None  # applied to each batch after DALI (run/batch_mix.py)
    contract: Any  # contract.Contract: the batch size's one home on the loader
    device: str    # where the loader's batches come out: "gpu" or "cpu"

    @property
    def batch_size(self) -> int:
        return self.contract.batch_size

    def pins(self) -> bool:
        """pin_memory, as DataLoader honours it: CPU batches pinned where a GPU will take them."""
        import torch
        return self.pin_memory and self.device == "cpu" and torch.cuda.is_available()

    def keep_dataloader_arguments(self, call: DataLoaderCall, num_workers: int, pin_memory: bool, timeout: float,
                                  prefetch_factor: int | None, persistent_workers: bool, generator: Any,
                                  multiprocessing_context: Any) -> None:
        from torch.utils.data import default_collate
        self.drop_last, self.batch_sampler = call.drop_last, None
        self.collate_fn = call.collate_fn if call.collate_fn is not None else default_collate
        self.batch_transform = call.batch_transform
        self.num_workers, self.pin_memory, self.timeout = num_workers, pin_memory, timeout
        self.prefetch_factor, self.persistent_workers, self.generator = prefetch_factor, persistent_workers, generator
        self.worker_init_fn, self.multiprocessing_context = None, multiprocessing_context


class EpochRequests:
    """The epochs a script asks for: loader.set_epoch(e), or set_epoch on the DistributedSampler it passed
    (seen as a change of the sampler's epoch). DALI reshuffles every epoch by itself; in train, an epoch
    ahead of the loader's own, asked before that epoch starts, moves the loader there (a script that
    resumes its model at epoch E calls it)."""

    def __init__(self, sampler: Any) -> None:
        self._sampler, self._seen = sampler, getattr(sampler, "epoch", None)
        self._requested: int | None = None

    def set(self, epoch: int) -> None:
        self._requested = int(epoch)

    def take(self) -> int | None:
        """The epoch asked for since the last take, or None."""
        requested, self._requested = self._requested, None
        if self._sampler is not None and getattr(self._sampler, "epoch", None) != self._seen:
            requested = self._seen = self._sampler.epoch
        return requested


class DatasetView:
    """`loader.dataset` of a loader built from a location: len() is the number of samples, with
    `classes`, `class_to_idx`, `samples` and `targets` where the source knows them."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.root = str(source.location)
        if source.classes is not None:
            self.classes = list(source.classes)
            self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        if source.labels is not None:
            self.samples = list(zip(source.files, source.labels))
            self.targets = list(source.labels)

    def __len__(self) -> int:
        return self.source.num_samples

    def __repr__(self) -> str:
        return f"DatasetView({self.root!r}, {len(self)} samples)"


class SamplerView:
    """`loader.sampler` when none was given: len() is this rank's samples per epoch, set_epoch(e)
    reaches the loader (timm's and Lightning's epoch probes call it)."""

    def __init__(self, loader: Any) -> None:
        # A weak reference: the loader owns this view, and a cycle back to it would leave a dropped loader
        # (and its DALI pipeline's threads and buffers) to the cycle collector instead of freeing it at once.
        self._loader = weakref.proxy(loader)

    def __len__(self) -> int:
        loader = self._loader
        cut = loader._cut()  # DataLoader's count, repeats included; what is yielded where the count is not
        return cut.count if loader.contract.dali_drop or loader.val_padding == "none" else cut.per_rank

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)
