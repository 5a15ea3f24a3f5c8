"""COCO detection JSON plus an image folder (local, or a URL in any supported store) -> DetectionSample list.

Not an entry of the classification format table (formats/__init__.py): its samples are DetectionSamples.

What is read (pycocotools' and torchvision's CocoDetection's reading): `images` (id, file_name, width,
height), `annotations` (id, image_id, category_id, bbox as [x, y, width, height] in pixels, iscrowd, area) and
`categories` (id, name). Samples come in ascending image id (CocoDetection's order), each image's boxes in the
order the file lists them, converted to xyxy pixels. Every problem is named with the file, the image id and
the annotation id: malformed JSON, an entry missing a key, a duplicate id, a missing image file, an
annotation of an unknown image or category, a box outside its image or of no area. A box past the image's
edge by at most EDGE_TOLERANCE pixels (COCO's own annotations have some, from rounding) is clipped to it, as
torchvision's references clamp every box.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Iterable

from dali_pipes.data.detection import DetectionSample, detection_sample
from dali_pipes.errors import DatasetError
from dali_pipes.storage import remote, remote_urls, transfer

EDGE_TOLERANCE = 1.0  # pixels a box may pass the image's edge by and be clipped rather than refused
BAD_BOXES = ("raise", "drop")
FIX_JSON = "Fix or regenerate the annotation file (COCO's instances_*.json layout)"
FIX_BOX = "Fix the annotation, or read with bad_boxes='drop' (--bad-boxes drop) to leave such boxes out"


@dataclass(frozen=True)
class CocoSet:
    """A COCO JSON read: samples (ascending image id), categories {id: name} in the file's order, and the
    problems found with the boxes that bad_boxes='drop' left out (empty when reading with 'raise')."""
    samples: list[DetectionSample]
    categories: dict[int, str]
    dropped: list[DatasetError]


def annotation_where(path: str, image_id: Any, annotation_id: Any = None) -> str:
    """How a message names an image or an annotation of a COCO file."""
    tail = "" if annotation_id is None else f", annotation {annotation_id}"
    return f"{path} (image {image_id}{tail})"


def load_json(path: str) -> dict:
    """The parsed file (local or URL); DatasetError naming it when it is not a JSON object."""
    try:
        raw = transfer.read_bytes(path) if remote_urls.is_remote(path) else _read_local(path)
    except FileNotFoundError:
        raise DatasetError(path, "no such annotation file", "Check the path of the COCO JSON") from None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise DatasetError(path, f"malformed JSON ({e})", FIX_JSON) from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DatasetError(path, "not a COCO detection file: no 'images' list", FIX_JSON)
    for key in ("annotations", "categories"):
        if not isinstance(data.get(key, []), list):
            raise DatasetError(path, f"'{key}' is not a list", FIX_JSON)
    return data


def _read_local(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _entry(path: str, entry: Any, keys: tuple[str, ...], what: str, where: str) -> dict:
    if not isinstance(entry, dict) or any(k not in entry for k in keys):
        missing = keys if not isinstance(entry, dict) else [k for k in keys if k not in entry]
        raise DatasetError(where, f"{what} entry lacks {', '.join(missing)}: {str(entry)[:80]}", FIX_JSON)
    return entry


def read_categories(path: str, data: dict) -> dict[int, str]:
    """{category id: name}, in the file's order; a duplicate id is refused."""
    categories: dict[int, str] = {}
    for entry in data.get("categories", []):
        cat = _entry(path, entry, ("id", "name"), "a category", path)
        if cat["id"] in categories:
            raise DatasetError(path, f"category id {cat['id']} listed twice", FIX_JSON)
        categories[int(cat["id"])] = str(cat["name"])
    return categories


def read_images(path: str, data: dict) -> dict[int, dict]:
    """{image id: entry} with a file name and a positive width and height each; duplicates refused."""
    images: dict[int, dict] = {}
    for entry in data["images"]:
        image = _entry(path, entry, ("id", "file_name", "width", "height"), "an image",
                       annotation_where(path, entry.get("id", "?") if isinstance(entry, dict) else "?"))
        where = annotation_where(path, image["id"])
        if image["id"] in images:
            raise DatasetError(where, "image id listed twice", FIX_JSON)
        if not (_number(image["width"]) > 0 and _number(image["height"]) > 0):
            raise DatasetError(where, f"size {image['width']} x {image['height']} is not positive", FIX_JSON)
        images[int(image["id"])] = image
    return images


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def box_problem(box: Any, width: float, height: float) -> tuple[list[float] | None, str | None]:
    """(xyxy box clipped within EDGE_TOLERANCE, None) for a good COCO [x, y, w, h] box, else (None, problem)."""
    if not isinstance(box, list) or len(box) != 4 or not all(math.isfinite(_number(v)) for v in box):
        return None, f"bbox {box!r} is not four finite numbers [x, y, width, height]"
    x, y, w, h = (float(v) for v in box)
    if w <= 0 or h <= 0:
        return None, f"bbox {box} has no area (width {w:g}, height {h:g})"
    t = EDGE_TOLERANCE
    if x < -t or y < -t or x + w > width + t or y + h > height + t:
        return None, (f"bbox {box} (xyxy {x:g}, {y:g}, {x + w:g}, {y + h:g}) is outside the "
                      f"{width:g} x {height:g} image")
    return [max(x, 0.0), max(y, 0.0), min(x + w, width), min(y + h, height)], None


def annotation_problems(path: str, data: dict, images: dict[int, dict],
                        categories: dict[int, str]) -> tuple[dict[int, list], list[DatasetError]]:
    """({image id: [(annotation, xyxy box)]} of the good annotations, [every bad one, named]). An annotation
    of an unknown image, an unknown category or a bad box is bad; a malformed entry or a duplicate id raises."""
    good: dict[int, list] = {}
    bad: list[DatasetError] = []
    seen: set = set()
    for entry in data.get("annotations", []):
        ann = _entry(path, entry, ("id", "image_id", "category_id", "bbox"), "an annotation",
                     annotation_where(path, _get(entry, "image_id"), _get(entry, "id")))
        where = annotation_where(path, ann["image_id"], ann["id"])
        if ann["id"] in seen:
            raise DatasetError(where, "annotation id listed twice", FIX_JSON)
        seen.add(ann["id"])
        image = images.get(ann["image_id"])
        if image is None:
            bad.append(DatasetError(where, "no image with this id in 'images'", FIX_JSON))
            continue
        if ann["category_id"] not in categories:
            bad.append(DatasetError(where, f"category_id {ann['category_id']} is not among the categories "
                                    f"({_ids(categories)})", "Add the category, or fix the annotation"))
            continue
        box, problem = box_problem(ann["bbox"], float(image["width"]), float(image["height"]))
        if problem:
            bad.append(DatasetError(where, problem, FIX_BOX))
            continue
        good.setdefault(int(ann["image_id"]), []).append((ann, box))
    return good, bad


def _get(entry: Any, key: str) -> Any:
    return entry.get(key, "?") if isinstance(entry, dict) else "?"


def _ids(categories: Iterable[int]) -> str:
    ids = sorted(categories)
    return ", ".join(map(str, ids)) if len(ids) <= 12 else f"{', '.join(map(str, ids[:12]))}, ... ({len(ids)} ids)"


def image_location(images: str, file_name: str) -> str:
    """The image's path or URL: `file_name` (relative, as COCO gives it) under the image folder."""
    return remote_urls.join(images, file_name) if remote_urls.is_remote(images) else os.path.join(images, file_name)


def missing_images(json_path: str, images_root: str, entries: Iterable[dict]) -> list[DatasetError]:
    """Each image the JSON names that the folder (or store prefix: one listing) does not hold, named."""
    entries = list(entries)
    if remote_urls.is_remote(images_root):
        listed = {remote_urls.identity(info.url) for info in remote.list_objects(images_root.rstrip("/") + "/")}
        found = [remote_urls.identity(image_location(images_root, e["file_name"])) in listed for e in entries]
    else:
        found = [os.path.isfile(image_location(images_root, e["file_name"])) for e in entries]
    return [DatasetError(image_location(images_root, e["file_name"]),
                         f"image {e['id']} of {json_path}: file missing",
                         "Check the image folder (images=, --images), or remove the image from the JSON")
            for e, ok in zip(entries, found) if not ok]


def _sample(images_root: str, image: dict, annotations: list) -> DetectionSample:
    return detection_sample(
        image_location(images_root, image["file_name"]), image["id"], image["width"], image["height"],
        [box for _, box in annotations], [a["category_id"] for a, _ in annotations],
        annotation_ids=[a["id"] for a, _ in annotations],
        iscrowd=[int(a.get("iscrowd", 0)) for a, _ in annotations],
        area=[float(a["area"]) if "area" in a else (b[2] - b[0]) * (b[3] - b[1]) for a, b in annotations])


def default_prefix(annotations: str) -> str:
    """Shard names for a COCO JSON: its name less COCO's "instances_" (instances_val2017.json -> "val2017")."""
    stem = annotations.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".json").removeprefix("instances_")
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in stem) or "train"


def coco_set(annotations: str, images: str, *, keep_empty: bool = True, bad_boxes: str = "raise",
             check_files: bool = True) -> CocoSet:
    """Read a COCO detection JSON (`annotations`) whose file names are relative to `images` (a folder or
    a store URL). keep_empty: keep images without (good) annotations (CocoDetection does; torchvision's
    detection references drop them for training). bad_boxes: 'raise' (the first bad annotation, naming how
    many more) or 'drop' (leave bad annotations out, warn once with their count, keep them in `dropped`).
    A missing image file always raises (check_files=False skips the check)."""
    if bad_boxes not in BAD_BOXES:
        raise ValueError(f"bad_boxes must be one of {', '.join(BAD_BOXES)}, got {bad_boxes!r}")
    data = load_json(annotations)
    categories = read_categories(annotations, data)
    entries = read_images(annotations, data)
    good, bad = annotation_problems(annotations, data, entries, categories)
    if bad and bad_boxes == "raise":
        more = f" ({len(bad) - 1} more bad annotations; `dali-pipes verify` lists them all)" if len(bad) > 1 else ""
        raise DatasetError(bad[0].where, bad[0].problem + more, bad[0].fix)
    if bad:
        warnings.warn(f"{annotations}: {len(bad)} bad annotations left out (bad_boxes='drop'), the first: {bad[0]}",
                      stacklevel=2)
    kept = [entries[i] for i in sorted(entries) if keep_empty or good.get(i)]
    if check_files and (missing := missing_images(annotations, images, kept)):
        more = f" ({len(missing) - 1} more images missing)" if len(missing) > 1 else ""
        raise DatasetError(missing[0].where, missing[0].problem + more, missing[0].fix)
    samples = [_sample(images, image, good.get(int(image["id"]), [])) for image in kept]
    return CocoSet(samples, categories, bad)


def read_coco(annotations: str, images: str, *, keep_empty: bool = True, bad_boxes: str = "raise") -> \
        list[DetectionSample]:
    """The DetectionSamples of a COCO JSON and its image folder (coco_set's samples)."""
    return coco_set(annotations, images, keep_empty=keep_empty, bad_boxes=bad_boxes).samples
