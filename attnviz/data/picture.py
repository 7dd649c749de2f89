"""An image as a model's input, read as untrusted: a PNG, JPEG or WebP file (or its bytes, or standard input),
checked before it is decoded, and fitted to a vision transformer's patch grid. No torch here (Pillow and
numpy).

    read_image   bytes or a path -> (H, W, 3) uint8 RGB, the file's own orientation applied
    fit          (H, W, 3) -> (h, w, 3) with the longer side `size` pixels and both sides whole patches: the
                 whole picture, neither cropped nor padded nor squashed (within a patch of its proportions)
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnviz.errors import InputError

MAX_IMAGE_BYTES = 50 << 20  # an image file, at most
MAX_IMAGE_PIXELS = 40_000_000  # width × height as the file declares it, checked before decoding (a bomb)
FORMATS = ("PNG", "JPEG", "WEBP")
MIN_SIZE, MAX_SIZE = 28, 1024  # the longer side fed to the model, in pixels


@dataclass(frozen=True, eq=False)
class Picture:
    """A picture as a vision model's input, decoded and checked: what the API functions that take a text take
    instead for a vision model (attnviz.picture(path) makes one). pixels (H, W, 3) uint8 RGB."""

    pixels: np.ndarray
    name: str
    size: int | None = None  # the longer side to feed the model (None: the model's own)

    is_picture = True  # what check_text looks for (attnviz.base.text imports nothing of this module)

    def __repr__(self) -> str:
        return f"Picture({self.name!r}, {self.pixels.shape[1]} × {self.pixels.shape[0]} pixels)"


def picture(image, name: str | None = None, size: int | None = None) -> Picture:
    """A Picture of `image`: a path, "-" (standard input), the file's bytes, an (H, W, 3) uint8 array or a PIL
    image."""
    if size is not None and not MIN_SIZE <= size <= MAX_SIZE:
        raise InputError(f"the image size takes {MIN_SIZE} to {MAX_SIZE} pixels; got {size}", "size")
    if isinstance(image, Picture):
        return image if size is None else Picture(image.pixels, image.name, size)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
            raise InputError("an image array must be (height, width, 3) uint8 RGB", "image")
        if image.shape[0] * image.shape[1] > MAX_IMAGE_PIXELS:
            raise InputError(f"the image has more than {MAX_IMAGE_PIXELS:,} pixels", "image")
        return Picture(image, name or "an image array", size)
    if hasattr(image, "convert") and hasattr(image, "size"):  # a PIL image
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, format="PNG")
        return Picture(read_image(buffer.getvalue(), name or "a picture"), name or "a picture", size)
    if isinstance(image, (bytes, bytearray)):
        return Picture(read_image(bytes(image), name or "the image bytes"), name or "the image bytes", size)
    if not isinstance(image, (str, Path)):
        raise InputError(f"an image is a path, bytes, an array or a PIL image; got {type(image).__name__}", "image")
    data, shown = read_bytes(None if str(image) == "-" else image)
    return Picture(read_image(data, shown), name or Path(shown).name, size)


def read_bytes(source: str | Path | None) -> tuple[bytes, str]:
    """(the file's bytes, its name for messages); None or "-" reads standard input. At most MAX_IMAGE_BYTES."""
    from attnviz.base.files import read_input

    return read_input(None if source is None or str(source) == "-" else source, MAX_IMAGE_BYTES, "image")


def read_image(data: bytes, name: str = "the image") -> np.ndarray:
    """Decode an image's bytes to (H, W, 3) uint8 RGB: PNG, JPEG or WebP only, its declared size checked
    against MAX_IMAGE_PIXELS before any pixel is decoded, every decoding error one line."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if not data:
        raise InputError(f"{name} is empty: give a PNG, JPEG or WebP image", "image")
    try:
        with Image.open(io.BytesIO(data), formats=list(FORMATS)) as image:
            width, height = image.size
            if width < 1 or height < 1 or width * height > MAX_IMAGE_PIXELS:
                raise InputError(f"{name} declares {width} × {height} pixels; attnviz reads images of at most "
                                 f"{MAX_IMAGE_PIXELS:,} pixels", "image")
            if getattr(image, "n_frames", 1) > 1:
                image.seek(0)  # an animation: its first frame
            image.load()
            upright = ImageOps.exif_transpose(image)
            if upright.mode in ("P", "PA") and "transparency" in upright.info:
                upright = upright.convert("RGBA")  # as an RGBA file is read (Pillow warns on a direct convert)
            rgb = upright.convert("RGB")
    except InputError:
        raise
    except UnidentifiedImageError:
        raise InputError(f"{name} is not a PNG, JPEG or WebP image", "image") from None
    except Image.DecompressionBombError:
        raise InputError(f"{name} would decode to more than {MAX_IMAGE_PIXELS:,} pixels", "image") from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as exc:  # truncated or damaged data
        raise InputError(f"{name} could not be decoded ({type(exc).__name__}): the file is damaged or not an "
                         f"image", "image") from None
    pixels = np.asarray(rgb, dtype=np.uint8)
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise InputError(f"{name} did not decode to an RGB picture", "image")
    return pixels


def fit(pixels: np.ndarray, size: int, patch: int) -> np.ndarray:
    """The picture resized (bicubic) so that its longer side is about `size` pixels and both sides are whole
    patches: (h, w, 3) uint8, h and w multiples of `patch`, at least one patch each."""
    from PIL import Image

    if not MIN_SIZE <= size <= MAX_SIZE:
        raise InputError(f"the image size takes {MIN_SIZE} to {MAX_SIZE} pixels; got {size}", "image_size")
    height, width = pixels.shape[:2]
    scale = size / max(height, width)
    rows = max(1, round(height * scale / patch))
    cols = max(1, round(width * scale / patch))
    resized = Image.fromarray(pixels).resize((cols * patch, rows * patch), Image.Resampling.BICUBIC)
    return np.asarray(resized, dtype=np.uint8)


def patch_names(rows: int, cols: int) -> list[str]:
    """The tokens' names of a patch grid, row by row: p(0,0), p(0,1), …"""
    return [f"p({r},{c})" for r in range(rows) for c in range(cols)]
