"""Tiny real datasets made in fixtures, and helpers that read them back through real DALI."""

from __future__ import annotations

import collections
import errno
import io
import os

import numpy as np
import pytest
from PIL import Image

from dali_pipes.data.source import Source

from timm_side import timm  # noqa: F401  (session fixture: timm's Python classes, or a skip)
from torchvision_side import torchvision  # noqa: F401  (session fixture: torchvision's Python classes, or a skip)

CLASSES = ("cat", "dog", "fish")


def jpeg_bytes(level: int, height: int = 24, width: int = 32, quality: int = 90) -> bytes:
    """A small JPEG whose content (and so bytes) is unique per level: a gradient plus a level."""
    ramp = np.add.outer(np.arange(height), np.arange(width)).astype(np.int32)
    pixels = np.stack([(ramp * 3 + level * 7) % 256, np.full_like(ramp, level * 11 % 256),
                       (ramp + level * 13) % 256], axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=quality)
    return out.getvalue()


def write_folder(root, counts=(4, 3, 5)) -> dict[str, int]:
    """ROOT/<class>/<i>.jpg with the given number of images per class; returns {path: label}."""
    expected = {}
    level = 0
    for label, (name, count) in enumerate(zip(CLASSES, counts)):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(count):
            path = os.path.join(root, name, f"{name}_{i:03d}.jpg")
            with open(path, "wb") as f:
                f.write(jpeg_bytes(level, 20 + level, 28 + 2 * level))
            expected[path] = label
            level += 1
    return expected


def write_one_per_class(root: str, n: int, first: int = 0) -> str:
    """ROOT/c<i>/image.jpg for i < n, one image per class, so that a label names its sample; returns ROOT."""
    for i in range(n):
        os.makedirs(os.path.join(root, f"c{i:02d}"))
        with open(os.path.join(root, f"c{i:02d}", "image.jpg"), "wb") as f:
            f.write(jpeg_bytes(first + i, 20 + i % 7, 28))
    return root


class TrainPreset:
    """Shaped like torchvision's references/classification/presets.py ClassificationPresetTrain (v2, tensor
    backend): an object holding a Compose in .transforms, called as preset(img). `v2` is torchvision's
    transforms.v2; `policy` an AutoAugment-family step or None."""

    def __init__(self, v2, crop, interpolation, policy, erase, mean=(0.485, 0.456, 0.406),
                 std=(0.229, 0.224, 0.225)) -> None:
        import torch
        steps = [v2.PILToTensor(), v2.RandomResizedCrop(crop, interpolation=interpolation, antialias=True),
                 v2.RandomHorizontalFlip(0.5), *([policy] if policy is not None else []),
                 v2.ToDtype(torch.float, scale=True), v2.Normalize(mean=mean, std=std), v2.RandomErasing(p=erase),
                 v2.ToPureTensor()]
        self.transforms = v2.Compose(steps)

    def __call__(self, img):
        return self.transforms(img)


class EvalPreset:
    """ClassificationPresetEval's shape, PIL backend; the Compose held in .transform this time."""

    def __init__(self, v2, crop, resize, interpolation, mean=(0.485, 0.456, 0.406),
                 std=(0.229, 0.224, 0.225)) -> None:
        import torch
        self.transform = v2.Compose([v2.Resize(resize, interpolation=interpolation, antialias=True),
                                     v2.CenterCrop(crop), v2.PILToTensor(), v2.ToDtype(torch.float, scale=True),
                                     v2.Normalize(mean=mean, std=std), v2.ToPureTensor()])

    def __call__(self, img):
        return self.transform(img)


class _FullDiskFile:
    """A file opened for writing on a "full disk": every write fails with ENOSPC, as the kernel's would."""

    def __init__(self, file, path: str) -> None:
        self._file, self._path = file, path

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)

    def writelines(self, lines) -> None:
        self.write(b"")

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


@pytest.fixture
def disk_full(monkeypatch):
    """fill(folder): from now on, a file opened for writing below `folder` fails at its first write with
    OSError(ENOSPC) (an injected full disk: a size-limited mount needs root). fill(None) frees it again."""
    import builtins
    real_open, full = builtins.open, []

    def fake_open(file, mode="r", *args, **kwargs):
        opened = real_open(file, mode, *args, **kwargs)
        path = os.path.abspath(os.fspath(file)) if isinstance(file, (str, os.PathLike)) else ""
        if full and any(c in mode for c in "wax+") and any(path.startswith(f + os.sep) for f in full):
            return _FullDiskFile(opened, path)
        return opened

    def fill(folder) -> None:
        full.clear()
        if folder is not None:
            full.append(os.path.abspath(folder))

    monkeypatch.setattr(builtins, "open", fake_open)
    return fill


def assert_placed(outputs, host_outputs=()) -> None:
    """The placement check of every GPU test: each output (a pipeline's DALI TensorLists or a loader's torch
    tensors) on the GPU by its type, except `host_outputs`, on the CPU (graph_check.placement_problems)."""
    from dali_pipes.tools.graph_check import placement_problems
    problems = placement_problems(outputs, tuple(host_outputs))
    assert not problems, problems


def write_numbered(root, n: int) -> str:
    """ROOT/list.txt over n JPEGs (distinct bytes and sizes) whose label is their index, so that a
    label names its sample; returns the list's path."""
    with open(os.path.join(root, "list.txt"), "w") as f:
        for i in range(n):
            with open(os.path.join(root, f"{i:03d}.jpg"), "wb") as image:
                image.write(jpeg_bytes(i, 24 + i % 5, 32))
            f.write(f"{i:03d}.jpg {i}\n")
    return os.path.join(root, "list.txt")


@pytest.fixture(scope="module")
def numbered(request, tmp_path_factory) -> str:
    """The path of a file list of N JPEGs whose label is their index (N: the test module's own constant, else
    23, which no small world size divides): a label names its sample. Wrap it in open_source for a Source."""
    return write_numbered(str(tmp_path_factory.mktemp("numbered")), getattr(request.module, "N", 23))


@pytest.fixture(scope="module")
def folder(request, tmp_path_factory) -> str:
    """An image folder, ROOT/<class>/<i>.jpg, with the test module's COUNTS images per class (else write_folder's)."""
    root = tmp_path_factory.mktemp("folder") / "images"
    write_folder(str(root), **({"counts": request.module.COUNTS} if hasattr(request.module, "COUNTS") else {}))
    return str(root)


@pytest.fixture(scope="module")
def numbered_source(numbered):
    """`numbered` opened as a Source."""
    from dali_pipes import open_source
    return open_source(numbered)


@pytest.fixture
def jpeg_folder(tmp_path):
    """3 classes with 4, 3 and 5 JPEGs of distinct bytes and sizes."""
    root = tmp_path / "images"
    write_folder(str(root))
    return str(root)


def expected_multiset(root) -> collections.Counter:
    """(bytes, label) of an image folder, computed without the library."""
    out = collections.Counter()
    for label, name in enumerate(sorted(os.listdir(root))):
        for filename in os.listdir(os.path.join(root, name)):
            with open(os.path.join(root, name, filename), "rb") as f:
                out[(f.read(), label)] += 1
    return out


def dali_read_epoch(source: Source, batch_size: int = 4, **reader_args) -> collections.Counter:
    """One epoch of raw (encoded bytes, label) through the DALI reader, on CPU."""
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None)
    def pipe():
        return source.dali_reader(**reader_args)

    p = pipe()
    p.build()
    size = p.reader_meta("Reader")["epoch_size"]
    got = collections.Counter()
    while sum(got.values()) < size:
        images, labels = p.run()
        assert labels.as_array().shape == (len(labels),)  # int64 scalars per sample
        for i in range(min(len(images), size - sum(got.values()))):
            got[(np.array(images[i]).tobytes(), int(np.array(labels[i])))] += 1
    del p
    return got


def pytest_collection_modifyitems(config, items):
    """Skip @pytest.mark.gpu tests, with the reason, where torch sees no CUDA device. With
    DALI_PIPES_REQUIRE_GPU=1 (a GPU machine's run, the doctor's) they fail instead: a CPU-only
    torch on a GPU machine must not turn every GPU test into a silent skip."""
    import torch
    if torch.cuda.is_available():
        return
    reason = (f"needs a CUDA GPU (torch.cuda.is_available() is False; torch {torch.__version__}, "
              f"built for CUDA {torch.version.cuda})")
    if os.environ.get("DALI_PIPES_REQUIRE_GPU") == "1":
        message = (f"DALI_PIPES_REQUIRE_GPU=1 but this test {reason}. Install a CUDA build of torch "
                   f"(torch.version.cuda is None on a CPU-only build) or unset DALI_PIPES_REQUIRE_GPU")
        fail = lambda *args, **kwargs: pytest.fail(message, pytrace=False)
        for item in items:
            if "gpu" in item.keywords:
                item.runtest = fail  # reported as a failure of each test, with the message
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
