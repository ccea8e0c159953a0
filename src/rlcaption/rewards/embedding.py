"""
The visual-semantic embedding reward of Ren et al. (CVPR 2017), as Shi et al. (2018) describe it, and its training.

A [`VisualSemanticEmbedding`] embeds a caption `S` by the last state `h_T(S)` of a GRU (linearly mapped) and an image
by a linear map `l_e(f_I)` of its features, into one space; the reward of a caption for its image is their cosine
(Shi et al. 2018, eq. 6):

    R(S, I) = cos(h_T(S), l_e(f_I)) ∈ [−1, 1].

The embedding is trained on the ground-truth pairs of the training split by [`train_embedding_model`] with the
bidirectional hinge ranking loss of margin γ ([`bidirectional_hinge_losses`]), then saved as its own checkpoint
(config, safetensors and its `CaptionProcessor`; `examples/train_embedding.py` does all of it) and loaded by folder or
Hub id: `get_reward("embedding", model="checkpoints/visual-semantic-embedding-shapes")`, the shipped one. It mixes
with metric rewards through `RewardMix`, e.g. `RewardMix(["cider", embedding], weights=[1.0, 0.5])`.

The model has the interface of a CLIP (`get_text_features`, `get_image_features`), so captions and images are embedded
by the same functions as for the CLIP metrics and rewards (`rlcaption.metrics.clip`), and the `pixel_values` the
trainer passes are turned back into images for the embedding's own processor, as the `clip_score` reward does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..data.collator import pad_regions
from ..data.images import decode_image
from ..metrics.clip import embed_images, embed_texts, load_clip
from .base import completion_texts, group_sizes
from .clip_rewards import pixel_values_to_images
from .registry import register_reward

__all__ = ["EmbeddingReward", "bidirectional_hinge_losses", "train_embedding_model"]


def bidirectional_hinge_losses(similarities: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    """
    The bidirectional hinge ranking loss of Ren et al.'s embedding (Shi et al. 2018, eq. 5, read as Ren et
    al. 2017's), for every ground-truth pair `(S_i, I_i)` of a batch, summed over all its negatives:

        Σ_{j≠i} max(0, γ − cos(S_i, I_i) + cos(S_j, I_i)) + Σ_{j≠i} max(0, γ − cos(S_i, I_i) + cos(S_i, I_j))

    the other captions of the batch as negatives for image `I_i`, and the other images as negatives for caption `S_i`.
    (The `psst` objective's mean-violation loss is this sum divided by `batch_size − 1`.)

    Args:
        similarities (`torch.FloatTensor` of shape `(batch_size, batch_size)`):
            `cos(S_i, I_j)`, caption `i` against image `j`; caption `i` describes image `i`.
        margin (`float`, *optional*, defaults to 0.2): γ.

    Returns:
        `torch.FloatTensor` of shape `(batch_size,)`; 0 for a batch of one (it has no negative).
    """
    if similarities.dim() != 2 or similarities.shape[0] != similarities.shape[1]:
        raise ValueError(f"Expected a square caption-by-image similarity matrix, got {tuple(similarities.shape)}.")
    positives = similarities.diagonal()  # (B,)
    is_negative = ~torch.eye(similarities.shape[0], dtype=torch.bool, device=similarities.device)
    # row i: caption i against the other images; column j: image j against the other captions
    negative_images = F.relu(margin - positives[:, None] + similarities) * is_negative
    negative_captions = F.relu(margin - positives[None, :] + similarities) * is_negative
    return negative_images.sum(dim=1) + negative_captions.sum(dim=0)


def _training_images(model: Any, processor: Any, dataset: Any) -> Callable[[list[int]], dict[str, torch.Tensor]]:
    """The images of rows of `dataset` as the embedding reads them: `{"pixel_values": (B, 3, H, W)}`,
    `{"image_features": (B, F)}`, or grids and regions `{"image_features": (B, N, F), "image_feature_mask": (B, N)}`
    padded to the batch's largest count. Pixels and pooled features are prepared once; grids and regions are read
    from the dataset a batch at a time, since all of them at once may not fit in memory (bottom-up features of
    COCO)."""
    if model.config.encoder_type == "features":
        if "image_features" not in dataset.column_names:
            raise ValueError("This embedding reads precomputed features: the dataset needs `image_features`.")
        features = dataset.select_columns(["image_features"])
        if model.config.image_feature_layout == "grid":

            def padded_regions(rows: list[int]) -> dict[str, torch.Tensor]:
                regions, mask = pad_regions(features.select(rows), "image_features")
                return {"image_features": regions, "image_feature_mask": mask}

            return padded_regions
        pooled = torch.as_tensor(np.asarray(features["image_features"]), dtype=torch.float32)
        return lambda rows: {"image_features": pooled[rows]}
    if "pixel_values" in dataset.column_names:
        pixel_values = torch.as_tensor(np.asarray(dataset["pixel_values"]), dtype=torch.float32)
    elif "image" in dataset.column_names:
        pixel_values = processor(images=dataset["image"], return_tensors="pt")["pixel_values"]
    else:
        raise ValueError(
            f"Training the embedding needs an `image` or `pixel_values` column; got {dataset.column_names}."
        )
    return lambda rows: {"pixel_values": pixel_values[rows]}


def train_embedding_model(
    model: Any,
    processor: Any,
    train_dataset: Any,
    num_steps: int = 1000,
    batch_size: int = 64,
    learning_rate: float = 2e-4,
    margin: float = 0.2,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """
    Trains a [`VisualSemanticEmbedding`] in place on the ground-truth pairs of `train_dataset` with the bidirectional
    hinge ranking loss ([`bidirectional_hinge_losses`], the mean over the batch's pairs), by Adam.

    Every step takes `batch_size` distinct images and one of each image's references, drawn at random, so that a
    caption's negatives are the references of other images.

    Args:
        model ([`VisualSemanticEmbedding`]): the embedding, trained in place (a fixed image encoder stays fixed).
        processor ([`CaptionProcessor`]): the embedding's processor (its vocabulary and image size).
        train_dataset (`datasets.Dataset`): a `captions` column (the references of each image) and the images
            (`image`, or `pixel_values` prepared by the processor, or `image_features` for a `"features"` embedding:
            one vector per image, or a grid or regions `(num_regions, F)` per image for `image_feature_layout="grid"`).
        num_steps (`int`, *optional*, defaults to 1000): optimizer steps.
        batch_size (`int`, *optional*, defaults to 64): images (and captions) per step, at most the number of images.
        learning_rate (`float`, *optional*, defaults to 2e-4): Adam's learning rate.
        margin (`float`, *optional*, defaults to 0.2): γ of the hinge.
        seed (`int`, *optional*, defaults to 0): seeds the batches and the choice of references.
        on_step (`Callable[[int, float], None]`, *optional*): called after every step with its number (from 1) and
            its loss, e.g. to print the loss now and then during a long run.

    Returns:
        `list[float]`: the loss of every step.
    """
    if num_steps < 1 or batch_size < 2 or margin <= 0 or learning_rate <= 0:
        raise ValueError(
            f"train_embedding_model needs num_steps >= 1, batch_size >= 2 (a caption needs negatives), margin > 0 and "
            f"learning_rate > 0; got {num_steps}, {batch_size}, {margin}, {learning_rate}."
        )
    if "captions" not in train_dataset.column_names:
        raise ValueError("Training the embedding needs the `captions` column (the references of each image).")
    references = train_dataset["captions"]
    if batch_size > len(references):
        raise ValueError(f"batch_size={batch_size} is larger than the {len(references)} training images.")
    device = model.device
    images_of = _training_images(model, processor, train_dataset)
    generator = torch.Generator().manual_seed(seed)
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=learning_rate)
    was_training = model.training
    model.train()
    losses = []
    for step in range(1, num_steps + 1):
        rows = torch.randperm(len(references), generator=generator)[:batch_size]  # distinct images
        counts = torch.tensor([len(references[row]) for row in rows.tolist()])
        choices = (torch.rand(batch_size, generator=generator) * counts).long().tolist()  # one reference per image
        captions = [references[row][choice] for row, choice in zip(rows.tolist(), choices, strict=True)]
        text = processor(text=captions, return_tensors="pt")
        similarities = model(
            input_ids=text["input_ids"].to(device),
            attention_mask=text["attention_mask"].to(device),
            **{name: tensor.to(device) for name, tensor in images_of(rows.tolist()).items()},
        )  # (B, B)
        loss = bidirectional_hinge_losses(similarities, margin).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    model.train(was_training)
    return losses


@register_reward("embedding")
class EmbeddingReward:
    """
    Ren et al.'s reward: the cosine of each completion's embedding and its image's, `cos(h_T(S), l_e(f_I))` (Shi et al.
    2018, eq. 6), from a [`VisualSemanticEmbedding`] trained by [`train_embedding_model`].

    Args:
        model (`str`, `os.PathLike` or `(model, processor)`): the embedding's folder or Hub id (model and its
            `CaptionProcessor` saved together), or a loaded pair.
        pixel_mean, pixel_std (`Sequence[float]`, *optional*, default to 0.5 per channel): how the `pixel_values` the
            trainer passes were normalised (the captioner's processor's `image_mean` and `image_std`); they are
            turned back into images for the embedding's processor.
        batch_size (`int`, *optional*, defaults to 64): images per forward pass (4x as many captions).
        local_files_only (`bool`, *optional*, defaults to `False`): never contact the Hub when loading `model`.

    The images come from the columns the trainer passes: `pixel_values` (or a dataset's `image` column, as TRL passes
    it), or `image_features` (with `image_feature_mask` for padded grids and regions) for an embedding over
    precomputed features. Each image is embedded once per call.

    Example:
        ```python
        >>> reward = get_reward("embedding", model="checkpoints/visual-semantic-embedding-shapes")
        >>> reward(completions=["a red circle"], references=[[...]], pixel_values=pixel_values)
        ```
    """

    def __init__(
        self,
        model: Any = None,
        pixel_mean: Sequence[float] = (0.5, 0.5, 0.5),
        pixel_std: Sequence[float] = (0.5, 0.5, 0.5),
        batch_size: int = 64,
        local_files_only: bool = False,
    ):
        if model is None:
            raise ValueError(
                "The embedding reward needs a trained VisualSemanticEmbedding: get_reward('embedding', model=...) "
                "with its folder or Hub id (trained by rlcaption.rewards.embedding.train_embedding_model and saved "
                "with its processor), or a (model, processor) pair."
            )
        self.__name__ = "embedding"
        self.model, self.processor = load_clip(model, local_files_only=local_files_only)
        self.model.requires_grad_(False)
        self.model_name = os.fspath(model) if isinstance(model, str | os.PathLike) else type(self.model).__name__
        self.pixel_mean = tuple(pixel_mean)
        self.pixel_std = tuple(pixel_std)
        self.batch_size = batch_size

    def __call__(self, *, completions: list[Any], references: list[list[str]] | None = None, **columns) -> list[float]:
        texts = completion_texts(completions)
        return self._cosines(texts, list(range(len(texts))), len(texts), columns, unit="completion").tolist()

    def score_groups(
        self, *, completions: list[list[Any]], references: list[list[str]] | None = None, **image_columns
    ) -> list[list[float]]:
        """
        The reward of every completion for its group's image, each image embedded once.

        Args:
            completions (`list[list[str]]` of length `num_images`): group `i` holds image `i`'s completions.
            references: unused (the embedding needs no references).
            **image_columns: one row per image: `pixel_values` (`torch.FloatTensor` of shape `(num_images, 3, H,
                W)`), `image` (a list of images) or `image_features` (`(num_images, F)`, or `(num_images, N, F)`
                with `image_feature_mask` `(num_images, N)` for grids and regions).

        Returns:
            `list[list[float]]`: one list per group, as long as the group.
        """
        sizes = group_sizes(completions)
        texts = [text for group in completions for text in completion_texts(group)]
        image_rows = [image for image, size in enumerate(sizes) for _ in range(size)]
        values = self._cosines(texts, image_rows, len(sizes), image_columns, unit="image")
        ends = np.cumsum(sizes)
        return [values[end - size : end].tolist() for end, size in zip(ends, sizes, strict=True)]

    def _cosines(
        self, texts: list[str], image_rows: list[int], num_images: int, columns: dict[str, Any], unit: str
    ) -> np.ndarray:
        """`cos(text_i, image of row image_rows[i])`, the image columns holding `num_images` rows, one per `unit`:
        `(len(texts),)`."""
        if not texts:
            return np.zeros(0)
        image_embeddings = self._image_embeddings(columns, unit)  # (I, J)
        if image_embeddings.shape[0] != num_images:
            raise ValueError(
                f"Got {image_embeddings.shape[0]} images for {num_images} {unit}s; pass one image per {unit}."
            )
        text_embeddings = embed_texts(self.model, self.processor, texts, batch_size=4 * self.batch_size)  # (N, J)
        cosines = (text_embeddings * image_embeddings[image_rows]).sum(dim=-1)
        return cosines.double().numpy()

    def _image_embeddings(self, columns: dict[str, Any], unit: str) -> torch.Tensor:
        """The unit-norm embedding of every image row of the columns, on the CPU."""
        if self.model.config.encoder_type == "features":
            features = columns.get("image_features")
            if features is None:
                raise ValueError(
                    f"This embedding reads precomputed features: pass `image_features`, got columns {sorted(columns)}."
                )
            mask = columns.get("image_feature_mask")
            with torch.no_grad():
                output = self.model.get_image_features(
                    image_features=torch.as_tensor(features).to(self.model.device),
                    image_feature_mask=None if mask is None else torch.as_tensor(mask).to(self.model.device),
                )
            return output.pooler_output.float().cpu()
        if columns.get("pixel_values") is not None:
            images = pixel_values_to_images(columns["pixel_values"], self.pixel_mean, self.pixel_std)
        elif columns.get("image") is not None:
            images = [decode_image(image) for image in columns["image"]]
        else:
            raise ValueError(
                "The embedding reward needs each completion's image: a `pixel_values` tensor (N, 3, H, W), as "
                f"RLCaptionTrainer passes it, or an `image` column, one per {unit}; got columns {sorted(columns)}."
            )
        return embed_images(self.model, self.processor, images, batch_size=self.batch_size)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model_name!r})"
