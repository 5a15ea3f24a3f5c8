"""Do the GPU decoders give the CPU's pixels, on the JPEGs that differ most (issue 33)?

  * `make_hard_images(root, count)`: images of every kind that trips decoders, one class folder per kind
    (KINDS): baseline JPEGs at 4:4:4, 4:2:2 and 4:2:0 chroma, progressive, CMYK (Adobe), greyscale,
    EXIF-rotated (orientation 6) and PNG; cut from the built-in dataset's photographs, sides 64-500 px.
  * `agreement(files, ...)`: the val graph (eval_augment, uint8 before normalisation) image by image, and
    the train graph's ROI decode (its decoder arguments, with crop windows given explicitly, so that both
    devices decode the same region) then its resize; each candidate against the CPU graph at each
    `hw_decoder_load`. An image mismatches when any value differs by more than `tolerance` levels (3);
    the goal is 0.
  * `stress(files, ...)`: two pipelines, each on its own CUDA stream, decoding concurrently in two threads
    for `iterations` batches each; every output compared with the CPU reference (goal: 0 corrupt).

On CPU (the dry run, the tests) the candidate is the CPU graph itself, so the machinery runs everywhere;
`candidate=` takes any graph, and a mutated one is caught (tests/test_gpu_session.py).

    python -m dali_pipes_bench.gpu_agreement make ROOT --images 10000
    python -m dali_pipes_bench.gpu_agreement check ROOT --loads 0,0.65,0.99 --out agreement.json
    python -m dali_pipes_bench.gpu_agreement stress ROOT --iterations 200 --out stress.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

KINDS = ("444", "422", "420", "progressive", "cmyk", "grey", "exif_rotated", "png")
SUBSAMPLING = {"444": 0, "422": 1, "420": 2}  # PIL's subsampling codes
TOLERANCE = 3  # levels of 255
# (jpegs, anchor, shape, cfg, device, decoding) -> uint8 images; decoding: the decoders' num_threads and
# hw_decoder_load, as build_pipeline gives them from the spec's knobs
Graph = Callable[[Any, Any, Any, Any, str, dict], Any]


# -- the hard images --------------------------------------------------------------------------------------

def encode(pixels: np.ndarray, kind: str, quality: int = 90) -> bytes:
    """`pixels` (uint8 RGB) encoded as `kind` (one of KINDS)."""
    img, out = Image.fromarray(pixels), io.BytesIO()
    if kind == "png":
        img.save(out, "PNG")
    elif kind == "cmyk":
        img.convert("CMYK").save(out, "JPEG", quality=quality)
    elif kind == "grey":
        img.convert("L").save(out, "JPEG", quality=quality)
    elif kind == "progressive":
        img.save(out, "JPEG", quality=quality, progressive=True)
    elif kind == "exif_rotated":
        exif = Image.Exif()
        exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
        img.save(out, "JPEG", quality=quality, exif=exif)
    elif kind in SUBSAMPLING:
        img.save(out, "JPEG", quality=quality, subsampling=SUBSAMPLING[kind])
    else:
        raise ValueError(f"unknown image kind {kind!r}; expected one of {', '.join(KINDS)}")
    return out.getvalue()


def hard_pixels(index: int, seed: int = 0) -> np.ndarray:
    """A crop of one of the built-in dataset's photographs, odd sides included (MCU edges)."""
    from dali_pipes.tools.sample_data import PHOTOS, load_photo
    rng = np.random.default_rng([seed, index])
    photo = load_photo(int(rng.integers(len(PHOTOS))))
    h, w = (int(rng.integers(64, min(500, s) + 1)) for s in photo.shape[:2])
    y, x = int(rng.integers(photo.shape[0] - h + 1)), int(rng.integers(photo.shape[1] - w + 1))
    return np.ascontiguousarray(photo[y:y + h, x:x + w])


def _write_hard(args: tuple[str, int, int]) -> int:
    root, index, seed = args
    kind = KINDS[index % len(KINDS)]
    data = encode(hard_pixels(index, seed), kind, quality=75 + index % 21)
    with open(os.path.join(root, kind, f"{index:06d}.{'png' if kind == 'png' else 'jpg'}"), "wb") as f:
        f.write(data)
    return len(data)


def make_hard_images(root: str, count: int, seed: int = 0, workers: int | None = None) -> dict:
    """ROOT/<kind>/<index>.jpg|png, `count` images cycling through KINDS; returns counts and bytes."""
    from dali_pipes.tools.workers import process_pool
    for kind in KINDS:
        os.makedirs(os.path.join(root, kind), exist_ok=True)
    with process_pool(workers) as pool:
        sizes = list(pool.map(_write_hard, [(root, i, seed) for i in range(count)], chunksize=32))
    return {"images": count, "kinds": list(KINDS), "bytes": sum(sizes)}


def hard_files(root: str) -> list[str]:
    """Every image under ROOT/<kind>/, in a fixed order."""
    return sorted(str(p) for kind in KINDS for p in Path(root, kind).glob("*") if p.is_file())


# -- the graphs -------------------------------------------------------------------------------------------

def val_graph(jpegs, anchor, shape, cfg, device: str, decoding: dict):
    """The val graph as the loader builds it, before normalisation: uint8 CHW."""
    from dali_pipes.graph.augment import eval_augment
    return eval_augment(jpegs, cfg, device, normalize=False, **decoding)


def roi_graph(jpegs, anchor, shape, cfg, device: str, decoding: dict):
    """The train graph's ROI decode (its decoder arguments) of an explicit window, then its resize: uint8 HWC."""
    from nvidia.dali import fn

    from dali_pipes.graph.decoders import decode_rgb
    window = lambda data, **args: fn.decoders.image_slice(data, anchor, shape, **args)  # inputs, not keywords
    images = decode_rgb(window, jpegs, cfg, "gpu" if device == "gpu" else "cpu", **decoding,
                        normalized_anchor=True, normalized_shape=True)
    if device == "gpu":
        images = images.gpu()
    return fn.resize(images, resize_x=cfg.image_size, resize_y=cfg.image_size, antialias=True)


GRAPHS: dict[str, Graph] = {"val": val_graph, "roi": roi_graph}


def windows(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Fixed random-resized-crop windows, relative (x, y) anchors and (w, h) shapes: area 8-100%,
    aspect 3/4-4/3, as the train graph draws them."""
    rng = np.random.default_rng(seed)
    area, aspect = rng.uniform(0.08, 1.0, count), np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3), count))
    w, h = np.minimum(1.0, np.sqrt(area * aspect)), np.minimum(1.0, np.sqrt(area / aspect))
    x, y = rng.uniform(0, 1 - w), rng.uniform(0, 1 - h)
    return np.stack([x, y], 1).astype(np.float32), np.stack([w, h], 1).astype(np.float32)


@dataclass
class Decoder:
    """One pipeline of `graph` on `device` over `files` in order, batch by batch (last batch smaller)."""
    files: Sequence[str]
    graph: Graph
    device: str = "cpu"
    hw_decoder_load: float = 0.0
    image_size: int = 224
    batch: int = 64
    threads: int = field(default_factory=lambda: min(16, len(os.sched_getaffinity(0))))  # the CPU reference's pace
    seed: int = 0

    def __post_init__(self) -> None:
        from nvidia.dali import fn, pipeline_def, types

        from dali_pipes.graph.augment_config import AugmentConfig
        data = [np.fromfile(f, np.uint8) for f in self.files]
        anchors, shapes = windows(len(self.files), self.seed)
        batches = [(data[i:i + self.batch], list(anchors[i:i + self.batch]), list(shapes[i:i + self.batch]))
                   for i in range(0, len(data), self.batch)]
        self.batches = len(batches)
        cfg = AugmentConfig(image_size=self.image_size, hw_decoder_load=self.hw_decoder_load)
        source = lambda info: batches[info.iteration % len(batches)]

        @pipeline_def(batch_size=self.batch, num_threads=self.threads, seed=self.seed,
                      device_id=0 if self.device == "gpu" else None, prefetch_queue_depth=1)
        def pipe():
            jpegs, anchor, shape = fn.external_source(source, num_outputs=3, batch=True, batch_info=True,
                                                      dtype=[types.UINT8, types.FLOAT, types.FLOAT])
            return self.graph(jpegs, anchor, shape, cfg, self.device,
                              {"num_threads": self.threads, "hw_decoder_load": self.hw_decoder_load})

        with warnings.catch_warnings():  # the val graph leaves the windows unused, as it should
            warnings.filterwarnings("ignore", message="The external source node")
            self.pipe = pipe()
            self.pipe.build()

    def next_batch(self) -> list[np.ndarray]:
        """The next batch's images as uint8 arrays (the batches repeat after the last)."""
        (out,) = self.pipe.run()
        host = out.as_cpu() if hasattr(out, "as_cpu") else out
        return [np.array(host[i]) for i in range(len(host))]

    def all_images(self) -> list[np.ndarray]:
        return [image for _ in range(self.batches) for image in self.next_batch()]


# -- comparing --------------------------------------------------------------------------------------------

@dataclass
class Agreement:
    """Images compared, how many differ by more than `tolerance` levels anywhere, the largest difference,
    and the same per image kind (the folder an image is in)."""
    tolerance: int = TOLERANCE
    images: int = 0
    mismatched: int = 0
    worst: int = 0
    per_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def add(self, path: str, reference: np.ndarray, candidate: np.ndarray) -> None:
        if reference.shape != candidate.shape:
            difference = 255
        else:
            difference = int(np.abs(reference.astype(np.int16) - candidate.astype(np.int16)).max(initial=0))
        kind = self.per_kind.setdefault(Path(path).parent.name, {"images": 0, "mismatched": 0, "worst": 0})
        bad = difference > self.tolerance
        kind["images"], kind["mismatched"] = kind["images"] + 1, kind["mismatched"] + bad
        kind["worst"] = max(kind["worst"], difference)
        self.images, self.mismatched, self.worst = self.images + 1, self.mismatched + bad, max(self.worst, difference)
        if bad and len(self.examples) < 10:
            self.examples.append(f"{path}: {difference} levels")

    def row(self) -> dict:
        return {"images": self.images, "mismatched": self.mismatched, "worst_levels": self.worst,
                "tolerance_levels": self.tolerance, "per_kind": self.per_kind, "examples": self.examples}


def compare(files: Sequence[str], reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray],
            tolerance: int = TOLERANCE) -> Agreement:
    result = Agreement(tolerance)
    for path, ref, cand in zip(files, reference, candidate):
        result.add(path, ref, cand)
    return result


def agreement(files: Sequence[str], loads: Sequence[float] = (0.0,), device: str = "gpu",
              graphs: dict[str, Graph] | None = None, candidate: dict[str, Graph] | None = None,
              image_size: int = 224, batch: int = 64) -> list[dict]:
    """Per graph and load: the candidate (`candidate`'s graph, else the same graph, on `device`) against the
    CPU graph, image by image. One row each: graph, device, hw_decoder_load, seconds and Agreement.row()."""
    rows = []
    for name, graph in (graphs or GRAPHS).items():
        reference = Decoder(files, graph, "cpu", image_size=image_size, batch=batch).all_images()
        for load in loads:
            start = time.perf_counter()
            other = Decoder(files, (candidate or {}).get(name, graph), device, load, image_size, batch)
            got = other.all_images()
            del other
            rows.append({"graph": name, "device": device, "hw_decoder_load": load,
                         "seconds": round(time.perf_counter() - start, 2), **compare(files, reference, got).row()})
    return rows


def stress(files: Sequence[str], iterations: int = 200, device: str = "gpu", loads: Sequence[float] = (0.65, 0.99),
           image_size: int = 224, batch: int = 64) -> dict:
    """Two val pipelines (one per load in `loads`, each on its own stream) decoding `files` concurrently in
    two threads for `iterations` batches each; every image compared with the CPU reference."""
    reference = Decoder(files, val_graph, "cpu", image_size=image_size, batch=batch).all_images()
    pipes = [Decoder(files, val_graph, device, load, image_size, batch, seed=i) for i, load in enumerate(loads)]
    results = [Agreement() for _ in pipes]
    errors: list[str] = []

    def work(pipe: Decoder, result: Agreement) -> None:
        try:
            for i in range(iterations):
                first = (i % pipe.batches) * batch
                for j, image in enumerate(pipe.next_batch()):
                    result.add(files[first + j], reference[first + j], image)
        except Exception as e:  # a thread's failure is reported, not lost
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(p, r)) for p, r in zip(pipes, results)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"device": device, "pipelines": len(pipes), "iterations": iterations, "loads": list(loads),
            "seconds": round(time.perf_counter() - start, 2), "errors": errors,
            "images": sum(r.images for r in results), "corrupt": sum(r.mismatched for r in results),
            "per_pipeline": [r.row() for r in results]}


# -- command line ---------------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dali_pipes_bench.gpu_agreement", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("make", "check", "stress"))
    parser.add_argument("root", help="the hard images' folder (ROOT/<kind>/...)")
    parser.add_argument("--images", type=int, default=10000, help="make: how many")
    parser.add_argument("--device", default="gpu", choices=("gpu", "cpu"), help="the candidate's device")
    parser.add_argument("--loads", default="0,0.65,0.99", help="check: hw_decoder_load values; stress: two")
    parser.add_argument("--iterations", type=int, default=200, help="stress: batches per pipeline")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--out", default="", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.action == "make":
        result: Any = make_hard_images(args.root, args.images)
    else:
        files, loads = hard_files(args.root), [float(x) for x in args.loads.split(",")]
        if not files:
            raise FileNotFoundError(f"{args.root}: no images; make them with: python -m "
                                    f"dali_pipes_bench.gpu_agreement make {args.root}")
        common = dict(device=args.device, image_size=args.image_size, batch=args.batch)
        result = (agreement(files, loads, **common) if args.action == "check" else
                  stress(files, args.iterations, loads=loads[-2:], **common))
    text = json.dumps(result)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    bad = result["corrupt"] if args.action == "stress" else sum(r.get("mismatched", 0) for r in result) \
        if isinstance(result, list) else 0
    return 1 if bad else 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
