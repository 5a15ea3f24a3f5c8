"""Is this an image, and not a decompression bomb? The header read without decoding (PIL's format plugins),
then a full decode: what `verify` reports and the bad-sample search names."""

from __future__ import annotations

import io
import warnings

from PIL import Image

DEFAULT_MAX_PIXELS = 89_478_485  # PIL's own bomb threshold (~ 9459 x 9459)


def header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from an image's header, or None. PIL's format plugins are called directly:
    Image.open would apply PIL's own bomb guard, a process-wide setting we leave alone."""
    Image.init()
    prefix = data[:16]
    for format_id in Image.ID:
        factory, accept = Image.OPEN[format_id]
        if accept and not accept(prefix):
            continue
        try:
            with factory(io.BytesIO(data), "") as img:  # "": no file name, as Image.open passes for a stream
                return img.size
        except Exception:
            continue
    return None


def oversized(data: bytes, max_pixels: int | None) -> str | None:
    """What is wrong if the image header claims more than `max_pixels` pixels, from the header
    alone (nothing is decoded); None if it does not, or if the header cannot be read."""
    if max_pixels is None or not data:
        return None
    size = header_size(data)
    if size is None:
        return None  # unreadable headers are the decoder's (and check_image's) to report
    width, height = size
    if width * height <= max_pixels:
        return None
    return (f"oversized: {width} x {height} = {width * height:,} pixels, over the limit of {max_pixels:,} "
            f"(a decompression bomb, or raise --max-pixels)")


def check_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> str | None:
    """None if `data` decodes to an image within the pixel limit, else what is wrong. The pixel
    count comes from the header, before any pixel is decoded. PIL's own bomb guard stays on in
    this process (only verification's worker processes lift it, for limits above PIL's)."""
    if not data:
        return "zero-byte file"
    too_big = oversized(data, max_pixels)
    if too_big:
        return too_big
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit decided above
            with Image.open(io.BytesIO(data)) as img:
                img.load()
    except Image.DecompressionBombError as e:
        return f"oversized: {e} (a decompression bomb, or raise --max-pixels)"
    except Image.UnidentifiedImageError:
        return f"not an image (starts with {data[:8]!r})"
    except (OSError, SyntaxError, ValueError) as e:
        return f"truncated or corrupt image ({e})"
    return None
