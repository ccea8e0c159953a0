"""
Pretraining a captioner's CNN image encoder on the scene annotations of the shapes dataset.

Captioners of the seeds read features of a CNN pretrained on labelled images (ImageNet classes; the bottom-up
features of Anderson et al. 2018 come from a detector trained on Visual Genome objects *and attributes*). On shapes the
`scene` column gives those labels: this module trains the encoder's feature grid, one cell per cell of the scene's
3x3 layout, to classify the object in each cell (shape, colour, size, or empty) with throwaway linear heads.

Why it matters: trained by teacher forcing alone, the encoder learns colours (linear in the pixels) but hardly shapes
(the word gradient reaches the CNN diluted by the soft attention), and the captioner names the right colours with the
wrong shapes. The same encoder classifies every cell's shape of the test split correctly after about a minute of this
supervision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .dataset import COLORS, GRID_CELLS, SHAPES, SIZES

__all__ = ["pretrain_image_encoder_on_scenes", "scene_cell_labels"]

_ATTRIBUTES = (("shape", SHAPES), ("color", tuple(COLORS)), ("size", SIZES))


def scene_cell_labels(scenes: Sequence[Sequence[dict[str, Any]]]) -> torch.LongTensor:
    """
    The object of every grid cell of every scene as class ids.

    Args:
        scenes: rows of the shapes `scene` column (objects with `shape`, `color`, `size`, `row`, `column`).

    Returns:
        `torch.LongTensor` of shape `(num_scenes, 9, 3)`: for each cell (row-major) the ids of its shape, colour and
        size, each counted from 1 in the order of `SHAPES`, `COLORS`, `SIZES`; 0 where the cell is empty.
    """
    labels = torch.zeros(len(scenes), GRID_CELLS * GRID_CELLS, len(_ATTRIBUTES), dtype=torch.long)
    for index, scene in enumerate(scenes):
        for obj in scene:
            cell = obj["row"] * GRID_CELLS + obj["column"]
            for position, (name, values) in enumerate(_ATTRIBUTES):
                if obj[name] not in values:
                    raise ValueError(f"Scene {index}: unknown {name} {obj[name]!r}; expected one of {values}.")
                labels[index, cell, position] = 1 + values.index(obj[name])
    return labels


def pretrain_image_encoder_on_scenes(
    image_encoder: nn.Module,
    processor: Any,
    dataset,
    num_steps: int = 400,
    batch_size: int = 64,
    learning_rate: float = 2e-3,
    seed: int = 0,
) -> dict[str, float]:
    """
    Trains `image_encoder` (a [`ConvImageEncoder`] whose last feature map is 3x3) to classify each scene cell's object.

    Args:
        image_encoder: the captioner's encoder (`model.image_encoder`), trained in place.
        processor: the captioner's processor (its image processor prepares the pixels).
        dataset: a shapes split with `image` and `scene` columns.
        num_steps (`int`, *optional*, defaults to 400): optimizer steps (about 35 s on one CPU core at 48 px).
        batch_size (`int`, *optional*, defaults to 64): images per step.
        learning_rate (`float`, *optional*, defaults to 2e-3): Adam learning rate.
        seed (`int`, *optional*, defaults to 0): seeds the heads and the batch order.

    Returns:
        `dict[str, float]`: the final loss and, on the training images, the accuracy of each attribute over the cells
        that hold an object (`shape_accuracy`, `color_accuracy`, `size_accuracy`).
    """
    if not hasattr(image_encoder, "forward_with_grid") or getattr(image_encoder, "num_grid_positions", None) != 9:
        raise ValueError(
            f"Scene pretraining needs a CNN encoder whose last feature map is {GRID_CELLS}x{GRID_CELLS}, one cell per "
            "cell of the shapes layout (e.g. image_size 48 with 4 CNN blocks); got "
            f"{type(image_encoder).__name__} with {getattr(image_encoder, 'num_grid_positions', None)} positions."
        )
    if "scene" not in dataset.column_names:
        raise ValueError("Scene pretraining needs the `scene` column of the shapes dataset (`load_shapes`).")
    generator = torch.Generator().manual_seed(seed)
    device = next(image_encoder.parameters()).device
    image_processor = getattr(processor, "image_processor", processor)
    pixel_values = image_processor(images=list(dataset["image"]), return_tensors="pt")["pixel_values"]  # (N, 3, H, W)
    labels = scene_cell_labels(dataset["scene"])  # (N, 9, 3)
    with torch.random.fork_rng(devices=[]):  # the heads' initialisation leaves the global random stream alone
        torch.manual_seed(seed)
        heads = nn.ModuleList(
            nn.Linear(image_encoder.grid_feature_size, 1 + len(values)) for _, values in _ATTRIBUTES
        ).to(device)
    optimizer = torch.optim.Adam([*image_encoder.parameters(), *heads.parameters()], lr=learning_rate)
    was_training = image_encoder.training
    image_encoder.train()
    loss = torch.tensor(float("nan"))  # no step taken yet
    for _ in range(num_steps):
        rows = torch.randint(0, len(pixel_values), (batch_size,), generator=generator)
        _, grid = image_encoder.forward_with_grid(pixel_values[rows].to(device))  # (B, 9, C)
        targets = labels[rows].to(device)  # (B, 9, 3)
        loss = sum(
            F.cross_entropy(head(grid).flatten(0, 1), targets[..., position].flatten())
            for position, head in enumerate(heads)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    image_encoder.train(was_training)

    # accuracy on the training images, over the cells that hold an object
    with torch.no_grad():
        grids = torch.cat([image_encoder.forward_with_grid(chunk.to(device))[1] for chunk in pixel_values.split(256)])
        occupied = labels[..., 0] > 0
        results = {"loss": float(loss)}
        for position, (name, _) in enumerate(_ATTRIBUTES):
            predictions = heads[position](grids).argmax(-1).cpu()
            results[f"{name}_accuracy"] = float((predictions == labels[..., position])[occupied].float().mean())
    return results
