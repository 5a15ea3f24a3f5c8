"""DetectionLoader: what DaliLoader(dataset, ...) is when `dataset` is torchvision's CocoDetection as the detection
references build it (data/detection_dataset.py): DataLoader's call, batches of (images, targets) drawn from the
same sampler in DataLoader's order, the transform translated into the detection graph.

    data_loader = DaliLoader(dataset, batch_sampler=train_batch_sampler, num_workers=args.workers,
                             collate_fn=utils.collate_fn)       # the references' line, renamed
    for images, targets in data_loader:                         # tuples: images (3, H, W) float, target dicts

Each epoch draws `iter(batch_sampler)` in the main process when iteration begins, after the base seed DataLoader's
iterator draws (so the sampler sees the same random stream as under DataLoader); each drawn batch is one DALI
iteration. The collate_fn runs on the delivered (image, target) pairs, as DataLoader runs it on its samples.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import warnings
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, default_collate

from dali_pipes.data.detection_dataset import DetectionDataset, read_detection_dataset
from dali_pipes.data.detection_location import open_detection_location
from dali_pipes.graph.detection import DetectionAugment
from dali_pipes.graph.detection_transforms import detection_augment, preset_augment
from dali_pipes.run.detection import TARGET_KEYS, DetectionRun, TargetForm
from dali_pipes.run.detection_state import (
    BadImages,
    ImageReader,
    dataset_identity,
    epoch_rest,
    loader_state,
    old_ranks,
    opened_state,
    own_generators,
    rank_state,
    read_file,
)
from dali_pipes.run.dist import Shard
from dali_pipes.run.machine import default_threads
from dali_pipes.run.pipeline import rank_seed
from dali_pipes.storage import remote, remote_urls

MASKS_NOT_DELIVERED = ("the v1 target conversion (ConvertCocoPolysToMask) builds masks from polygons; DaliLoader "
                       "delivers the box targets (boxes, labels, image_id, area, iscrowd) without masks, which box "
                       "models (Faster R-CNN, RetinaNet, FCOS, SSD) never read")


class DetectionLoader:
    """(images, targets) batches of a detection dataset, as DataLoader gives them with the references' collate_fn."""

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None, sampler: Any = None,
                 batch_sampler: Any = None, num_workers: int = 0, collate_fn: Any = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Any = None,
                 multiprocessing_context: Any = None, generator: Any = None, *, prefetch_factor: int | None = None,
                 persistent_workers: bool = False, pin_memory_device: str = "", in_order: bool = True,
                 device: str = "cpu", seed: int | None = None, num_threads: int | None = None,
                 skip_bad: bool = False, max_bad: int | float | None = None) -> None:
        self.dataset, self.num_workers, self.pin_memory, self.timeout = dataset, num_workers, pin_memory, timeout
        self.generator, self.collate_fn = generator, collate_fn if collate_fn is not None else default_collate
        self.batch_sampler, self.sampler, self.drop_last = batch_sampler_of(
            dataset, batch_size, shuffle, sampler, batch_sampler, drop_last, generator)
        self._batches_given = batch_sampler is not None  # DataLoader's batch_size is then None
        read = read_detection_dataset(dataset)
        augment, has_masks = detection_augment(read.transforms)
        if has_masks:
            warnings.warn(MASKS_NOT_DELIVERED, UserWarning, stacklevel=3)
        self.device = device
        most = getattr(self.batch_sampler, "batch_size", None)  # read from its home; DALI's batch, the state's record
        if not isinstance(most, numbers.Integral) or most < 1:
            raise ValueError(f"{type(self.batch_sampler).__name__}: a batch_sampler whose batch_size is {most!r}; "
                             f"DaliLoader sizes its pipeline by the largest batch: give the sampler a positive int "
                             f"`.batch_size`")
        most = int(most)
        self._seed, self._rank = seed if seed is not None else torch.initial_seed() % (1 << 31), rank_of(self.sampler)
        self._world = world_of(self.sampler)
        self._start(read.samples, augment, target_form(read), read.where, batch_size=most,
                    seed=seed_of_rank(self._seed, self._rank),
                    num_threads=num_threads or num_workers or default_threads(), skip_bad=skip_bad, max_bad=max_bad)

    def _start(self, samples: list, augment: DetectionAugment, form: TargetForm, where: str, *, batch_size: int,
               seed: int, num_threads: int, skip_bad: bool, max_bad: int | float | None,
               read: ImageReader = read_file) -> None:
        """The run over `samples` (where: the dataset, for messages), its bad-image policy and resume identity."""
        self._bad = BadImages(skip=skip_bad, max_bad=max_bad, num_images=len(samples), device=self.device, read=read)
        self._new_run = functools.partial(DetectionRun, samples, augment, form, batch_size=batch_size,
                                          device=self.device, num_threads=num_threads, seed=seed, bad=self._bad,
                                          read=read)
        self.run = self._new_run()
        self._identity, self._where = dataset_identity(samples, batch_size, seed), where
        self._epoch = -1  # the epoch begun; its drawn order; where a resume starts in it
        self._batches: list[list[int]] | None = None
        self._resume_at: int | None = None

    def __len__(self) -> int:
        return len(self.batch_sampler)

    @property
    def batch_size(self) -> int | None:
        """DataLoader's: the batch sampler's (the batch size's one home), None where a batch_sampler was given."""
        return None if self._batches_given else self.batch_sampler.batch_size

    def __iter__(self) -> Iterator[Any]:
        start, self._resume_at = self._resume_at, None
        if start is None or self._batches is None:  # a new epoch (else: the rest of a resumed one, not drawn again)
            self._batches = self._draw()
            self._epoch, start = self._epoch + 1, 0
        for items in self.run.epoch(self._batches, start):
            yield self.collate_fn(items)

    def _draw(self) -> list[list[int]]:
        """The epoch's batches. DataLoader's iterator draws its base seed first, then the sampler draws: the same
        random stream here."""
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        return [[int(i) for i in batch] for batch in self.batch_sampler]

    @property
    def bad_samples(self) -> list:
        """The images excluded so far (skip_bad=True), each naming its file and image id."""
        return list(self._bad.bad_samples)

    def state_dict(self) -> dict:
        """Where the loader is, between batches: the epoch's drawn order and position, DALI's random state, the
        sampler's generators and the excluded images (run/detection_state.py)."""
        # Unfinished: the next iteration gives the rest of this epoch. Not told by the position alone: an elastic
        # resume's share of the rest may be empty (position 0 of no batches) and must still be run in step
        unfinished = self._resume_at is not None or (self._batches is not None
                                                     and self.run.position < len(self._batches))
        return loader_state(identity=self._identity, epoch=self._epoch, position=self.run.position,
                            batches=self._batches, generators=own_generators(self.batch_sampler, self.generator),
                            checkpoint=self.run.checkpoint(), bad=self._bad, rank=self._rank,
                            world_size=self._world, unfinished=unfinished)

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Go on where `state` was taken: the next iteration gives the rest of its epoch, then new epochs. Given
        every old rank's state in rank order, also on another world size where the sampler's draw does not depend
        on it (run/detection_state.py's rank_state)."""
        state, took = rank_state(state, rank=self._rank, world_size=self._world,
                                 batch_sampler=self.batch_sampler)
        identity = {**self._identity, "seed": seed_of_rank(self._seed, took)}  # the old rank's DALI seed
        checkpoint, state = opened_state(state, identity, self._where,
                                         own_generators(self.batch_sampler, self.generator))
        self._bad.restore(state["bad_samples"])
        self.run.close()
        # Another rank's DALI state would give this rank that rank's very flips and crops (rank_of: ranks must not
        # draw alike): a rank that replays another's draw draws its augmentations from its own seed
        self.run = self._new_run(checkpoint=checkpoint if took == self._rank else None)
        self._epoch, self._batches, self.run.position = state["epoch"], state["batches"], state["position"]
        unfinished = self._batches is not None and bool(  # states written before "unfinished": by the position
            state.get("unfinished", state["position"] < len(self._batches)))
        self._resume_at = state["position"] if unfinished else None

    def close(self) -> None:
        self.run.close()


def seed_of_rank(seed: int, rank: int) -> int:
    """Rank `rank`'s DALI seed: `seed` itself on rank 0 (one process draws as it always has), another per rank
    after it (run/pipeline.py's rank_seed)."""
    return seed if rank == 0 else rank_seed(seed, rank)


def rank_of(sampler: Any) -> int:
    """This process's rank, for its own DALI seed (ranks seeded alike, as torch.manual_seed on every rank seeds
    them, must not flip or crop the same positions alike): the sampler's (a DistributedSampler's), else the
    process group's, else 0."""
    rank = getattr(sampler, "rank", None)
    if isinstance(rank, int):
        return rank
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def world_of(sampler: Any) -> int:
    """The number of ranks: the sampler's num_replicas (a DistributedSampler's), else the process group's, else 1."""
    replicas = getattr(sampler, "num_replicas", None)
    if isinstance(replicas, int):
        return replicas
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def target_form(read: DetectionDataset) -> TargetForm:
    """The targets' keys: the v1 conversion's (masks left out, with a warning), or the v2 wrapper's target_keys;
    masks, segmentations and the raw COCO keys refused by name."""
    refused = [key for key in read.target_keys if key not in TARGET_KEYS]
    if refused:
        raise ValueError(f"{read.where}: wrap_dataset_for_transforms_v2(target_keys=...) asks for {refused}; "
                         f"DaliLoader delivers {list(TARGET_KEYS)} (masks and keypoints, for Mask R-CNN and "
                         f"Keypoint R-CNN, are not supported). Leave them out of target_keys, or use torch's "
                         f"DataLoader")
    keys = tuple(k for k in read.target_keys if k in TARGET_KEYS)
    return TargetForm(keys=keys, empty_has_boxes=read.form == "v1")


def batch_sampler_of(dataset: Any, batch_size: int | None, shuffle: bool | None, sampler: Any, batch_sampler: Any,
                     drop_last: bool, generator: Any) -> tuple[Any, Any, bool]:
    """(batch_sampler, sampler, drop_last) as DataLoader makes them of the same arguments (the batch size kept in
    the batch sampler alone)."""
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
                             "drop_last (as DataLoader says)")
        return batch_sampler, getattr(batch_sampler, "sampler", None), False
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle (as DataLoader says)")
    if batch_size is None:
        raise ValueError("batch_size=None (unbatched samples) is not supported for detection: pass a batch_size "
                         "and the references' collate_fn")
    if sampler is None:
        sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
    return BatchSampler(sampler, batch_size, drop_last), sampler, drop_last


def references_collate(batch: list) -> tuple:
    """torchvision's detection references' utils.collate_fn: (images, targets) as tuples."""
    return tuple(zip(*batch))


VAL_PADDINGS = ("repeat", "none")


class RankSlices:
    """This rank's batches of a location's images each epoch, the dali_pipes way (loader.py's epoch contract):
    train shuffles all images by (seed, epoch), the same on every rank, and gives rank r every world_size-th one
    from r, each rank the same count (N // world_size: the tail left out), in full batches unless drop_last=False;
    val keeps the images' order, each rank every world_size-th one, padded by repeating the first images to the
    same count on every rank (val_padding="repeat", as DistributedSampler(shuffle=False)) or not ("none": each
    image exactly once across ranks), the last batch short."""

    def __init__(self, num_images: int, batch_size: int, *, train: bool, shuffle: bool, drop_last: bool,
                 rank: int, world_size: int, seed: int, val_padding: str) -> None:
        if val_padding not in VAL_PADDINGS:
            raise ValueError(f"val_padding must be one of {', '.join(VAL_PADDINGS)} for detection, got {val_padding!r}")
        self.num_images, self.batch_size, self.train, self.shuffle = num_images, batch_size, train, shuffle
        self.drop_last, self.rank, self.world_size, self.seed = drop_last, rank, world_size, seed
        self.val_padding, self.epoch = val_padding, 0

    @property
    def num_replicas(self) -> int:
        """DistributedSampler's name for the world size: each rank's slice depends on it (the dataset form's
        elastic resume refuses such a sampler; the location form splits the rest of the epoch: remainder)."""
        return self.world_size

    def order(self) -> np.ndarray:
        """Every image of the epoch, in its order: shuffled by (seed, epoch) in train, as stored in val."""
        n = self.num_images
        return np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle else np.arange(n)

    def share(self, order: np.ndarray, rank: int | None = None) -> list[int]:
        """Rank `rank`'s (default: this rank's) images of `order`: every world_size-th one, train cut to an equal
        count per rank, val padded with repeats (val_padding="repeat") or not."""
        n, world = len(order), self.world_size
        if self.train:
            order = order[:n // world * world]
        elif self.val_padding == "repeat" and n % world:
            order = np.resize(order, -(-n // world) * world)  # repeats from the start, as DistributedSampler pads
        return [int(i) for i in order[(self.rank if rank is None else rank)::world]]

    def indices(self) -> list[int]:
        return self.share(self.order())

    def batched(self, mine: list[int]) -> list[list[int]]:
        size = self.batch_size
        ends = len(mine) // size * size if self.drop_last else len(mine)
        return [mine[i:i + size] for i in range(0, ends, size)]

    def remainder(self, pending: set[int], rank: int | None = None) -> list[list[int]]:
        """An elastic resume's part of the interrupted epoch (self.epoch) for rank `rank` (default: this one):
        the `pending` images (those no old rank delivered), in the epoch's order, split over this world size as
        an epoch is (share), in batches."""
        rest = np.array([i for i in self.order() if int(i) in pending], dtype=np.int64)
        return self.batched(self.share(rest, rank))

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batched(self.indices()))

    def __len__(self) -> int:
        count = len(self.indices())
        return count // self.batch_size if self.drop_last else -(-count // self.batch_size)


class DetectionLocationLoader(DetectionLoader):
    """DaliLoader(location, ...) over detection data: a COCO JSON (images=: its image folder or store prefix) or
    detection shards (data/detection_location.py), this rank's slice (RankSlices), the references' preset named
    by `data_augmentation` in train mode, their eval preset otherwise, batches as the references' collate_fn
    makes them (tuples of images (3, H, W) float in [0, 1] and target dicts)."""

    def __init__(self, location: Any, batch_size: int = 1, shuffle: bool | None = None, *,
                 collate_fn: Any = None, drop_last: bool | None = None, train: bool | None = None,
                 images: str | None = None, data_augmentation: str = "hflip", val_padding: str = "repeat",
                 device: str = "cpu", rank: int | None = None, world_size: int | None = None,
                 seed: int | None = None, num_threads: int | None = None, num_workers: int = 0,
                 skip_bad: bool = False, max_bad: int | float | None = None,
                 store: remote.ClientOptions | None = None) -> None:
        train = bool(shuffle) if train is None else train
        shard = Shard.from_env(rank, world_size)
        found = open_detection_location(location, images, keep_empty=not train, options=store)
        augment = preset_augment(data_augmentation, train)
        self.dataset, self.num_workers, self.pin_memory, self.timeout, self.generator = location, 0, False, 0, None
        self.collate_fn, self.device, self.train = collate_fn or references_collate, device, train
        self.batch_sampler = RankSlices(len(found.samples), batch_size, train=train,
                                        shuffle=train if shuffle is None else shuffle,
                                        drop_last=train if drop_last is None else drop_last, rank=shard.rank,
                                        world_size=shard.world_size, seed=seed or 0, val_padding=val_padding)
        self.sampler, self.drop_last, self._batches_given = None, self.batch_sampler.drop_last, False
        self.samples = found.samples  # what the loader's indices index: image ids, boxes, labels as read
        self._seed, self._rank, self._world = seed or 0, shard.rank, shard.world_size
        self._start(found.samples, augment, TargetForm(), found.where, batch_size=batch_size,
                    seed=seed_of_rank(self._seed, shard.rank), num_threads=num_threads or num_workers or
                    default_threads(), skip_bad=skip_bad, max_bad=max_bad, read=found.image_bytes)

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """As the dataset form's; given every old rank's states on another world size (an elastic resume), this
        rank's share of the images no old rank delivered in their epoch (RankSlices.remainder), drawn afresh from
        this rank's seed, then this world size's epochs; the old ranks' bad images merged."""
        states = old_ranks(state, self._world)
        if states is None:
            super().load_state_dict(state)
            return
        for old in states:  # each fits: the dataset, batch size and its own rank's seed (no DALI state is kept)
            opened_state(old, {**self._identity, "seed": seed_of_rank(self._seed, old["rank"])}, self._where, [])
        self._bad.restore(BadImages.merge(states))
        slices, pending, self._epoch = self.batch_sampler, epoch_rest(states), states[0]["epoch"]
        slices.epoch = self._epoch
        self.run.close()
        self.run = self._new_run()
        self._batches = slices.remainder(pending) if pending else []
        any_rank = pending and slices.remainder(pending, rank=0)  # rank 0's share is the largest
        self._resume_at = 0 if any_rank else None  # else every rank goes on with the next epoch

    def _draw(self) -> list[list[int]]:
        """The next epoch's slice: its order drawn from (seed, epoch), never from torch's global stream."""
        self.batch_sampler.epoch = self._epoch + 1
        return list(self.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        """As DistributedSampler's: the next epoch drawn is `epoch` (between epochs; else from the next one on)."""
        self._epoch = epoch - 1 if self._resume_at is None else self._epoch


def detection_location_loader(location: Any, *args: Any, **kwargs: Any) -> DetectionLocationLoader:
    """DaliLoader(location, ...) for detection data: DaliLoader's keywords that mean nothing here refused by name
    (the loader's storage options taken as a ClientOptions)."""
    store = remote.ClientOptions.of(kwargs.pop("storage_attempts", None), kwargs.pop("storage_timeout", None),
                                    deadline=kwargs.pop("download_deadline", None))
    known = set(inspect.signature(DetectionLocationLoader.__init__).parameters) - {"self", "location", "store"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"{remote_urls.identity(str(location))}: DaliLoader over detection data takes no "
                        f"{', '.join(unknown)}; its keywords: {', '.join(sorted(known))} "
                        f"(docs/detection.md#by-location)")
    return DetectionLocationLoader(location, *args, store=store, **kwargs)
