"""graph.py: the values DALI accepts silently (or fails on deep inside a run) are checked when a graph is
configured, every bad one listed at once; the decoders' buffers are a budget per process."""

import pytest

from dali_pipes.graph.augment_config import AugmentConfig
from dali_pipes.graph.decoders import (
    DEVICE_PADDING_BUDGET,
    HOST_PADDING_BUDGET,
    check_decoder_args,
    decoder_args,
    decoder_paddings,
    resolve_decode_device,
)

FOUR_THREADS = {"num_threads": 4, "hw_decoder_load": 0.65}  # what build_pipeline gives the decoders from the spec


@pytest.mark.parametrize("field, value, match", [
    ("image_size", 0, "image_size must be a positive integer"),
    ("image_size", 22.4, "image_size must be a positive integer"),
    ("random_area", (0.5, 0.1), "random_area must be"),
    ("random_area", (0.0, 1.0), "random_area must be"),
    ("random_area", (0.08,), "random_area must be"),
    ("random_aspect_ratio", (4 / 3, 3 / 4), "random_aspect_ratio must be"),
    ("random_aspect_ratio", (0.0, 1.0), "random_aspect_ratio must be"),
    ("flip_probability", 1.5, r"flip_probability must be in \[0, 1\]"),
    ("flip_probability", -0.1, r"flip_probability must be in \[0, 1\]"),
    ("color_jitter", 1.0, r"color_jitter must be in \[0, 1\)"),
    ("color_jitter", -0.2, r"color_jitter must be in \[0, 1\)"),
    ("crop_ratio", 0.0, r"crop_ratio must be in \(0, 1\]"),
    ("crop_ratio", 1.14, r"crop_ratio must be in \(0, 1\]"),
    ("decoder_size_hint", (0, 480), "decoder_size_hint must be .*both 0"),
    ("decoder_size_hint", (640,), "decoder_size_hint must be"),
    ("decoder_size_hint", (-1, 5), "decoder_size_hint must be"),
    ("decoder_size_hint", (70_000, 10), r"decoder_size_hint must be .*\[1, 65535\]"),
    ("decoder_size_hint", "640x480", "decoder_size_hint must be"),
    ("decoder_size_hint", (640.0, 480), "decoder_size_hint must be"),
    ("mean", (0.5, 0.5), "mean must be 3 finite numbers"),
    ("mean", (123.675, 116.28, 103.53), "divide 0-255 values by 255"),
    ("mean", (0.5, float("nan"), 0.5), "mean must be 3 finite numbers"),
    ("std", (0.2, 0.0, 0.2), "std values must be > 0"),
    ("std", (58.395, 57.12, 57.375), "divide 0-255 values by 255"),
    ("hw_decoder_load", 1.5, r"hw_decoder_load must be in \[0, 1\]"),
    ("hw_decoder_load", -0.1, r"hw_decoder_load must be in \[0, 1\]"),
    ("hw_decoder_load", float("nan"), r"hw_decoder_load must be in \[0, 1\]"),
    ("auto_augment", "cutmix", "auto_augment must be one of"),
    ("interpolation", "nearest", "interpolation must be one of"),
    ("augmix_severity", 0, r"augmix_severity must be an integer in \[1, 10\]"),
    ("augmix_width", 2.5, r"augmix_width must be an integer in \[1, 10\]"),
    ("augmix_depth", 0, "augmix_depth must be -1"),
    ("augmix_alpha", 0.0, "augmix_alpha must be > 0"),
    ("random_erasing", 1.5, r"random_erasing must be a probability in \[0, 1\]"),
    ("random_erasing_area", (0.5, 0.1), "random_erasing_area must be"),
    ("random_erasing_ratio", (0.0, 1.0), "random_erasing_ratio must be"),
    ("random_erasing_mode", "noise", "random_erasing_mode must be one of"),
    ("random_erasing_value", (0.0, 0.0), "random_erasing_value must be 3 finite numbers"),
    ("exif_orientation", "no", "exif_orientation must be True, False or None"),
    ("png16", "clip", "png16 must be one of"),
])
def test_augment_values_are_checked(field, value, match):
    with pytest.raises(ValueError, match=match):
        AugmentConfig(**{field: value})


def test_every_bad_value_is_listed_at_once():
    with pytest.raises(ValueError, match="flip_probability.*crop_ratio"):
        AugmentConfig(flip_probability=2.0, crop_ratio=2.0)


@pytest.mark.parametrize("args, match", [
    ({"device_memory_padding": -1}, "device_memory_padding must be a byte count"),
    ({"host_memory_padding": 2**40}, "host_memory_padding must be a byte count"),
    ({"host_memory_padding": 1.5e8}, "host_memory_padding must be a byte count"),
    ({"preallocate_width_hint": -5}, "preallocate_width_hint must be a side"),
    ({"preallocate_height_hint": 70_000}, "preallocate_height_hint must be a side"),
    ({"hw_decoder_load": 1.5}, r"hw_decoder_load must be in \[0, 1\]"),
])
def test_decoder_values_are_checked(args, match):
    with pytest.raises(ValueError, match=match):
        check_decoder_args(args)


@pytest.mark.parametrize("device, decode_device, match", [
    ("cpu", "gpu", "decode_device='gpu' needs device='gpu'"),
    ("tpu", None, "device must be one of"),
    ("gpu", "npu", "decode_device must be one of"),
])
def test_device_combinations_are_checked(device, decode_device, match):
    with pytest.raises(ValueError, match=match):
        resolve_decode_device(device, decode_device)


def test_decoder_paddings_are_a_budget_per_process_not_per_thread():
    assert decoder_paddings(1) == (DEVICE_PADDING_BUDGET, HOST_PADDING_BUDGET)  # DALI's example, one thread
    device, host = decoder_paddings(16)
    assert device * 16 < 300e6 and 2 * host * 16 < 300e6  # was 3.4 GB of GPU and 4.5 GB of pinned memory
    assert device >= 16 * 2**20 and host >= 8 * 2**20  # never below DALI's own defaults


def test_decoders_upsample_chroma_alike_on_both_devices():
    for device in ("gpu", "cpu"):
        assert decoder_args(device, AugmentConfig(), **FOUR_THREADS)["jpeg_fancy_upsampling"] is True
    assert decoder_args("gpu", AugmentConfig(), **FOUR_THREADS)["device_memory_padding"] == decoder_paddings(4)[0]


def test_the_gpu_decoders_preallocate_for_the_datas_images_or_nothing():
    today = decoder_args("gpu", AugmentConfig(), **FOUR_THREADS)  # the data's sizes unknown: ImageNet's largest
    assert (today["preallocate_width_hint"], today["preallocate_height_hint"]) == (5980, 6430)
    assert (today["device_memory_padding"], today["host_memory_padding"]) == decoder_paddings(4)
    sized = decoder_args("gpu", AugmentConfig(decoder_size_hint=(640, 480)), **FOUR_THREADS)
    assert (sized["preallocate_width_hint"], sized["preallocate_height_hint"]) == (640, 480)
    assert sized["device_memory_padding"] == sized["host_memory_padding"] == 640 * 480 * 3  # one RGB image
    lazy = decoder_args("gpu", AugmentConfig(decoder_size_hint=(0, 0)), **FOUR_THREADS)
    assert [lazy[k] for k in ("preallocate_width_hint", "preallocate_height_hint", "device_memory_padding",
                              "host_memory_padding")] == [0, 0, 0, 0]  # DALI allocates on first use
    assert decoder_paddings(4, (8000, 8000)) == decoder_paddings(4)  # never above the budget's share
    assert "preallocate_width_hint" not in decoder_args("cpu", AugmentConfig(decoder_size_hint=(640, 480)),
                                                     **FOUR_THREADS)


def test_the_decoder_size_hint_is_a_flag():
    import argparse

    from dali_pipes.options import add_arguments
    parser = argparse.ArgumentParser()
    add_arguments(parser, AugmentConfig, "augment")
    assert parser.parse_args(["--decoder-size-hint", "640x480"]).decoder_size_hint == (640, 480)
    assert parser.parse_args(["--decoder-size-hint", "0x0"]).decoder_size_hint == (0, 0)
    assert parser.parse_args([]).decoder_size_hint is None and parser.parse_args(
        ["--decoder-size-hint", "none"]).decoder_size_hint is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--decoder-size-hint", "640"])
