"""The baseline users run today: torch DataLoader + a distributed sampler + PIL decoding, with
the same transforms as the DALI graphs (torchvision's RandomResizedCrop / flip / normalise for
train, resize + centre crop for val), written with PIL and numpy so that torchvision is not needed.

TorchLoader has DaliLoader's surface (len, set_epoch, state_dict, samples_per_epoch), so one
training loop drives either, and follows the same epoch contract: train drops the tail so that
every rank runs (N // world_size) // batch_size batches; val gives each sample to exactly one rank.
"""

from __future__ import annotations

import io
import math
import random
from typing import Iterator

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler

from dali_pipes.data.formats import read_sample
from dali_pipes.data.labels import check_label, label_bound
from dali_pipes.data.samples import PADDING_LABEL, SampleKeys
from dali_pipes.data.source import Source, open_source, with_num_classes
from dali_pipes.graph.augment_config import AugmentConfig
from dali_pipes.run.dist import Shard


def random_resized_crop_box(width: int, height: int, area: tuple[float, float], ratio: tuple[float, float],
                            rng: random.Random) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params: (left, top, w, h), centre-crop fallback."""
    total = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = total * rng.uniform(*area)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


# The settings that change a mode's images in DaliLoader's graph, and the values ImageTransform does: any other value
# would be ignored here, and a comparison of the two loaders would compare two recipes.
DONE_HERE = {"interpolation": ("bilinear",), "exif_orientation": (None, False), "png16": (None, "pil")}
DONE_IN_TRAIN = {"color_jitter": (0.0,), "auto_augment": (None,), "random_erasing": (0.0,)}
DONE_IN_VAL = {"val_stretch": (False,)}


def not_implemented(cfg: AugmentConfig, train: bool) -> list[str]:
    """`cfg`'s settings (as name=value) that change this mode's images and that ImageTransform does not do."""
    done = {**DONE_HERE, **(DONE_IN_TRAIN if train else DONE_IN_VAL)}
    return [f"{name}={getattr(cfg, name)!r}" for name, values in done.items() if getattr(cfg, name) not in values]


class ImageTransform:
    """PIL image -> normalised float32 CHW tensor, train or val, as the DALI graphs do."""

    def __init__(self, cfg: AugmentConfig, train: bool) -> None:
        if not isinstance(cfg.image_size, int):
            raise ValueError(f"ImageTransform makes one size, got the schedule {cfg.image_size}: pass "
                             f"cfg.for_epoch(epoch, train)")
        missing = not_implemented(cfg, train)
        if missing:
            raise ValueError(f"TorchLoader (the DataLoader + PIL baseline) does not implement {', '.join(missing)}: "
                             f"it would ignore them, and a comparison would compare two recipes. Leave them at their "
                             f"defaults for the baseline, or use DaliLoader")
        self.cfg, self.train, self.size = cfg, train, cfg.image_size
        self.mean = np.array(cfg.mean, np.float32) * 255
        self.std = np.array(cfg.std, np.float32) * 255

    def __call__(self, img: Image.Image, rng: random.Random) -> torch.Tensor:
        size = self.size
        if self.train:
            left, top, w, h = random_resized_crop_box(img.width, img.height, self.cfg.random_area,
                                                      self.cfg.random_aspect_ratio, rng)
            img = img.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
            if rng.random() < self.cfg.flip_probability:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        else:
            short = round(size / self.cfg.crop_ratio)
            scale = short / min(img.size)
            img = img.resize((max(short, round(img.width * scale)), max(short, round(img.height * scale))),
                             Image.Resampling.BILINEAR)
            left, top = round((img.width - size) / 2), round((img.height - size) / 2)
            img = img.crop((left, top, left + size, top + size))
        pixels = (np.asarray(img, np.float32) - self.mean) / self.std
        return torch.from_numpy(pixels.transpose(2, 0, 1).copy())


class SourceDataset(Dataset):
    """Map-style dataset over any Source: reads, decodes with PIL, transforms."""

    def __init__(self, source: Source, transform: ImageTransform, seed: int) -> None:
        self.refs, self.transform, self.seed = source.refs(), transform, seed
        self.bound = label_bound(source)  # (count, what sets it): a label at or above fails, named

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = key  # the sampler sends the epoch along: workers hold stale dataset copies
        sample = read_sample(self.refs[index])
        if sample.label != PADDING_LABEL:  # an excluded sample's placeholder: ignored by the loss
            check_label(sample.label, sample.origin, num_classes=self.bound[0], classes_from=self.bound[1])
        with Image.open(io.BytesIO(sample.data)) as img:
            rng = random.Random(hash((self.seed, epoch, index)))  # reproducible per sample and epoch
            return self.transform(img.convert("RGB"), rng), sample.label


class ShardSampler(Sampler[tuple[int, int]]):
    """DistributedSampler's split without its padding. train: a seeded permutation per epoch, rank r
    takes every world_size-th index of the first (N // world_size) * world_size; val: rank r takes
    indices r, r + world_size, ... (each sample on exactly one rank). `start` skips samples on resume.
    Yields (epoch, index) so that augmentation in worker processes knows the epoch."""

    def __init__(self, num_samples: int, shard: Shard, train: bool, seed: int) -> None:
        self.num_samples, self.shard, self.train, self.seed = num_samples, shard, train, seed
        self.epoch, self.start = 0, 0

    def indices(self) -> list[int]:
        if not self.train:
            return list(range(self.shard.rank, self.num_samples, self.shard.world_size))
        order = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        usable = self.num_samples // self.shard.world_size * self.shard.world_size
        return order[:usable][self.shard.rank::self.shard.world_size].tolist()

    @property
    def per_epoch(self) -> int:
        """Indices this rank gets per epoch, without drawing the permutation."""
        if self.train:
            return self.num_samples // self.shard.world_size
        return self.shard.size_of_strided(self.num_samples)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((self.epoch, i) for i in self.indices()[self.start:])

    def __len__(self) -> int:
        return self.per_epoch - self.start


class TorchLoader:
    """DataLoader + ShardSampler + PIL, with DaliLoader's surface."""

    supports_elastic = False  # resumes on its own world size only

    def __init__(self, source: Source | str, *, batch_size: int, train: bool, rank: int | None = None,
                 world_size: int | None = None, image_size: int = 224, seed: int = 0, num_workers: int = 4,
                 pin_memory: bool = True, persistent_workers: bool = True, augment: AugmentConfig | None = None,
                 prefetch_factor: int = 2, keys: SampleKeys | None = None, num_classes: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.source = with_num_classes(source, num_classes) if isinstance(source, Source) else \
            open_source(source, keys=keys, num_classes=num_classes)
        self.shard = Shard.from_env(rank, world_size)
        self.train, self.batch_size = train, batch_size
        augment = augment or AugmentConfig(image_size=image_size)
        if train and not isinstance(augment.image_size, int):  # its workers hold one transform for the whole run
            raise ValueError(f"TorchLoader trains at one image size, got the schedule {augment.image_size}; "
                             f"progressive resizing needs DaliLoader (python -m train --loader dali)")
        self.augment = augment.for_epoch(0, train)  # val: val_image_size, or the schedule's last size
        self.image_size = augment.size_at(0) if train else augment.val_size  # self.augment's one size
        self.dataset = SourceDataset(self.source, ImageTransform(self.augment, train), seed)
        self.sampler = ShardSampler(len(self.dataset), self.shard, train, seed)
        self.loader: DataLoader | None = None  # None once closed
        self.loader = DataLoader(self.dataset, batch_size=batch_size, sampler=self.sampler, drop_last=train,
                                 num_workers=num_workers, pin_memory=pin_memory and torch.cuda.is_available(),
                                 persistent_workers=persistent_workers and num_workers > 0,
                                 prefetch_factor=prefetch_factor if num_workers > 0 else None)
        self.epoch, self._position = 0, 0
        self.bad_samples: list = []  # PIL raises on a bad image; nothing is excluded here

    def __len__(self) -> int:
        n = self.sampler.per_epoch
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    @property
    def num_samples(self) -> int:
        return len(self.dataset)

    @property
    def samples_per_epoch(self) -> int:
        return len(self) * self.batch_size if self.train else self.sampler.per_epoch

    @property
    def next_batch(self) -> tuple[int, int]:
        """(epoch, batch index) of the next batch this loader yields."""
        if self._position >= len(self):
            return self.epoch + 1, 0
        return self.epoch, self._position

    def set_epoch(self, epoch: int) -> None:
        self.requested_epoch = epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.sampler.epoch = self.epoch
        self.sampler.start = self._position * self.batch_size
        if self.loader is None:
            raise ValueError("the loader is closed (close() was called): make a new one")
        for images, labels in self.loader:
            self._position += 1
            yield images, labels
        self.epoch, self._position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        epoch, position = self.next_batch
        return {"epoch": epoch, "position": position, "rank": self.shard.rank, "world_size": self.shard.world_size}

    def load_state_dict(self, state: dict) -> None:
        if (state["rank"], state["world_size"]) != (self.shard.rank, self.shard.world_size):
            raise ValueError(f"loader state of rank {state['rank']}/{state['world_size']} given to rank "
                             f"{self.shard.rank}/{self.shard.world_size}")
        self.epoch, self._position = state["epoch"], state["position"]

    def close(self) -> None:
        self.loader = None
