"""The detection graph: encoded images and their boxes in, images and the boxes that moved with the pixels out.

One graph for both devices (device="gpu" decodes with nvJPEG, "cpu" with DALI's CPU decoder); the boxes stay on
the CPU, where DALI's box operators run and Python reads them. In the graph, boxes are normalised to the decoded
image ([0, 1] xyxy, what DALI's box operators expect), by the size peeked from the encoded bytes; the run turns
them back into pixels of the output image (run/detection.py).

The steps, in torchvision's order (references/detection/presets.py): RandomPhotometricDistort (graph/photometric.py,
on the whole decoded image), RandomZoomOut (a padded slice), RandomIoUCrop
(fn.random_bbox_crop; on the GPU the decoder decodes only the crop window), RandomShortestSize or lsj's ScaleJitter
and FixedSizeCrop (graph/scale_jitter.py: a resize, then one padded slice), RandomHorizontalFlip (fn.bb_flip with
the pixels' coin), then float [0, 1] CHW. Degenerate boxes are removed after the graph (run/detection.py), as
SanitizeBoundingBoxes does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dali_pipes.graph.photometric import PhotometricDistort, photometric_distort
from dali_pipes.graph.scale_jitter import FixedSizeCrop, ScaleJitter, scale_jitter_crop

# RandomIoUCrop's defaults (torchvision.transforms.v2.RandomIoUCrop): the minimum IoU a crop must have with some
# box, drawn per try from these; 1.0 there means "leave the image uncropped", which is DALI's allow_no_crop.
IOU_THRESHOLDS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
HOST_OUTPUTS = (1, 2, 3)  # boxes, kept box indices, sample index: made on the CPU, read in Python


@dataclass(frozen=True, kw_only=True)
class IoUCrop:
    """RandomIoUCrop's settings: the crop's side as a fraction of the image's, its aspect ratio, tries."""
    min_scale: float = 0.3
    max_scale: float = 1.0
    min_aspect_ratio: float = 0.5
    max_aspect_ratio: float = 2.0
    trials: int = 40


@dataclass(frozen=True, kw_only=True)
class ZoomOut:
    """RandomZoomOut's settings: a canvas `side_range` times the image, filled with `fill`, with probability p."""
    fill: tuple[float, float, float] = (0.0, 0.0, 0.0)
    side_range: tuple[float, float] = (1.0, 4.0)
    p: float = 0.5


@dataclass(frozen=True, kw_only=True)
class ShortestSize:
    """RandomShortestSize's settings: the shorter side drawn from `min_size`, the longer at most `max_size`."""
    min_size: tuple[int, ...]
    max_size: int | None = None


@dataclass(frozen=True, kw_only=True)
class DetectionAugment:
    """What the detection graph does to each image and its boxes (read from a torchvision transform by
    graph/detection_transforms.py). flip_prob: RandomHorizontalFlip's p (0: no flip); zoom_out, iou_crop: None
    when the transform has none; sanitize: SanitizeBoundingBoxes' (min_size, min_area), or None."""
    flip_prob: float = 0.0
    zoom_out: ZoomOut | None = None
    iou_crop: IoUCrop | None = None
    sanitize: tuple[float, float] | None = None
    shortest_size: ShortestSize | None = None
    photometric: PhotometricDistort | None = None  # RandomPhotometricDistort, first (as in the ssd preset)
    scale_jitter: ScaleJitter | None = None  # the lsj preset's ScaleJitter, then its FixedSizeCrop
    fixed_crop: FixedSizeCrop | None = None
    steps: tuple[str, ...] = field(default=())  # the transform's steps as read, for messages and the docs

    def __post_init__(self) -> None:
        if not 0.0 <= self.flip_prob <= 1.0:
            raise ValueError(f"flip_prob must be within [0, 1], got {self.flip_prob}")
        if self.iou_crop is not None and not 0 < self.iou_crop.min_scale <= self.iou_crop.max_scale <= 1:
            raise ValueError(f"RandomIoUCrop: min_scale <= max_scale within (0, 1] expected, got {self.iou_crop}")


def detection_graph(jpegs: Any, boxes: Any, indices: Any, augment: DetectionAugment,
                    device: str) -> tuple[Any, Any, Any]:
    """(images float32 CHW in [0, 1], each its own size; boxes normalised xyxy to the output image (CPU);
    kept: the `indices` (int32, 0..N-1 per sample) of the input boxes that survived, in order (CPU); -1 for one
    FixedSizeCrop removed, for the run to leave out).
    `boxes`: float32 (N, 4) xyxy in pixels of the encoded image."""
    from nvidia.dali import fn
    types = dali_types()
    decoder = "mixed" if device == "gpu" else "cpu"
    shape = fn.cast(fn.peek_image_shape(jpegs, name="det_peek"), dtype=types.FLOAT)  # (H, W, C), on the CPU
    boxes = boxes / fn.stack(shape[1], shape[0], shape[1], shape[0])
    kept, crop = indices, None
    zoom = zoom_window(augment.zoom_out) if augment.zoom_out is not None else None
    if zoom is not None:
        boxes = fn.bbox_paste(boxes, ratio=zoom.side, paste_x=zoom.x, paste_y=zoom.y, ltrb=True,
                              name="det_zoom_boxes")
    if augment.iou_crop is not None:
        from nvidia.dali import math as dali_math
        settings = augment.iou_crop
        # DALI asserts boxes within the image; torchvision's crop clamps them to the window anyway (v2 keeps a
        # COCO box past the edge unclamped until then).
        anchor, window, boxes, kept = fn.random_bbox_crop(  # type: ignore[misc]  # four outputs (DALI's stub: one)
            dali_math.clamp(boxes, 0.0, 1.0), indices, bbox_layout="xyXY", allow_no_crop=True,
            thresholds=list(IOU_THRESHOLDS),
            scaling=[settings.min_scale, settings.max_scale],
            aspect_ratio=[settings.min_aspect_ratio, settings.max_aspect_ratio], num_attempts=settings.trials,
            name="det_iou_crop")
        crop = (anchor, window)
    whole = zoom is not None or augment.photometric is not None  # contrast's mean is the whole image's
    images = _decoded(jpegs, decoder, None if whole else crop)
    if augment.photometric is not None:
        images = photometric_distort(images, augment.photometric)
    if zoom is not None and augment.zoom_out is not None:
        images = fn.slice(images, zoom.anchor, zoom.shape, normalized_anchor=True, normalized_shape=True,
                          out_of_bounds_policy="pad", fill_values=list(augment.zoom_out.fill), name="det_zoom")
    if whole and crop is not None:  # the window is the zoomed canvas's (or the whole image's): cut after
        images = fn.slice(images, *crop, normalized_anchor=True, normalized_shape=True, name="det_crop")
    if augment.shortest_size is not None:  # boxes are normalised: a resize leaves them as they are
        images = fn.resize(images, size=shortest_side_size(shape, augment.shortest_size), antialias=True,
                           name="det_shortest_size")
    if augment.scale_jitter is not None or augment.fixed_crop is not None:  # the lsj preset (graph/scale_jitter.py)
        images, boxes, kept = scale_jitter_crop(images, boxes, kept, shape, augment.scale_jitter, augment.fixed_crop)
    flip = fn.random.coin_flip(probability=augment.flip_prob, name="det_flip_coin")
    boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip, name="det_bb_flip")
    images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=[0.0], std=[255.0],
                                      mirror=flip, name="det_to_float")
    return images, boxes, kept


def dali_types() -> Any:
    """nvidia.dali.types, typed Any (its enums come from a compiled module type checkers cannot see)."""
    from nvidia.dali import types
    return types


def _decoded(jpegs: Any, decoder: str, crop: tuple | None) -> Any:
    """The decoded RGB image, or only its crop window (normalised anchor and shape): on the GPU, nvJPEG decodes
    just the window (ROI decode), as NVIDIA's MLPerf detection pipelines do."""
    from nvidia.dali import fn
    types = dali_types()
    if crop is None:
        return fn.decoders.image(jpegs, device=decoder, output_type=types.RGB, name="det_decode")
    return fn.decoders.image_slice(jpegs, *crop, device=decoder, output_type=types.RGB, normalized_anchor=True,
                                   normalized_shape=True, name="det_decode")


def shortest_side_size(shape: Any, settings: ShortestSize) -> Any:
    """RandomShortestSize's output (H, W) for the peeked (H, W, C): r = side / shorter, at most max_size /
    longer; each side floor(side * r), as torchvision's int() (a float32 graph: nudged so 48 * (40 / 48) is 40)."""
    from nvidia.dali import fn
    from nvidia.dali import math as dali_math
    height, width = shape[0], shape[1]
    side = fn.random.choice(list(settings.min_size), name="det_shortest_side") * 1.0
    scale = side / dali_math.min(height, width)
    if settings.max_size is not None:
        scale = dali_math.min(scale, settings.max_size / dali_math.max(height, width))
    return fn.stack(dali_math.floor(height * scale + 1e-3), dali_math.floor(width * scale + 1e-3))


@dataclass(frozen=True)
class ZoomWindow:
    """RandomZoomOut's draw in graph nodes: the canvas side (1 where not applied), where the image sits in it
    (x, y in [0, 1] of the free room), and the slice (normalised anchor, shape) that pads the image to it."""
    side: Any
    x: Any
    y: Any
    anchor: Any
    shape: Any


def zoom_window(zoom: ZoomOut) -> ZoomWindow:
    """The zoom-out's random draw per sample: applied with probability p, a side drawn from side_range."""
    from nvidia.dali import fn
    types = dali_types()
    applied = fn.cast(fn.random.coin_flip(probability=zoom.p, name="det_zoom_coin"), dtype=types.FLOAT)
    low, high = zoom.side_range
    drawn = fn.random.uniform(range=[low, high], name="det_zoom_side") if high > low else low  # DALI: empty range
    side = 1.0 + applied * (drawn - 1.0)
    x = fn.random.uniform(range=[0.0, 1.0], name="det_zoom_x")
    y = fn.random.uniform(range=[0.0, 1.0], name="det_zoom_y")
    room = side - 1.0
    return ZoomWindow(side, x, y, fn.stack(-room * x, -room * y), fn.stack(side, side))


def detection_pipeline(feed: Callable, augment: DetectionAugment, *, batch_size: int, device: str, num_threads: int,
                       device_id: int | None, seed: int, prefetch_queue_depth: int = 2,
                       checkpoint: bytes | None = None) -> Any:
    """The pipeline (unbuilt): `feed`, called with DALI's batch info, gives (encoded images, pixel boxes (N, 4)
    float32, box indices 0..N-1 int32, sample index (1,) int64) per batch, raising StopIteration at the epoch's
    end. Outputs: images, boxes (normalised), kept box indices, sample index. Checkpointing is on (the random
    operators' states: the loader's resume, run/detection_state.py); `checkpoint` restores one."""
    from nvidia.dali import fn, pipeline_def
    types = dali_types()

    # ignore: DALI's stub (2.4) types device_id as int; None is DALI's documented "no GPU" (CPU pipelines)
    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id,  # type: ignore[arg-type]
                  seed=seed, enable_checkpointing=True,
                  prefetch_queue_depth=prefetch_queue_depth)
    def define() -> tuple:
        jpegs, boxes, indices, sample = fn.external_source(
            feed, num_outputs=4, batch=True, batch_info=True, ndim=[1, 2, 1, 1],
            dtype=[types.UINT8, types.FLOAT, types.INT32, types.INT64])
        images, boxes, kept = detection_graph(jpegs, boxes, indices, augment, device)
        return images, boxes, kept, sample

    return define(checkpoint=checkpoint) if checkpoint else define()
