"""Opening, validating and converting images, with errors that name the file and the fix.

Conventions, shared by the dataset loaders and the processor:

- **Colour modes** are converted to 8-bit RGB by `convert_to_rgb`, the one conversion used by the dataset loaders,
  feature extraction and [`CaptionProcessor`] (so an image gives the same pixels whichever path it takes):
  - grayscale (`"1"`, `"L"`) is replicated over the three channels;
  - images with transparency are composited on a white background: modes with an alpha band (`"RGBA"`, `"LA"`,
    `"PA"` and the premultiplied `"RGBa"`, `"La"`) and any image with a `transparency` entry (a palette image's
    transparent index or per-entry alpha, the transparent colour of an `"L"` or `"RGB"` PNG);
  - `"CMYK"` uses Pillow's conversion, `(255 - C) * (255 - K) / 255` per channel (no ICC colour management);
  - 16-bit grayscale (`"I;16"`, `"I;16B"`, `"I;16L"`, `"I;16N"`) and 32-bit integer grayscale (`"I"`, how Pillow
    holds 16-bit PNG and TIFF data once converted) are read on the 16-bit scale: `value / 257` maps [0, 65535] onto
    [0, 255], rounded and clipped. The scale is the mode's, never the image's, so a dark 16-bit image stays dark;
  - float grayscale (`"F"`) has no fixed scale in Pillow (float TIFF files, `Image.fromarray` of float arrays), and
    both [0, 1] and [0, 255] are common: values are read as [0, 1] when the image's maximum is at most 1, else as
    [0, 255], then rounded and clipped (negative values become 0). On the 0-255 scale an image whose maximum is 1
    is black to the eye anyway, whereas reading a [0, 1] image on that scale would turn it black;
  - palette images without transparency and the other modes Pillow can convert (`"YCbCr"`, `"LAB"`, `"HSV"`) use
    Pillow's conversion.
- **Truncated or corrupt files** raise a `ValueError` naming the file (Pillow's own message says only "image file is
  truncated"). The dataset loaders decode every image once before returning (`find_undecodable_images`), so that a
  bad file stops nothing mid-run.
- **Very large images**: Pillow refuses to open an image of more than `2 * PIL.Image.MAX_IMAGE_PIXELS` pixels (about
  179 megapixels by default) as a possible decompression bomb; `open_image` turns this into a `ValueError` naming
  the file and how to raise the limit for trusted data. Merely big images are decoded at reduced resolution when
  `max_size` is given: JPEG files through `Image.draft` (DCT-domain scaling, cheap), then `Image.thumbnail` for
  every format, keeping the aspect ratio.

This module needs only the standard library, numpy and Pillow: it is copied next to a processor saved for
`trust_remote_code` loading.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from PIL import Image

__all__ = [
    "check_image_files",
    "convert_to_rgb",
    "decode_image",
    "find_undecodable_images",
    "open_image",
    "rgb_for_image_processor",
]

# Transparent pixels are shown on white rather than in the colour they happen to store (often black, so dropping the
# alpha band shows content nobody saw): viewers and web pages mostly display them on white, so that is what captions
# of web-collected images describe, and white is the background of the shapes dataset.
WHITE = (255, 255, 255)
_SIXTEEN_BIT_SCALE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")
_ALPHA_BANDS = frozenset({"A", "a"})
_MAX_LISTED_PATHS = 5


def decode_image(value: Any) -> Any:
    """A value of an `image` column as an image: decoded already (a PIL image), or decoded now where the column is
    read undecoded (`datasets.Image(decode=False)`, whose values are `{"bytes", "path"}`), so that only the images
    someone looks at are decoded."""
    if isinstance(value, dict):
        return datasets.Image().decode_example(value)
    return value


def _describe(image: Image.Image) -> str:
    filename = getattr(image, "filename", "")
    return f"image file {filename}" if filename else "in-memory image"


def _decompression_bomb_message(path: str | os.PathLike, error: Exception) -> str:
    return (
        f"Image file {path} is too large to open safely: {error} If the file is trusted, raise Pillow's limit before "
        "loading with `PIL.Image.MAX_IMAGE_PIXELS = <number of pixels>` (or `None` to disable the check), or "
        "downscale the file beforehand."
    )


def _gray_to_rgb(values: np.ndarray) -> Image.Image:
    """Grayscale values on the 0-255 scale (any float) -> an `"RGB"` image, rounded and clipped."""
    eight_bit = np.clip(np.rint(values), 0, 255).astype(np.uint8)
    return Image.fromarray(eight_bit).convert("RGB")


# Images much larger than an image processor's output are box-reduced first: resizing from full resolution costs time
# and memory for no visible difference at, say, 224x224.
_MAX_OVERSIZE = 4


def rgb_for_image_processor(image: Image.Image, image_processor) -> Image.Image:
    """
    `image` in RGB ([`convert_to_rgb`]), box-reduced by an integer factor while its shorter side stays at least
    4 times the side `image_processor` resizes to (its `size`: `height` and `width`, or `shortest_edge`). Feature
    extraction and captioning both prepare images this way, so that a photo captioned by a model trained on
    extracted features gives the backbone the pixels its training images gave it.
    """
    # reduce after converting: box-averaging CMYK ink, alpha or palette indices is not averaging colours, and Pillow
    # cannot reduce palette or 16-bit images at all
    rgb = convert_to_rgb(image)
    size = getattr(image_processor, "size", None)
    target = max((size.get(side) or 0 for side in ("height", "width", "shortest_edge")), default=0) if size else 0
    factor = min(rgb.size) // (_MAX_OVERSIZE * target) if target else 0
    return rgb.reduce(factor) if factor >= 2 else rgb


def convert_to_rgb(image: Image.Image, background: tuple[int, int, int] = WHITE) -> Image.Image:
    """Convert an image of any common Pillow mode to 8-bit RGB (see the module docstring for each mode).

    Args:
        image (`PIL.Image.Image`): the image; lazily opened files are decoded here.
        background (`tuple[int, int, int]`, *optional*, defaults to white): the colour transparent pixels are
            composited on.

    Returns:
        `PIL.Image.Image`: an `"RGB"` image of the same size (the input itself if it already is RGB without a
        transparent colour).

    Raises:
        `ValueError`: if the image data is truncated or corrupt, or its mode cannot be converted.
    """
    try:
        image.load()
    except (OSError, SyntaxError) as error:
        raise ValueError(
            f"Cannot decode {_describe(image)}: {error}. The file is truncated or corrupt; re-download or re-encode "
            "it, or remove it from the dataset."
        ) from error
    mode = image.mode
    if mode in _SIXTEEN_BIT_SCALE_MODES:
        # 65535 / 257 = 255: the full 16-bit range maps exactly onto the 8-bit range.
        return _gray_to_rgb(np.asarray(image, dtype=np.float64) / 257.0)
    if mode == "F":
        values = np.asarray(image, dtype=np.float64)
        return _gray_to_rgb(values * 255.0 if values.max(initial=0.0) <= 1.0 else values)
    if _ALPHA_BANDS.intersection(image.getbands()) or "transparency" in image.info:
        canvas = Image.new("RGBA", image.size, (*background, 255))
        return Image.alpha_composite(canvas, image.convert("RGBA")).convert("RGB")
    if mode == "RGB":
        return image
    try:
        return image.convert("RGB")
    except ValueError as error:
        raise ValueError(
            f"Cannot convert {_describe(image)} from mode {mode!r} to RGB: {error}. Convert the file to RGB "
            "beforehand (e.g. with `PIL.Image.open(path).convert('RGB').save(new_path)`)."
        ) from error


def open_image(path: str | os.PathLike, max_size: int | None = None) -> Image.Image:
    """Open an image file as 8-bit RGB, optionally downscaled so that neither side exceeds `max_size`.

    Args:
        path (`str` or `os.PathLike`): the image file.
        max_size (`int`, *optional*): longest side allowed, in pixels. Larger images are decoded at reduced
            resolution (`Image.draft` for JPEG) and shrunk with `Image.thumbnail`, keeping the aspect ratio.
            `None` keeps the original size.

    Returns:
        `PIL.Image.Image`: an `"RGB"` image.

    Raises:
        `FileNotFoundError`: if `path` does not exist.
        `ValueError`: if the file is not an image, is truncated or corrupt, or exceeds Pillow's decompression-bomb
            limit (the message says how to raise it).
    """
    if max_size is not None and max_size < 1:
        raise ValueError(f"max_size must be a positive number of pixels or None, got {max_size!r}.")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Image file {path} does not exist.")
    try:
        image = Image.open(path)
    except Image.DecompressionBombError as error:
        raise ValueError(_decompression_bomb_message(path, error)) from error
    except (OSError, SyntaxError) as error:  # PIL.UnidentifiedImageError is an OSError
        raise ValueError(
            f"Cannot open image file {path}: {error}. Is it an image in a format Pillow reads?"
        ) from error
    if max_size is not None and max(image.size) > max_size:
        # Only JPEG (and PCD) implement draft; it picks a scale of 1/2, 1/4 or 1/8 no smaller than the request.
        image.draft("RGB", (max_size, max_size))
    rgb = convert_to_rgb(image)
    if max_size is not None and max(rgb.size) > max_size:
        rgb.thumbnail((max_size, max_size), Image.Resampling.BICUBIC)
    return rgb


def _decoding_problem(image_file: str | bytes) -> str | None:
    """Why an image file (its path, or its encoded bytes) cannot be decoded, or None if it can."""

    def opened() -> Image.Image:
        # a fresh file object for each pass: verify() leaves the image unusable
        return Image.open(io.BytesIO(image_file) if isinstance(image_file, bytes) else image_file)

    try:
        with opened() as image:
            image.verify()  # structure and checksums, without decoding pixels
        with opened() as image:
            # verify() does not decode JPEG data: a reduced-size decode still reads the whole stream (cheap).
            image.draft("RGB", (64, 64))
            image.load()
    except Image.DecompressionBombError as error:
        return _decompression_bomb_message(image_file if isinstance(image_file, str) else "in the dataset", error)
    except Image.UnidentifiedImageError:
        # Pillow's message names the file object, which says nothing for encoded bytes
        return "UnidentifiedImageError: not an image format Pillow reads, or a corrupt header"
    except (OSError, SyntaxError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def find_undecodable_images(
    image_files: Iterable[str | os.PathLike | bytes], num_threads: int | None = None
) -> dict[int, str]:
    """Decode every image file once and say which cannot be decoded (`Image.verify` plus a reduced-size decode).

    Args:
        image_files (`Iterable[str | os.PathLike | bytes]`): the files, as paths or as their encoded bytes (the
            `bytes` of an undecoded `datasets.Image` value).
        num_threads (`int`, *optional*): decoding threads (Pillow decodes without holding the GIL); defaults to
            `min(8, os.cpu_count())`.

    Returns:
        `dict[int, str]`: the position of every file that cannot be decoded, with why.
    """
    image_files = [file if isinstance(file, bytes) else str(file) for file in image_files]
    num_threads = num_threads or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=num_threads) as executor:
        problems = executor.map(_decoding_problem, image_files)
        return {position: problem for position, problem in enumerate(problems) if problem is not None}


def _list_paths(paths: Sequence[str]) -> str:
    listed = "\n  ".join(paths[:_MAX_LISTED_PATHS])
    more = f"\n  ... and {len(paths) - _MAX_LISTED_PATHS} more" if len(paths) > _MAX_LISTED_PATHS else ""
    return f"  {listed}{more}"


def check_image_files(
    paths: Iterable[str | os.PathLike], verify: bool = False, num_threads: int | None = None
) -> None:
    """Check that every image file exists (and, with `verify=True`, decodes), raising ONE error for all problems.

    Run by the dataset loaders before training starts, so that a missing file does not stop a run hours in.

    Args:
        paths (`Iterable[str | os.PathLike]`): the image files.
        verify (`bool`, *optional*, defaults to `False`): also open every file and check that it decodes
            (`Image.verify` plus a reduced-resolution decode). Slower: it reads every file.
        num_threads (`int`, *optional*): threads used by `verify` (Pillow decodes without holding the GIL);
            defaults to `min(8, os.cpu_count())`.

    Raises:
        `FileNotFoundError`: if files are missing; the message gives their count and the first paths.
        `ValueError`: if `verify` finds files that cannot be decoded; the message gives their count, the first paths
            and why each failed.
    """
    paths = [str(path) for path in paths]
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        parents = sorted({str(Path(path).parent) for path in missing[:_MAX_LISTED_PATHS]})
        raise FileNotFoundError(
            f"{len(missing)} of {len(paths)} image files are missing:\n{_list_paths(missing)}\n"
            f"Check that the images were downloaded and that the images root is right (looked in: "
            f"{', '.join(parents)})."
        )
    if not verify:
        return
    undecodable = find_undecodable_images(paths, num_threads)
    if undecodable:
        problems = [f"{paths[position]} ({problem})" for position, problem in undecodable.items()]
        raise ValueError(
            f"{len(problems)} of {len(paths)} image files cannot be decoded:\n{_list_paths(problems)}\n"
            "Re-download or re-encode these files, or remove them from the annotations."
        )
