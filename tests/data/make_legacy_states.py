"""Writes loader states taken by dali_pipes 0.2.0 on TFRecord and WebDataset shards (run once, from a
checkout of that release, commit bd96d1d):
    git worktree add /tmp/v020 bd96d1d
    PYTHONPATH=/tmp/v020 python tests/data/make_legacy_states.py tests/data
Writes OUT/legacy_0.2.0/{tfrecord,webdataset}/ (23 JPEGs whose label is their index, in 2 shards, as
0.2.0's convert wrote them) and OUT/legacy_states_0.2.0.json: per format and split, the loader's
arguments, its state after 3 batches, and the labels and image hashes of the batches it went on to
yield to the end of the next epoch. tests/test_resume.py checks that today's code resumes them exactly."""

import base64
import hashlib
import io
import json
import os
import sys

import numpy as np
from PIL import Image

import dali_pipes
from dali_pipes import DaliLoader, convert, open_source


def jpeg_bytes(level: int, height: int, width: int = 32) -> bytes:  # tests/conftest.py's, as of 0.2.0
    ramp = np.add.outer(np.arange(height), np.arange(width)).astype(np.int32)
    pixels = np.stack([(ramp * 3 + level * 7) % 256, np.full_like(ramp, level * 11 % 256),
                       (ramp + level * 13) % 256], axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def encoded(value):
    return {"__bytes__": base64.b64encode(value).decode()} if isinstance(value, bytes) else value


def batches(loader, epochs: int) -> list:
    out = []
    for _ in range(epochs):
        out += [[labels.tolist(), hashlib.sha1(images.numpy().tobytes()).hexdigest()] for images, labels in loader]
    return out


def main(out: str) -> None:
    root = os.path.join(out, "legacy_0.2.0")
    images = os.path.join(root, "images")
    os.makedirs(images, exist_ok=True)
    with open(os.path.join(images, "list.txt"), "w") as f:
        for i in range(23):
            with open(os.path.join(images, f"{i:03d}.jpg"), "wb") as image:
                image.write(jpeg_bytes(i, 24 + i % 5))
            f.write(f"{i:03d}.jpg {i}\n")
    source = open_source(os.path.join(images, "list.txt"))
    convert.write_tfrecords(source, os.path.join(root, "tfrecord"), shards=2, progress=False)
    convert.write_webdataset(source, os.path.join(root, "webdataset"), shards=2, progress=False)
    result = {"written_by": f"dali_pipes {dali_pipes.__version__} (commit bd96d1d)"}
    for kind in ("tfrecord", "webdataset"):
        for split, args in (("train", dict(batch_size=3, train=True, device="cpu", image_size=16, num_threads=1,
                                           shuffle_buffer=8, seed=7)),
                            ("val", dict(batch_size=4, train=False, device="cpu", image_size=16, num_threads=1))):
            loader = DaliLoader(os.path.join(root, kind), **args)
            it = iter(loader)
            for _ in range(3):
                next(it)
            state = loader.state_dict()
            after = [[labels.tolist(), hashlib.sha1(images.numpy().tobytes()).hexdigest()] for images, labels in it]
            after += batches(loader, 1)
            result[f"{kind}/{split}"] = {"loader_args": args, "state": {k: encoded(v) for k, v in state.items()},
                                         "batches_after": after}
            loader.close()
    import shutil
    shutil.rmtree(images)  # the shards are the fixture; the JPEGs are in them
    with open(os.path.join(out, "legacy_states_0.2.0.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
