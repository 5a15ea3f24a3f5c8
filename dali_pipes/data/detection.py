"""Detection samples: one image and its boxes, whatever the format they came from.

A leaf module (it imports nothing of the project's): the COCO JSON reader, the TFRecord (TensorFlow Object
Detection API keys) and WebDataset (a JSON member per sample) formats, torchvision's `CocoDetection` read as a
dataset, the detection graph and the targets the loader delivers all meet on this one type.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, eq=False)
class DetectionSample:
    """One image and its annotations, boxes in pixels.

    path: where the image's bytes are (a file or URL; for shards, the shard); image_id: the dataset's id
    (COCO's `image_id`, kept exact for the evaluator); width, height: the image's size as the annotations
    give it; boxes: float32 (N, 4) xyxy in pixels; labels: int64 (N,) category ids as the dataset numbers
    them; annotation_ids: int64 (N,) (COCO's `id`, for messages naming a bad annotation; -1 where the format
    has none); iscrowd: int64 (N,); area: float32 (N,). extra: format details (a shard's byte range)."""
    path: str
    image_id: int
    width: int
    height: int
    boxes: np.ndarray
    labels: np.ndarray
    annotation_ids: np.ndarray
    iscrowd: np.ndarray
    area: np.ndarray
    extra: tuple = field(default=())

    def __post_init__(self) -> None:
        n = len(self.labels)
        if self.boxes.shape != (n, 4):
            raise ValueError(f"image {self.image_id} ({self.path}): boxes of shape {self.boxes.shape} for {n} labels")
        for name in ("annotation_ids", "iscrowd", "area"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"image {self.image_id} ({self.path}): {name} has {len(getattr(self, name))} "
                                 f"entries for {n} labels")


def detection_sample(path: str, image_id: int, width: int, height: int, boxes_xyxy, labels,
                     annotation_ids=None, iscrowd=None, area=None, extra: tuple = ()) -> DetectionSample:
    """A DetectionSample with the arrays' dtypes fixed and the optional columns filled as COCO would."""
    boxes = np.ascontiguousarray(np.asarray(boxes_xyxy, dtype=np.float32).reshape(-1, 4))  # DALI: dense rows
    n = len(boxes)
    return DetectionSample(
        path=path, image_id=int(image_id), width=int(width), height=int(height), boxes=boxes,
        labels=np.asarray(labels, dtype=np.int64).reshape(n),
        annotation_ids=np.full(n, -1, np.int64) if annotation_ids is None else np.asarray(annotation_ids, np.int64),
        iscrowd=np.zeros(n, np.int64) if iscrowd is None else np.asarray(iscrowd, np.int64),
        area=((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).astype(np.float32) if area is None
        else np.asarray(area, np.float32),
        extra=extra)
