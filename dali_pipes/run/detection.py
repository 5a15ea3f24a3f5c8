"""A detection run: DetectionSamples fed through the detection graph (graph/detection.py), one batch per list of
indices a sampler drew, delivered as (image, target) pairs of torchvision's detection references.

The feed is a pure function of DALI's (epoch, iteration): the loader draws each epoch's batches in the main
thread, as DataLoader does, and hands them over before the epoch's first batch is asked for; DALI's prefetching
then asks ahead within the epoch only (StopIteration past its end; the pipeline is reset at the next epoch's
start, once that epoch's batches are known).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from dali_pipes.data.detection import DetectionSample
from dali_pipes.errors import DatasetError
from dali_pipes.graph.detection import DetectionAugment, detection_pipeline

TARGET_KEYS = ("boxes", "labels", "image_id", "area", "iscrowd")  # what a target may hold (masks: refused)


class DetectionFeed:
    """The external source's callback: (encoded images, pixel boxes, box indices, sample index) of batch
    `iteration` of DALI's epoch `epoch_idx`, from the batches `set_epoch` was given for it."""

    def __init__(self, samples: Sequence[DetectionSample]) -> None:
        self.samples = samples
        self.epochs: dict[int, list[list[int]]] = {}

    def set_epoch(self, epoch_idx: int, batches: list[list[int]]) -> None:
        self.epochs = {epoch_idx: batches}  # only this one: an epoch before it is over

    def __call__(self, info) -> tuple:
        batches = self.epochs.get(info.epoch_idx)
        if batches is None or info.iteration >= len(batches):
            raise StopIteration
        picks = [self.samples[i] for i in batches[info.iteration]]
        return ([encoded(s) for s in picks], [s.boxes for s in picks],
                [np.arange(len(s.boxes), dtype=np.int32) for s in picks],
                [np.array([i], np.int64) for i in batches[info.iteration]])


def encoded(sample: DetectionSample) -> np.ndarray:
    """The image's bytes, or a DatasetError naming the file and image id (an empty buffer never reaches DALI:
    its decoder crashes the process on one)."""
    try:
        data = np.fromfile(sample.path, dtype=np.uint8)
    except OSError as e:
        raise DatasetError(sample.path, f"image {sample.image_id} cannot be read ({e.strerror or e})",
                           "check the dataset's root and the annotation's file_name") from e
    if not len(data):
        raise DatasetError(sample.path, f"image {sample.image_id} is an empty file", "replace or remove the image")
    return data


class _FeedHandle:
    """What DALI's external_source holds of a feed: a weak reference (as parquet.py's _FeedHandle, for the same
    reason: DALI's graph is a reference cycle that outlives its pipeline)."""

    def __init__(self, feed: DetectionFeed) -> None:
        self._feed = weakref.ref(feed)

    def __call__(self, info) -> tuple:
        feed = self._feed()
        if feed is None:
            raise StopIteration
        return feed(info)


@dataclass(frozen=True, kw_only=True)
class TargetForm:
    """What each target holds: `keys` (of TARGET_KEYS, in order); a sample without annotations holds only its
    image_id where `empty_has_boxes` is False (torchvision's v2 wrapper)."""
    keys: tuple[str, ...] = ("boxes", "labels", "image_id", "area", "iscrowd")
    empty_has_boxes: bool = True  # False: a sample without annotations gives only its image_id (the v2 wrapper)


class DetectionRun:
    """One rank's detection pipeline over its epochs: `epoch(batches)` yields each batch as a list of
    (image tensor float CHW, target dict)."""

    def __init__(self, samples: Sequence[DetectionSample], augment: DetectionAugment, form: TargetForm, *,
                 batch_size: int, device: str, num_threads: int, seed: int) -> None:
        self.samples, self.augment, self.form, self.device = samples, augment, form, device
        self.feed = DetectionFeed(samples)
        self.pipe = detection_pipeline(_FeedHandle(self.feed), augment, batch_size=batch_size, device=device,
                                       num_threads=num_threads, device_id=_device_id(device), seed=seed)
        self.pipe._dali_pipes_feeds = [self.feed]  # the pipeline owns its feed (see _FeedHandle)
        self.pipe.build()
        self._epoch_idx, self._open, self._used = 0, False, False

    def epoch(self, batches: list[list[int]]) -> Iterator[list[tuple[torch.Tensor, dict]]]:
        """Each of `batches` (lists of sample indices) through the graph, in order."""
        self._finish_open_epoch()
        self.feed.set_epoch(self._epoch_idx, batches)
        if self._used:
            self.pipe.reset()  # the epoch before ended in StopIteration; DALI asks the feed again from here
        self._used = self._open = True
        for picks in batches:
            outputs = self.pipe.run()
            yield self._delivered(outputs, picks)
        self._finish_open_epoch()

    def _finish_open_epoch(self) -> None:
        """Run the pipeline to its StopIteration (an epoch left midway is drained): DALI resets only there."""
        while self._open:
            try:
                self.pipe.run()
            except StopIteration:
                self._open = False
                self._epoch_idx += 1

    def _delivered(self, outputs: tuple, picks: list[int]) -> list[tuple[torch.Tensor, dict]]:
        images, boxes, kept, index = outputs
        got = [int(np.asarray(index[i])[0]) for i in range(len(index))]
        if got != list(picks):  # the feed and the run disagree on the order: never deliver wrong targets
            raise RuntimeError(f"detection run: DALI delivered samples {got}, expected {list(picks)}")
        out = []
        for i, j in enumerate(picks):
            image = self._image(images[i])
            target = target_of(self.samples[j], np.asarray(boxes[i]), np.asarray(kept[i]), image.shape[-2:],
                               self.augment.sanitize, self.form)
            out.append((image, target))
        return out

    def _image(self, tensor: Any) -> torch.Tensor:
        if self.device != "gpu":
            return torch.from_numpy(np.array(tensor))
        from nvidia.dali.plugin.pytorch import feed_ndarray
        image = torch.empty(tuple(tensor.shape()), dtype=torch.float32, device=torch.device("cuda", _device_id(
            self.device) or 0))
        feed_ndarray(tensor, image, cuda_stream=torch.cuda.current_stream())
        return image

    def close(self) -> None:
        self.feed.epochs = {}
        del self.pipe


def target_of(sample: DetectionSample, boxes: np.ndarray, kept: np.ndarray, size: Sequence[int],
              sanitize: tuple[float, float] | None, form: TargetForm) -> dict:
    """The target dict of `sample` after the graph: `boxes` normalised xyxy to the output image of `size`
    (H, W), back to pixels; `kept`: which of the sample's boxes they are; SanitizeBoundingBoxes' filter where
    asked (boxes under min_size or min_area, or outside the image, removed with their labels)."""
    if not len(sample.boxes) and not form.empty_has_boxes:
        return {"image_id": sample.image_id}
    height, width = int(size[0]), int(size[1])
    pixels = boxes.reshape(-1, 4).astype(np.float32) * np.array([width, height, width, height], np.float32)
    kept = kept.reshape(-1).astype(np.int64)
    if sanitize is not None:
        valid = sanitized(pixels, (height, width), *sanitize)
        pixels, kept = pixels[valid], kept[valid]
    columns = {"boxes": torch.from_numpy(pixels), "labels": torch.from_numpy(sample.labels[kept]),
               "image_id": sample.image_id, "area": torch.from_numpy(sample.area[kept]),
               "iscrowd": torch.from_numpy(sample.iscrowd[kept])}
    return {key: columns[key] for key in form.keys}


def sanitized(boxes: np.ndarray, size: tuple[int, int], min_size: float, min_area: float) -> np.ndarray:
    """torchvision v2's SanitizeBoundingBoxes test for xyxy pixel boxes on an image of `size` (H, W): width and
    height at least min_size, area at least min_area, no coordinate below 0 or past the image."""
    height, width = size
    ws, hs = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    valid = (ws >= min_size) & (hs >= min_size) & (boxes >= 0).all(axis=1) & (ws * hs >= min_area)
    return valid & (boxes[:, 0] <= width) & (boxes[:, 2] <= width) & (boxes[:, 1] <= height) & (boxes[:, 3] <= height)


def _device_id(device: str) -> int | None:
    return torch.cuda.current_device() if device == "gpu" else None
