"""DALI's image decoders as the graphs call them: where they run (resolve_decode_device), their arguments
(decoder_args: memory paddings per thread, the hardware decoder's share and hints) checked by value before DALI
sees them (check_decoder_args), and decode_rgb, the one decode node every graph starts with.

The caller gives the decoders what they depend on as arguments: the pipeline's thread count (the paddings are
per thread) and the hardware decoder's share, both from the rank's PipelineSpec (run/pipeline.py's TunedKnobs),
never read back from DALI's pipeline being defined.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from dali_pipes.graph.augment_config import JPEG_MAX_SIDE, AugmentConfig, finite_number

if TYPE_CHECKING:
    from nvidia.dali.data_node import DataNode

DEVICES = ("gpu", "cpu")

# nvJPEG buffers of the mixed decoders. DALI preallocates them *per CPU thread*: one device buffer of
# `device_memory_padding` and two pinned host buffers of `host_memory_padding` per thread. DALI's
# ResNet-50 example pads 211 MB / 140 MB, sized for ImageNet's largest image; per thread, at 16
# threads that is 3.4 GB of GPU memory and 4.5 GB of pinned host memory per process. Here the
# example's sizes are a budget per *process*, split across the threads, and no thread gets less
# than DALI's own defaults (16 MiB / 8 MiB: a 5-Mpixel RGB image, larger than all but a handful of
# ImageNet's images). A larger image makes its thread grow the buffer once (one allocation, then
# reused), which is what the padding only postpones. A GPU run should confirm the sizes: the
# doctor's throughput runs report peak GPU memory.
DEVICE_PADDING_BUDGET = 211_025_920
HOST_PADDING_BUDGET = 140_544_512
DALI_DEFAULT_DEVICE_PADDING = 16 * 2**20
DALI_DEFAULT_HOST_PADDING = 8 * 2**20
MAX_PADDING = 4 * 2**30  # per thread; more is a unit mistake (bytes, not pixels or MB)
HW_DECODER_WIDTH_HINT, HW_DECODER_HEIGHT_HINT = 5980, 6430  # ImageNet's largest image (DALI's example)
# What is preallocated can be sized to the data (AugmentConfig.decoder_size_hint): the hardware decoder's
# width and height hints to the box around the data's images, and each thread's paddings to one decoded RGB
# image of that box (never above the budget's share). Where the data's sizes are not known (no conversion
# manifest lists them) the hints stay ImageNet's largest image, as above; (0, 0) preallocates nothing, and
# DALI allocates on first use, sized to the images met (its own default).


def resolve_decode_device(device: str, decode_device: str | None) -> str:
    """Where the decoder runs: `decode_device`, or `device` when None. A GPU decode feeding a CPU
    pipeline is refused (the decoded images would come back to the host every batch)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    decode_device = decode_device or device
    if decode_device not in DEVICES:
        raise ValueError(f"decode_device must be one of {DEVICES} or None, got {decode_device!r}")
    if device == "cpu" and decode_device == "gpu":
        raise ValueError("decode_device='gpu' needs device='gpu': a GPU decode cannot feed a CPU pipeline. "
                         "For CPU decoding with GPU augmentation use device='gpu', decode_device='cpu'")
    return decode_device


def decoder_paddings(num_threads: int, size_hint: tuple[int, int] | None = None) -> tuple[int, int]:
    """(device_memory_padding, host_memory_padding) per thread: the per-process budget split across
    `num_threads`, never below DALI's defaults (see DEVICE_PADDING_BUDGET); with a `size_hint` (width, height)
    no more than one decoded RGB image of that size, (0, 0) none at all."""
    threads = max(1, num_threads)
    device, host = (max(DALI_DEFAULT_DEVICE_PADDING, DEVICE_PADDING_BUDGET // threads),
                    max(DALI_DEFAULT_HOST_PADDING, HOST_PADDING_BUDGET // threads))
    if size_hint is None:
        return device, host
    image = size_hint[0] * size_hint[1] * 3
    return min(device, image), min(host, image)


def check_decoder_args(args: dict) -> dict:
    """Check the decoder arguments DALI never checks by value; returns `args` unchanged."""
    for key in ("device_memory_padding", "host_memory_padding"):
        value = args.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PADDING:
            raise ValueError(f"{key} must be a byte count in [0, {MAX_PADDING}] per thread, got {value!r}")
    for key in ("preallocate_width_hint", "preallocate_height_hint"):
        value = args.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= JPEG_MAX_SIDE:
            raise ValueError(f"{key} must be a side in pixels in [0, {JPEG_MAX_SIDE}], got {value!r}")
    load = args.get("hw_decoder_load", 0.0)
    if not finite_number(load) or not 0 <= load <= 1:
        raise ValueError(f"hw_decoder_load must be in [0, 1], got {load!r}")
    return args


def decoder_args(decode_device: str, cfg: AugmentConfig, *, num_threads: int, hw_decoder_load: float) -> dict:
    """Keywords for DALI's image decoders on `decode_device` ("gpu": the mixed decoder), for a pipeline of
    `num_threads` CPU threads (the paddings are per thread) and the hardware decoder's share `hw_decoder_load`
    (cfg.hw_decoder_load is the loader's request, which the spec resolves: run/pipeline.TunedKnobs)."""
    from nvidia.dali import types
    # Fancy upsampling makes the mixed decoder upsample chroma as libjpeg-turbo does, so GPU and CPU
    # decodes agree at colour edges. DALI 2.4 accepts it on both backends; it changes only the mixed one.
    # adjust_orientation: False reads a JPEG as stored, as PIL does (DataLoader's ImageFolder applies no EXIF tag)
    args: dict[str, Any] = dict(device="mixed" if decode_device == "gpu" else "cpu",
                                output_type=types.DALIImageType.RGB, jpeg_fancy_upsampling=True,
                                adjust_orientation=cfg.exif_orientation is not False)
    if decode_device == "gpu":
        device_padding, host_padding = decoder_paddings(num_threads, cfg.decoder_size_hint)
        width, height = cfg.decoder_size_hint or (HW_DECODER_WIDTH_HINT, HW_DECODER_HEIGHT_HINT)
        args.update(device_memory_padding=device_padding, host_memory_padding=host_padding,
                    hw_decoder_load=hw_decoder_load, preallocate_width_hint=width, preallocate_height_hint=height)
    return check_decoder_args(args)


def decode_rgb(decoder: Callable[..., DataNode], jpegs: DataNode, cfg: AugmentConfig, decode_device: str, *,
               num_threads: int, hw_decoder_load: float, **args) -> DataNode:
    """`decoder` (one of DALI's image decoders) of `jpegs` with `args` and decoder_args (for `num_threads` and
    `hw_decoder_load`): uint8 RGB HWC.

    png16="pil" reads 16-bit PNGs as PIL's convert("RGB") does, which DALI's uint8 decode cannot: PIL clips
    16-bit grey (mode I;16) at 255 and keeps the high byte of colour (and of grey + alpha); DALI scales each
    16-bit image by 255/65535, rounded. Those samples alone (a per-sample `if`: the pipeline is built with
    enable_conditionals, pipeline.py) are decoded at 16 bits and divided as their PNG header says; every
    other image takes the plain decode. tests/test_dataloader_args.py checks it against PIL, pixel for pixel."""
    from nvidia.dali import fn, types
    args.update(decoder_args(decode_device, cfg, num_threads=num_threads, hw_decoder_load=hw_decoder_load))
    if cfg.png16 != "pil":
        return decoder(jpegs, **args)
    # A PNG: 8-byte signature, then IHDR: length, "IHDR", width, height, bit depth (byte 24), colour type (25)
    head = fn.slice(jpegs, [0], [26], axes=[0], out_of_bounds_policy="pad", fill_values=0)
    if (head[0] == 0x89) & (head[1] == 0x50) & (head[24] == 16):  # a branch's operator needs a name of its own
        wide = {**args, "name": args["name"] + "16"} if "name" in args else args
        images = _as_pil_reduces(decoder(jpegs, dtype=types.DALIDataType.UINT16, **wide), grey=head[25] == 0)
    else:
        images = decoder(jpegs, **args)
    return images


def _as_pil_reduces(images: DataNode, grey: DataNode) -> DataNode:
    """16-bit images to uint8 as PIL reduces them: grey (mode I;16) clipped at 255, else the high byte."""
    from nvidia.dali import fn, types
    from nvidia.dali import math as dmath
    divisor = 256 - 255 * fn.cast(grey, dtype=types.DALIDataType.INT32)
    return fn.cast(dmath.min(images // divisor, 255), dtype=types.DALIDataType.UINT8)
