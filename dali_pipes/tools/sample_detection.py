"""The built-in detection set: photographs of objects pasted onto photographed backgrounds, each paste's box
known, written as COCO JSON + an image folder (`dali-pipes sample OUT --detection`), for the tests and the docs.

The photographs are the classification sample's (sample_data.PHOTOS, shipped inside scikit-image and
matplotlib). Each category is one object photograph (the astronaut, the cat, the coffee cup, ...); each image a
crop of a texture photograph (grass, gravel, brick, the moon, the Hubble deep field) with 0 to `max_objects`
objects pasted, each a whole object photograph scaled to 15-50% of the image's shorter side, maybe flipped,
placed where it overlaps no earlier one (a paste that finds no free place in 20 draws is left out). Its box is
the pasted rectangle, exactly: [x, y, width, height] in whole pixels. Everything is drawn from a generator
seeded by (seed, split, index): the same seed gives the same bytes.

Layout: OUT/images/train/*.jpg, OUT/images/val/*.jpg, OUT/annotations/instances_train.json and
instances_val.json (COCO's: images, annotations with bbox, area, iscrowd 0 and the box as a polygon
(segmentation), categories with ids from 1).
"""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import dataclass

import numpy as np
from PIL import Image
from tqdm import tqdm

from dali_pipes.options import option
from dali_pipes.tools.sample_data import PHOTOS, SPLITS, check_photos, load_photo
from dali_pipes.tools.workers import process_pool

OBJECTS = (0, 1, 2, 3, 4, 8, 10, 6, 7, 9)  # PHOTOS indexes of the categories' photographs
BACKGROUNDS = (12, 13, 11, 14, 5)  # PHOTOS indexes of textures: grass, gravel, brick, moon, deep field
PLACEMENT_TRIES = 20


@dataclass(frozen=True)
class DetectionSampleConfig:
    """The built-in detection set's size; fields are flags of `dali-pipes sample --detection` (seed, min_side
    and max_side are the sample command's own flags)."""
    categories: int = option(5, f"object categories (one photograph each, at most {len(OBJECTS)})")
    train_images: int = option(60, "train images (with --detection)")
    val_images: int = option(20, "val images (with --detection)")
    max_objects: int = option(4, "objects per image at most (each image draws 0 to this many)")
    seed: int = 0
    min_side: int = 250
    max_side: int = 600

    def __post_init__(self) -> None:
        if not 1 <= self.categories <= len(OBJECTS):
            raise ValueError(f"categories must be between 1 and {len(OBJECTS)}, got {self.categories}")
        if self.train_images < 0 or self.val_images < 0 or self.max_objects < 0:
            raise ValueError("train_images, val_images and max_objects must not be negative")
        if not 32 <= self.min_side <= self.max_side:
            raise ValueError(f"need 32 <= min_side <= max_side, got {self.min_side} and {self.max_side}")


def category_names(count: int) -> list[str]:
    return [os.path.splitext(os.path.basename(PHOTOS[i][1]))[0] for i in OBJECTS[:count]]


def _background(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    photo = load_photo(BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))])
    h, w = photo.shape[:2]
    scale = max(width / w, height / h) * rng.uniform(1.0, 1.5)  # a crop of it, at least the image's size
    img = Image.fromarray(photo).resize((max(width, round(w * scale)), max(height, round(h * scale))))
    x, y = int(rng.integers(img.width - width + 1)), int(rng.integers(img.height - height + 1))
    return img.crop((x, y, x + width, y + height))


def _free(box: list[int], taken: list[list[int]]) -> bool:
    x, y, w, h = box
    return all(x + w <= a or a + c <= x or y + h <= b or b + d <= y for a, b, c, d in taken)


def _pastes(rng: np.random.Generator, cfg: DetectionSampleConfig, canvas: Image.Image) -> list[tuple[int, list]]:
    """Paste 0..max_objects objects onto `canvas`; returns [(category index, [x, y, w, h])]."""
    out: list[tuple[int, list]] = []
    for _ in range(int(rng.integers(cfg.max_objects + 1))):
        category = int(rng.integers(cfg.categories))
        photo = load_photo(OBJECTS[category])
        side = rng.uniform(0.15, 0.5) * min(canvas.size)
        scale = side / max(photo.shape[:2])
        w, h = max(8, round(photo.shape[1] * scale)), max(8, round(photo.shape[0] * scale))
        obj = Image.fromarray(photo).resize((w, h), Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            obj = obj.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        for _ in range(PLACEMENT_TRIES):
            box = [int(rng.integers(canvas.width - w + 1)), int(rng.integers(canvas.height - h + 1)), w, h]
            if _free(box, [b for _, b in out]):
                canvas.paste(obj, (box[0], box[1]))
                out.append((category, box))
                break
    return out


def make_detection_image(args: tuple[DetectionSampleConfig, str, int]) -> tuple[bytes, int, int, list]:
    """(JPEG, width, height, [(category index, [x, y, w, h])]) of image `index` of `split`."""
    cfg, split, index = args
    rng = np.random.default_rng([cfg.seed, SPLITS[split], index, 35])  # 35: apart from the classification set
    width, height = (int(rng.integers(cfg.min_side, cfg.max_side + 1)) for _ in range(2))
    canvas = _background(rng, width, height)
    pastes = _pastes(rng, cfg, canvas)
    out = io.BytesIO()
    canvas.save(out, "JPEG", quality=90)
    return out.getvalue(), width, height, pastes


def coco_json(cfg: DetectionSampleConfig, split: str, made: list[tuple[bytes, int, int, list]]) -> dict:
    """COCO's layout of one split: image ids from 1, annotation ids from 1, category ids from 1."""
    images: list[dict] = []
    annotations: list[dict] = []
    for i, (_, width, height, pastes) in enumerate(made):
        images.append({"id": i + 1, "file_name": f"{split}_{i:06d}.jpg", "width": width, "height": height})
        for category, (x, y, w, h) in pastes:
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": category + 1,
                                "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0,
                                # the paste's outline: the references' v1 get_coco builds masks from every polygon
                                "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]]})
    categories = [{"id": i + 1, "name": name} for i, name in enumerate(category_names(cfg.categories))]
    return {"info": {"description": "dali_pipes built-in detection sample", "seed": cfg.seed},
            "images": images, "annotations": annotations, "categories": categories}


def make_detection_sample(root: str, cfg: DetectionSampleConfig = DetectionSampleConfig(), *,
                          workers: int | None = None, progress: bool = True) -> dict:
    """Write ROOT/images/{train,val}/*.jpg and ROOT/annotations/instances_{train,val}.json; returns
    {split: {"images": n, "boxes": n, "annotations": path}}. Needs the [sample] extra (the photographs)."""
    check_photos(max(max(OBJECTS[:cfg.categories]), max(BACKGROUNDS)) + 1)
    os.makedirs(os.path.join(root, "annotations"), exist_ok=True)
    summary = {}
    for split, count in (("train", cfg.train_images), ("val", cfg.val_images)):
        folder = os.path.join(root, "images", split)
        os.makedirs(folder, exist_ok=True)
        with process_pool(workers) as pool:
            made = list(tqdm(pool.map(make_detection_image, [(cfg, split, i) for i in range(count)]), total=count,
                             desc=f"making {split}", unit="img", file=sys.stderr, disable=None if progress else True))
        data = coco_json(cfg, split, made)
        for image, (jpeg, *_) in zip(data["images"], made):
            with open(os.path.join(folder, image["file_name"]), "wb") as f:
                f.write(jpeg)
        path = os.path.join(root, "annotations", f"instances_{split}.json")
        with open(path, "w") as f:
            json.dump(data, f)
        summary[split] = {"images": count, "boxes": len(data["annotations"]), "annotations": path}
    return summary
