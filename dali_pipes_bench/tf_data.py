"""tf.data over TFRecord shards, the way TensorFlow's own input pipelines are written: parallel
interleave across shards, shuffle buffer, parallel map (decode + augment), batch, prefetch
AUTOTUNE. Same transforms as the DALI graphs. Imports only TensorFlow (run with TensorFlow installed)."""

from __future__ import annotations

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def tf_dataset(shards: list[str], *, batch_size: int, train: bool, image_size: int = 224,
               image_key: str = "image/encoded", label_key: str = "image/class/label", crop_ratio: float = 0.875):
    """A repeating tf.data.Dataset of (images NCHW float32, labels int64) batches."""
    import tensorflow as tf
    auto = tf.data.AUTOTUNE
    features = {image_key: tf.io.FixedLenFeature([], tf.string), label_key: tf.io.FixedLenFeature([], tf.int64)}

    def decode_train(record):
        ex = tf.io.parse_single_example(record, features)
        shape = tf.io.extract_jpeg_shape(ex[image_key])
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, tf.zeros([0, 0, 4]), min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        image = tf.io.decode_and_crop_jpeg(ex[image_key], window, channels=3)  # ROI decode, like DALI's
        image = tf.image.resize(image, (image_size, image_size))
        image = tf.image.random_flip_left_right(image)
        return _normalize(image), ex[label_key]

    def decode_val(record):
        ex = tf.io.parse_single_example(record, features)
        image = tf.cast(tf.io.decode_jpeg(ex[image_key], channels=3), tf.float32)
        shape = tf.cast(tf.shape(image)[:2], tf.float32)
        scale = round(image_size / crop_ratio) / tf.reduce_min(shape)
        image = tf.image.resize(image, tf.cast(tf.round(shape * scale), tf.int32))
        image = tf.image.resize_with_crop_or_pad(image, image_size, image_size)
        return _normalize(image), ex[label_key]

    def _normalize(image):
        image = (tf.cast(image, tf.float32) - IMAGENET_MEAN) / IMAGENET_STD
        return tf.transpose(image, (2, 0, 1))

    files = tf.data.Dataset.from_tensor_slices(shards)
    if train:
        files = files.shuffle(len(shards))
    records = files.interleave(tf.data.TFRecordDataset, cycle_length=min(len(shards), 8), num_parallel_calls=auto,
                               deterministic=False)
    if train:
        records = records.shuffle(4096)
    return records.repeat().map(decode_train if train else decode_val, num_parallel_calls=auto) \
        .batch(batch_size, drop_remainder=True).prefetch(auto)
