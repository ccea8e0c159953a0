"""A picture of test images with the captions of several models under each: what a person looks at first."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence

from PIL import Image

__all__ = ["save_caption_gallery"]


def save_caption_gallery(
    images: Sequence[Image.Image],
    captions: Mapping[str, Sequence[str]],
    path: str | os.PathLike,
    columns: int = 4,
    title: str | None = None,
    wrap_width: int = 38,
) -> None:
    """
    Draws `images` in a grid with, under each, one caption per model, and saves the figure as a PNG.

    Args:
        images (`Sequence[PIL.Image.Image]`): the images, in display order.
        captions (`Mapping[str, Sequence[str]]`): model name -> one caption per image (same order as `images`).
        path (`str` or `os.PathLike`): where the PNG is written (its folder is created).
        columns (`int`, *optional*, defaults to 4): images per row.
        title (`str`, *optional*): a line above the grid.
        wrap_width (`int`, *optional*, defaults to 38): characters per caption line.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display is needed or wanted
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "save_caption_gallery draws with matplotlib: `pip install matplotlib` (or `pip install rlcaption[plots]`)."
        ) from error
    for name, model_captions in captions.items():
        if len(model_captions) != len(images):
            raise ValueError(f"{len(images)} images but {len(model_captions)} captions for {name!r}: pass one each.")
    if not images:
        raise ValueError("save_caption_gallery needs at least one image.")

    rows = -(-len(images) // columns)
    # room under each image for every model's caption, at up to four wrapped lines each
    caption_lines = 4 * len(captions)
    figure, axes = plt.subplots(
        rows, columns, figsize=(3.4 * columns, rows * (2.4 + 0.2 * caption_lines)), squeeze=False
    )
    for axis in axes.flat:
        axis.axis("off")
    for index, image in enumerate(images):
        axis = axes.flat[index]
        axis.imshow(image, interpolation="nearest")
        # a thin frame: the images' white background would otherwise merge with the page's
        axis.axis("on")
        axis.set_xticks([])
        axis.set_yticks([])
        for spine in axis.spines.values():
            spine.set_edgecolor("0.75")
        text = "\n".join(
            textwrap.fill(f"{name}: {model_captions[index]}", wrap_width, subsequent_indent="  ")
            for name, model_captions in captions.items()
        )
        axis.text(0.0, -0.04, text, transform=axis.transAxes, va="top", ha="left", fontsize=8.5, family="monospace")
    if title:
        figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")  # captions may run below the last row
    plt.close(figure)
