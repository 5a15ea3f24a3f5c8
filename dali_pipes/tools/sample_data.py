"""The built-in ImageNet-like dataset, made from real photographs that ship inside PyPI packages.

At benchmark scale (issue 28: epochs that last seconds on a GPU), `dali-pipes sample OUT --classes 1000
--train-per-class 50 --tfrecord-shards 64` writes 50,000 train images (and val) as a folder and, with
`write_tfrecord_copy`, as TFRecord shards.

Why not noise or flat colours: decoders and augmentations run at realistic speed only on
realistic JPEGs (photographic content, ImageNet-like sizes and qualities). Each class is one
source photograph (classes beyond the number of photographs get a distinct colour cast), and
each image a random crop of it at a random scale, flipped, colour-jittered, with a little
sensor noise, saved at JPEG quality 75-95 with sides of about 250-600 px. Everything is drawn
from a generator seeded by (seed, split, class, index): the same seed gives the same bytes.
"""

from __future__ import annotations

import importlib.util
import io
import os
import sys
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter
from tqdm import tqdm

from dali_pipes.errors import install_hint
from dali_pipes.options import option
from dali_pipes.tools.workers import process_pool

# (package, file inside the package) of colour photographs, then greyscale ones.
PHOTOS = (
    ("skimage", "data/astronaut.png"), ("skimage", "data/chelsea.png"), ("skimage", "data/coffee.png"),
    ("skimage", "data/rocket.jpg"), ("skimage", "data/motorcycle_left.png"),
    ("skimage", "data/hubble_deep_field.jpg"), ("skimage", "data/retina.jpg"), ("skimage", "data/ihc.png"),
    ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
    ("skimage", "data/motorcycle_right.png"), ("skimage", "data/camera.png"), ("skimage", "data/brick.png"),
    ("skimage", "data/grass.png"), ("skimage", "data/gravel.png"), ("skimage", "data/moon.png"),
)
SPLITS = {"train": 0, "val": 1}


@dataclass(frozen=True)
class SampleDatasetConfig:
    """The built-in dataset's size and look; every field is also a flag of `dali-pipes sample`."""
    classes: int = option(10, "classes (one source photograph each; beyond 15, photographs repeat with a colour cast)")
    train_per_class: int = option(100, "train images per class")
    val_per_class: int = option(20, "val images per class")
    seed: int = option(0, "the same seed gives the same bytes")
    min_side: int = option(250, "shortest image side in pixels")
    max_side: int = option(600, "longest image side in pixels")
    noise_sigma: tuple[float, float] = option((12.0, 18.0), "sensor grain, low high: with sharpening, gives "
                                              "ImageNet-like file sizes")

    def __post_init__(self) -> None:
        if self.classes < 1 or self.train_per_class < 0 or self.val_per_class < 0:
            raise ValueError(f"need classes >= 1 and images per class >= 0, got classes={self.classes}, "
                             f"train_per_class={self.train_per_class}, val_per_class={self.val_per_class}")
        if not 0 < self.min_side <= self.max_side:
            raise ValueError(f"need 0 < min_side <= max_side, got {self.min_side} and {self.max_side}")


EXTRA = install_hint("sample")  # installs the packages that ship the photographs


def photo_path(package: str, relative: str) -> str:
    """A file shipped inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{package} is not installed; it ships the photographs of the built-in "
                                  f"dataset. Install it with: {EXTRA}", name=package)
    return os.path.join(list(spec.submodule_search_locations)[0], relative)


def check_photos(classes: int) -> None:
    """Raise ModuleNotFoundError (naming the extra to install) unless the photographs of the
    first `classes` classes are installed; checked before any worker starts."""
    for package, relative in dict.fromkeys(PHOTOS[:classes]):
        path = photo_path(package, relative)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: photograph missing from the installed {package}. "
                                    f"Reinstall it with: {EXTRA}")


@lru_cache(maxsize=None)
def load_photo(index: int) -> np.ndarray:
    with Image.open(photo_path(*PHOTOS[index % len(PHOTOS)])) as img:
        return np.asarray(img.convert("RGB"))


def class_name(label: int) -> str:
    package, relative = PHOTOS[label % len(PHOTOS)]
    stem = os.path.splitext(os.path.basename(relative))[0]
    return f"{label:04d}_{stem}"


def make_image(cfg: SampleDatasetConfig, split: str, label: int, index: int) -> bytes:
    """One JPEG of class `label`: a jittered random crop of the class's photograph."""
    rng = np.random.default_rng([cfg.seed, SPLITS[split], label, index])
    photo = load_photo(label)
    h, w = photo.shape[:2]
    # Random crop: 20-100% of the area, aspect 3/4-4/3 (like the crops that ImageNet photos are).
    area = h * w * rng.uniform(0.2, 1.0)
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    ch, cw = min(h, int(round(np.sqrt(area / aspect)))), min(w, int(round(np.sqrt(area * aspect))))
    y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    img = Image.fromarray(photo[y:y + ch, x:x + cw])
    # Output size: longer side up to max_side, shorter side at least min_side (crops are <= 4:3).
    scale = rng.integers(int(cfg.min_side * 4 / 3), cfg.max_side + 1) / max(ch, cw)
    scale = max(scale, cfg.min_side / min(ch, cw))
    img = img.resize((round(cw * scale), round(ch * scale)), Image.Resampling.BICUBIC)
    # Upscaled crops are softer than photographs; sharpening restores detail (and file size).
    img = img.filter(ImageFilter.UnsharpMask(radius=2, percent=int(rng.integers(60, 160)), threshold=2))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    img = _colour_jitter(img, rng, cast=label // len(PHOTOS))
    pixels = np.asarray(img, np.float32)
    pixels = pixels + rng.normal(0, rng.uniform(*cfg.noise_sigma), pixels.shape).astype(np.float32)
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=_jpeg_quality(rng))
    return out.getvalue()


def _jpeg_quality(rng: np.random.Generator) -> int:
    """75-95, most near 95: web photographs (ImageNet's sources) are mostly saved at high quality."""
    return int(95 - 20 * rng.random() ** 3)


def _colour_jitter(img: Image.Image, rng: np.random.Generator, cast: int) -> Image.Image:
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        img = enhance(img).enhance(rng.uniform(0.7, 1.3))
    if cast:  # classes that reuse a photograph get their own colour cast
        tint = np.array([(cast * 67) % 256, (cast * 151) % 256, (cast * 29) % 256], np.float32)
        img = Image.fromarray((np.asarray(img, np.float32) * 0.7 + tint * 0.3).astype(np.uint8))
    return img


def _write_one(args: tuple[SampleDatasetConfig, str, str, int, int]) -> int:
    cfg, root, split, label, index = args
    data = make_image(cfg, split, label, index)
    path = os.path.join(root, split, class_name(label), f"{split}_{label:04d}_{index:05d}.jpg")
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def make_sample_dataset(root: str, cfg: SampleDatasetConfig = SampleDatasetConfig(), *,
                        workers: int | None = None, progress: bool = True) -> dict:
    """Write ROOT/train/<class>/*.jpg and ROOT/val/<class>/*.jpg; returns counts and mean bytes.

    Needs scikit-image and matplotlib (`pip install '.[sample]'` from the checkout), which ship the photographs;
    neither is imported."""
    check_photos(cfg.classes)
    jobs = []
    for split, per_class in (("train", cfg.train_per_class), ("val", cfg.val_per_class)):
        for label in range(cfg.classes):
            os.makedirs(os.path.join(root, split, class_name(label)), exist_ok=True)
            jobs += [(cfg, root, split, label, i) for i in range(per_class)]
    with process_pool(workers) as pool:
        sizes = list(tqdm(pool.map(_write_one, jobs, chunksize=16), total=len(jobs), desc="making images",
                          unit="img", file=sys.stderr, disable=None if progress else True))
    return {"images": len(sizes), "train": cfg.classes * cfg.train_per_class,
            "val": cfg.classes * cfg.val_per_class, "mean_bytes": int(np.mean(sizes)) if sizes else 0}


def write_tfrecord_copy(root: str, shards: int, *, workers: int | None = None, progress: bool = True) -> dict:
    """The dataset at ROOT (train/ and val/ image folders) also as TFRecord shards with their indexes:
    ROOT/tfrecord/train/train-*-of-*.tfrecord and ROOT/tfrecord/val/val-*, `shards` each at most (one per
    sample at least), through the converter (convert.py: parallel, with a progress bar). Returns
    {split: ConvertStats}. A copy made before is replaced."""
    from dali_pipes.data.source import open_source
    from dali_pipes.tools.convert import write_tfrecords
    out = {}
    for split in ("train", "val"):
        folder = os.path.join(root, split)
        if not os.path.isdir(folder) or not os.listdir(folder):
            continue
        source = open_source(folder)
        out[split] = write_tfrecords(source, os.path.join(root, "tfrecord", split), prefix=split,
                                     shards=max(1, min(shards, source.num_samples)), workers=workers,
                                     progress=progress, overwrite=True)
    return out
