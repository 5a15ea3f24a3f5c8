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
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from dali_pipes.data.detection import DetectionSample
from dali_pipes.errors import DatasetError
from dali_pipes.graph._dali import shutdown_pipeline
from dali_pipes.graph.detection import DetectionAugment, detection_pipeline
from dali_pipes.run.detection_state import BadImages, ImageReader, positions, read_file
from dali_pipes.storage.remote import UnreachableError

TARGET_KEYS = ("boxes", "labels", "image_id", "area", "iscrowd")  # what a target may hold (masks: refused)


class DetectionFeed:
    """The external source's callback: (encoded images, pixel boxes, box indices, sample index) of the epoch's
    batch `next` (less the `excluded` samples; a batch left empty is passed over), then StopIteration at the
    epoch's end. `next` counts the batches handed to DALI, which reads ahead: `start` sets it at the loader's
    position (an epoch's start, a resume, a rebuild after a bad image), so DALI's batch info is not read.
    `read`: a sample's encoded image (a local file's bytes unless the location reads otherwise: a store, a shard)."""

    def __init__(self, samples: Sequence[DetectionSample], read: ImageReader = read_file) -> None:
        self.samples, self.read = samples, read
        self.batches: list[list[int]] = []
        self.next = 0
        self.excluded: set[int] = set()

    def start(self, batches: list[list[int]], at: int = 0) -> None:
        self.batches, self.next = batches, at

    def picks(self, position: int) -> list[int]:
        return [i for i in self.batches[position] if i not in self.excluded]

    def __call__(self, info) -> tuple:
        while self.next < len(self.batches) and not self.picks(self.next):
            self.next += 1
        if self.next >= len(self.batches):
            raise StopIteration
        indices = self.picks(self.next)
        self.next += 1
        picks = [self.samples[i] for i in indices]
        return ([encoded(s, self.read) for s in picks], [s.boxes for s in picks],
                [np.arange(len(s.boxes), dtype=np.int32) for s in picks],
                [np.array([i], np.int64) for i in indices])


def encoded(sample: DetectionSample, read: Callable[[DetectionSample], bytes] = read_file) -> np.ndarray:
    """The image's bytes, or a DatasetError naming the file and image id (an empty buffer never reaches DALI:
    its decoder crashes the process on one). An unreachable store is no bad image: its error goes on as it is."""
    try:
        data = np.frombuffer(read(sample), dtype=np.uint8)
    except UnreachableError:
        raise
    except OSError as e:
        raise DatasetError(sample.path, f"image {sample.image_id} cannot be read ({e.strerror or e})",
                           "check the dataset's root and the annotation's file_name, or exclude such images with "
                           "skip_bad=True") from e
    if not len(data):
        raise DatasetError(sample.path, f"image {sample.image_id} is an empty file",
                           "replace or remove the image, or exclude such images with skip_bad=True")
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
    (image tensor float CHW, target dict); `position` is how many of the epoch's batches are delivered.
    `checkpoint`: DALI's state to build at (a resume); `bad`: what a bad image does (detection_state.py); `read`:
    a sample's encoded image (DetectionFeed)."""

    def __init__(self, samples: Sequence[DetectionSample], augment: DetectionAugment, form: TargetForm, *,
                 batch_size: int, device: str, num_threads: int, seed: int, checkpoint: bytes | None = None,
                 bad: BadImages | None = None, read: ImageReader = read_file) -> None:
        self.samples, self.augment, self.form, self.device = samples, augment, form, device
        self.bad = bad if bad is not None else BadImages(num_images=len(samples), device=device, read=read)
        self.feed = DetectionFeed(samples, read)
        self._settings = {"batch_size": batch_size, "num_threads": num_threads, "seed": seed}
        self.position, self._last = 0, checkpoint
        self._build(checkpoint)

    def _build(self, checkpoint: bytes | None) -> None:
        self.pipe = detection_pipeline(_FeedHandle(self.feed), self.augment, device=self.device,
                                       device_id=_device_id(self.device), checkpoint=checkpoint, **self._settings)
        self.pipe._dali_pipes_feeds = [self.feed]  # the pipeline owns its feed (see _FeedHandle)
        self.pipe.build()
        self._open, self._used = False, False

    def epoch(self, batches: list[list[int]], start: int = 0) -> Iterator[list[tuple[torch.Tensor, dict]]]:
        """Each of `batches` (lists of sample indices) from `start` on through the graph, in order."""
        self._finish_open_epoch()
        self.feed.excluded = self.bad.excluded
        self.feed.start(batches, start)
        if self._used:
            self.pipe.reset()  # the epoch before ended in StopIteration; DALI asks the feed again from here
        self._used = self._open = True
        for position in range(start, len(batches)):
            self.position = position
            outputs = self._outputs(batches, position) if self.feed.picks(position) else None
            self.position = position + 1
            if outputs is not None:  # None: every image of it excluded (skip_bad)
                yield self._delivered(outputs, self.feed.picks(position))
        self.position = len(batches)
        self._finish_open_epoch()

    def _outputs(self, batches: list[list[int]], position: int) -> tuple | None:
        """The next batch's outputs; after a failed batch, its bad images named or excluded (BadImages) and the
        pipeline rebuilt at the last delivered batch's checkpoint, to give it again without them (None: none
        left)."""
        while self.feed.picks(position):
            try:
                outputs = self.pipe.run()
            except (RuntimeError, DatasetError) as error:
                self.bad.handle(error, self.samples, positions(batches, position, self.feed.next))
                self.close()
                self._build(self._last)
                self.feed.start(batches, position)
                self._used = self._open = True
                continue
            if self.bad.skip:  # where a later bad image sends the rebuild
                self._last = self.pipe.checkpoint()
            return outputs
        return None

    def checkpoint(self) -> bytes:
        """DALI's state after the last delivered batch (its random operators' draws)."""
        return self.pipe.checkpoint()

    def _finish_open_epoch(self) -> None:
        """Run the pipeline to its StopIteration (an epoch left midway is drained): DALI resets only there."""
        while self._open:
            try:
                self.pipe.run()
            except StopIteration:
                self._open = False

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
        shutdown_pipeline(self.pipe)


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
    pixels, kept = pixels[kept >= 0], kept[kept >= 0]  # -1: removed in the graph (FixedSizeCrop's empty boxes)
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
