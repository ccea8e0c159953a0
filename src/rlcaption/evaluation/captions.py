"""Captioning every image of a split: batches with their image ids, decoded by `generate`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn
from torch.utils.data import DataLoader
from transformers import GenerationConfig

from ..data.collator import CaptionCollator
from ..generation.decoding import generate_captions, image_inputs_of

__all__ = [
    "caption_batches",
    "caption_dataset",
    "check_image_ids",
    "with_image_ids",
]


def with_image_ids(dataset):
    """
    `dataset` with an `image_id` column to group captions and references by image: itself when it has one, else a
    copy whose `image_id` is the row index (`datasets.Dataset.add_column`; the images are not read). Other datasets
    are returned as they are; [`caption_batches`] refuses their rows if they carry no `image_id`.
    """
    column_names = getattr(dataset, "column_names", None)
    if column_names is None or "image_id" in column_names or not hasattr(dataset, "add_column"):
        return dataset
    return dataset.add_column("image_id", list(range(len(dataset))))


def check_image_ids(batch: Mapping[str, Any]) -> None:
    """Refuses a collated batch without `image_id`: captions of different batches could not be told apart."""
    if batch.get("image_id") is None:
        raise ValueError(
            "The batch has no `image_id`, so captions cannot be grouped with their references across batches; "
            "add an `image_id` column (a `datasets.Dataset` gets its row index through `with_image_ids`)."
        )


def caption_batches(
    model: nn.Module,
    processor: Any,
    batches: Iterable[Mapping[str, Any]],
    generation_config: GenerationConfig | None = None,
    **generation_kwargs: Any,
) -> list[tuple[Any, str, list[str]]]:
    """
    Captions collated batches (see [`CaptionCollator`]) with [`generate_captions`]: exactly `generation_config`, or
    `model.generate(**generation_kwargs)` on top of the model's own generation config.

    Returns:
        `(image_id, caption, references)` for every image, in order.

    Raises:
        `ValueError`: when a batch has no `image_id`: captions of different batches could not be told apart.
    """
    device = next(model.parameters()).device
    captioned = []
    for batch in batches:
        check_image_ids(batch)
        image_inputs = {name: tensor.to(device) for name, tensor in image_inputs_of(batch).items()}
        generated = generate_captions(model, processor, image_inputs, generation_config, **generation_kwargs)
        captioned.extend(zip(batch["image_id"], generated.texts, batch["references"], strict=True))
    return captioned


def caption_dataset(
    model: nn.Module,
    processor: Any,
    dataset,
    batch_size: int = 64,
    generation_config: GenerationConfig | None = None,
    **generation_kwargs: Any,
) -> tuple[dict[Any, str], dict[Any, list[str]]]:
    """
    Captions every image of `dataset` (columns `image`/`pixel_values`/`image_features`, `captions`, and `image_id`
    or, without it, the row index as the id); decoding as in [`caption_batches`].

    Returns:
        `(predictions, references)` keyed by `image_id`, ready for [`rlcaption.metrics.evaluate_captions`].
    """
    loader = DataLoader(
        with_image_ids(dataset),
        batch_size=batch_size,
        collate_fn=CaptionCollator(processor, tokenize_references=False),
        shuffle=False,
    )
    captioned = caption_batches(model, processor, loader, generation_config, **generation_kwargs)
    return {key: text for key, text, _ in captioned}, {key: refs for key, _, refs in captioned}
