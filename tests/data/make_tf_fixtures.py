"""Writes the TensorFlow-made fixtures in this folder (run once, with TensorFlow installed):
    python tests/data/make_tf_fixtures.py tests/data
Three JPEGs as tf.train.Examples with the keys and 1-based labels of TensorFlow's ImageNet
scripts (build_imagenet_data.py), written by tf.io.TFRecordWriter uncompressed, GZIP and ZLIB.
The tests read them without TensorFlow."""

import io
import json
import os
import sys

import numpy as np
import tensorflow as tf
from PIL import Image


def jpeg(level):
    pixels = np.full((16 + level, 24, 3), (level * 40, 255 - level * 30, 90), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def example(data, label, name):
    b = lambda v: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
    i = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": b(data), "image/class/label": i(label), "image/class/synset": b(b"n0000000%d" % label),
        "image/format": b(b"JPEG"), "image/filename": b(name.encode()), "image/height": i(16 + label),
        "image/width": i(24), "image/colorspace": b(b"RGB"), "image/channels": i(3),
        "image/object/bbox/xmin": tf.train.Feature(float_list=tf.train.FloatList(value=[0.1, 0.2])),
    })).SerializeToString()


def main(out):
    samples = [(jpeg(k), k + 1, f"img_{k}.JPEG") for k in range(3)]  # 1-based labels, as TensorFlow's scripts
    for suffix, compression in (("", None), (".gz", "GZIP"), (".zz", "ZLIB")):
        folder = os.path.join(out, "tf_written" + suffix.replace(".", "_"))
        os.makedirs(folder, exist_ok=True)
        with tf.io.TFRecordWriter(os.path.join(folder, "train-00000-of-00001" + suffix), options=compression) as w:
            for data, label, name in samples:
                w.write(example(data, label, name))
    with open(os.path.join(out, "tf_written_expected.json"), "w") as f:
        json.dump({"labels": [l for _, l, _ in samples], "jpeg_sizes": [len(d) for d, _, _ in samples],
                   "tensorflow": tf.__version__}, f)


if __name__ == "__main__":
    main(sys.argv[1])
