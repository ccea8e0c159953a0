"""
The decoupled bidirectional contrastive reward of WTF-RL (Chaffin et al. 2024, eq. 2; Chaffin et al., "Distinctive
Image Captioning: Leveraging Ground Truth Captions in CLIP Guided Reinforcement Learning").

For a caption `x_c` of image `i_c`, a set of texts `T`, a set of images `I`, the cosine similarity
`s(x, i) = f^T(x) · f^I(i)` of a fixed CLIP and a temperature τ:

    r_i2t(x_c) = τ (s(x_c, i_c)/τ − log Σ_{x ∈ T \\ x_c} exp(s(x, i_c)/τ))
    r_t2i(x_c) = τ (s(x_c, i_c)/τ − log Σ_{i ∈ I \\ i_c} exp(s(x_c, i)/τ))
    r_bicont(x_c) = r_i2t(x_c) + r_t2i(x_c)

The positive pair is excluded from the denominators (the decoupled contrastive loss): for a small τ each part is the
similarity minus that of the hardest negative, so it is positive exactly when `x_c` beats every other text of `T` for
its image (`r_i2t`, a self-critical reward whose baseline is the batch's strongest caption) or fits its image better
than every other image of `I` (`r_t2i`). Keeping the positive in the sums would make both parts negative always.

[`decoupled_contrastive_rewards`] computes both parts from embedding matrices. [`ContrastiveReward`] (registered as
`clip_contrastive`) applies them to a batch: `T` is every completion of the call (the `wtf` objective passes the
beam-search, greedy and ground-truth caption of every image), `I` the batch's images plus each one's nearest
neighbours in the CLIP's image space, mined once before training by [`ContrastiveReward.prepare`] (and written to a
file that later runs, a resumed one included, read instead of mining again).
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..data.images import decode_image
from ..metrics.clip import embed_images, embed_texts, load_clip
from .base import completion_texts, group_sizes, row_keys
from .clip_rewards import pixel_values_to_images
from .registry import register_reward

__all__ = [
    "CONTRASTIVE_DIRECTIONS",
    "ContrastiveReward",
    "ContrastiveRewards",
    "MinedNeighbours",
    "decoupled_contrastive_rewards",
    "mine_neighbours",
]

# `both` is r_bicont of eq. 2; `i2t` alone is the "RL - Unidirectional" reward of the paper's Table 1.
CONTRASTIVE_DIRECTIONS = ("both", "i2t", "t2i")
# Images embedded per chunk of the training set while mining: bounds the decoded images held at once.
_MINING_CHUNK = 512


@dataclass
class ContrastiveRewards:
    """
    The parts of eq. 2 for every text of a set.

    Args:
        similarity (`torch.DoubleTensor` of shape `(num_texts,)`): `s(x_c, i_c)`, each text with its own image.
        i2t (`torch.DoubleTensor` of shape `(num_texts,)`): `r_i2t(x_c)`, normalised over the other texts.
        t2i (`torch.DoubleTensor` of shape `(num_texts,)`): `r_t2i(x_c)`, normalised over the other images.
    """

    similarity: torch.Tensor
    i2t: torch.Tensor
    t2i: torch.Tensor

    def select(self, rows: slice | torch.Tensor) -> ContrastiveRewards:
        """The parts of the texts at `rows` only."""
        return ContrastiveRewards(similarity=self.similarity[rows], i2t=self.i2t[rows], t2i=self.t2i[rows])

    def combined(self, direction: str = "both") -> torch.Tensor:
        """`r_i2t + r_t2i` (`both`, r_bicont), `r_i2t` or `r_t2i`: `(num_texts,)`."""
        if direction == "both":
            return self.i2t + self.t2i
        if direction == "i2t":
            return self.i2t
        if direction == "t2i":
            return self.t2i
        raise ValueError(f"direction={direction!r} is not one of {CONTRASTIVE_DIRECTIONS}.")


def decoupled_contrastive_rewards(
    text_embeddings: torch.Tensor,
    image_embeddings: torch.Tensor,
    text_image_index: torch.Tensor | Sequence[int],
    temperature: float,
) -> ContrastiveRewards:
    """
    Chaffin et al.'s eq. 2 for every text of `T`: `r_i2t` over the other texts of `T`, `r_t2i` over the other images of
    `I`, both with the positive excluded from the log-sum-exp, computed in float64.

    Args:
        text_embeddings (`torch.Tensor` of shape `(num_texts, dim)`): `f^T(x)` of every text of `T` (L2-normalised
            for cosine similarities, as CLIP compares them).
        image_embeddings (`torch.Tensor` of shape `(num_images, dim)`): `f^I(i)` of every image of `I`, each image
            once.
        text_image_index (`torch.LongTensor` or `Sequence[int]` of length `num_texts`): the row of each text's own
            image `i_c` in `image_embeddings`.
        temperature (`float`): τ > 0.

    Returns:
        [`ContrastiveRewards`] with tensors of shape `(num_texts,)`.
    """
    if temperature <= 0:
        raise ValueError(f"The contrastive temperature must be > 0, got {temperature}.")
    texts = torch.as_tensor(text_embeddings).double()
    images = torch.as_tensor(image_embeddings).double().to(texts.device)
    if texts.dim() != 2 or images.dim() != 2 or texts.size(1) != images.size(1):
        raise ValueError(
            f"Expected text and image embeddings of shapes (num_texts, dim) and (num_images, dim), got "
            f"{tuple(texts.shape)} and {tuple(images.shape)}."
        )
    num_texts, num_images = texts.size(0), images.size(0)
    if num_texts < 2 or num_images < 2:
        raise ValueError(
            f"The decoupled contrastive reward needs a negative in each direction: at least 2 texts and 2 images, "
            f"got {num_texts} and {num_images} (add captions, images, or mined neighbours)."
        )
    own_image = torch.as_tensor(text_image_index, dtype=torch.long, device=texts.device)
    # one read of the device for both bounds
    if own_image.shape != (num_texts,) or bool(((own_image < 0) | (own_image >= num_images)).any()):
        raise ValueError(
            f"text_image_index must give one image row in [0, {num_images}) per text ({num_texts}), got "
            f"{own_image.tolist()}."
        )
    similarities = texts @ images.T  # (num_texts, num_images): s(x, i)
    rows = torch.arange(num_texts, device=texts.device)
    similarity = similarities[rows, own_image]  # (num_texts,): s(x_c, i_c)
    # image-to-text: column i_c of every text x, the text x_c itself left out: (num_texts x, num_texts c)
    at_own_image = similarities[:, own_image].masked_fill(
        torch.eye(num_texts, dtype=torch.bool, device=texts.device), float("-inf")
    )
    i2t = similarity - temperature * torch.logsumexp(at_own_image / temperature, dim=0)
    # text-to-image: row x_c over every image, its own image left out: (num_texts, num_images)
    is_own = torch.zeros_like(similarities, dtype=torch.bool)
    is_own[rows, own_image] = True
    t2i = similarity - temperature * torch.logsumexp(similarities.masked_fill(is_own, float("-inf")) / temperature, 1)
    return ContrastiveRewards(similarity=similarity, i2t=i2t, t2i=t2i)


def mine_neighbours(image_embeddings: torch.Tensor, num_neighbours: int, chunk_size: int = 1024) -> torch.LongTensor:
    """
    The `num_neighbours` most similar other images of every image (cosine similarity, the image itself excluded),
    most similar first; the similarity matrix is built `chunk_size` rows at a time.

    Args:
        image_embeddings (`torch.Tensor` of shape `(num_images, dim)`): one embedding per image.
        num_neighbours (`int`): k, at most `num_images - 1`.

    Returns:
        `torch.LongTensor` of shape `(num_images, num_neighbours)`: row indices into `image_embeddings`.
    """
    num_images = image_embeddings.size(0)
    if not 0 <= num_neighbours < num_images:
        raise ValueError(
            f"Cannot mine {num_neighbours} neighbours per image among {num_images} images: choose 0 to "
            f"{num_images - 1}."
        )
    embeddings = torch.nn.functional.normalize(image_embeddings.float(), dim=-1)
    chunks = []
    for start in range(0, num_images, chunk_size):
        similarities = embeddings[start : start + chunk_size] @ embeddings.T  # (chunk, num_images)
        own = torch.arange(start, start + similarities.size(0))
        similarities[torch.arange(similarities.size(0)), own] = float("-inf")
        chunks.append(similarities.topk(num_neighbours, dim=1).indices)
    return torch.cat(chunks)


@dataclass
class MinedNeighbours:
    """
    The training images' CLIP embeddings and nearest neighbours, as [`ContrastiveReward.prepare`] mines them.

    Args:
        image_ids (`list`): the `image_id` of every training image, in dataset order.
        image_embeddings (`torch.FloatTensor` of shape `(num_images, dim)`): their L2-normalised embeddings.
        neighbours (`torch.LongTensor` of shape `(num_images, k)`): rows of each image's k most similar other
            images, most similar first.
        clip (`str`): the CLIP that embedded them (folder, Hub id, or class name of a given model).
    """

    image_ids: list[Hashable]
    image_embeddings: torch.Tensor
    neighbours: torch.Tensor
    clip: str

    def __post_init__(self):
        self.row_of = {image_id: row for row, image_id in enumerate(self.image_ids)}

    def save(self, path: str | os.PathLike) -> None:
        """Writes a safetensors file (through a temporary name, so an interrupted write never leaves a file under
        `path` that a later run would trust)."""
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tensors = {"image_embeddings": self.image_embeddings.contiguous(), "neighbours": self.neighbours.contiguous()}
        metadata = {"image_ids": json.dumps(self.image_ids), "clip": self.clip}
        save_file(tensors, path + ".tmp", metadata=metadata)
        os.replace(path + ".tmp", path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> MinedNeighbours:
        with safe_open(os.fspath(path), framework="pt") as file:
            metadata = file.metadata()
            return cls(
                image_ids=json.loads(metadata["image_ids"]),
                image_embeddings=file.get_tensor("image_embeddings"),
                neighbours=file.get_tensor("neighbours"),
                clip=metadata["clip"],
            )


@register_reward("clip_contrastive")
class ContrastiveReward:
    """
    Chaffin et al.'s decoupled bidirectional contrastive reward (eq. 2) of every completion, over the set of all
    completions of the call and the set of the batch's images plus their mined neighbours.

    Args:
        model (`str`, `os.PathLike` or `(model, processor)`): the fixed CLIP, as for [`ClipScoreReward`].
        temperature (`float`, *optional*): τ; by default the CLIP's own, `1 / exp(logit_scale)` (0.01 for OpenAI
            CLIP), which makes eq. 2 the CLIP's training objective, decoupled.
        direction (`str`, *optional*, defaults to `"both"`): `both` (r_bicont), `i2t` or `t2i`.
        num_neighbours (`int`, *optional*, defaults to 5): k, similar training images added to `I` for each image of
            the batch (0: the batch's images only).
        cache_path (`str` or `os.PathLike`, *optional*): file for the mined neighbours; `prepare` reads it when it
            exists instead of mining, and writes it after mining otherwise.
        prompt (`str`, *optional*, defaults to `""`): text put before every caption.
        pixel_mean, pixel_std (`Sequence[float]`, *optional*, default to 0.5 per channel): how `pixel_values` were
            normalised (the captioner's processor's `image_mean` and `image_std`).
        batch_size (`int`, *optional*, defaults to 64): images per CLIP forward pass (4x as many captions).
        local_files_only (`bool`, *optional*, defaults to `False`): never contact the Hub when loading `model`.

    A batch image whose `image_id` was mined takes its embedding from the mined set, so that all images of `I` are
    embedded alike (from the dataset's images, not the captioner's resized inputs); other images (no `image_id`, not
    in the training set, or no `prepare`) are embedded from the `pixel_values` or `image` column and get no
    neighbours.

    Example:
        ```python
        >>> reward = get_reward(
        ...     "clip_contrastive", model="checkpoints/shapes-clip-reward", cache_path="out/mined.safetensors"
        ... )
        >>> reward.prepare(train_dataset)  # embeds the training images and mines their neighbours, once
        >>> reward.score_groups(completions=[[beam, greedy, reference], ...], references=None, image_id=[...],
        ...                     pixel_values=pixel_values)
        ```
    """

    reads_images = True  # the CLIP reads each caption's image (see `reward_reads_images`)

    def __init__(
        self,
        model: Any = None,
        temperature: float | None = None,
        direction: str = "both",
        num_neighbours: int = 5,
        cache_path: str | os.PathLike | None = None,
        prompt: str = "",
        pixel_mean: Sequence[float] = (0.5, 0.5, 0.5),
        pixel_std: Sequence[float] = (0.5, 0.5, 0.5),
        batch_size: int = 64,
        local_files_only: bool = False,
    ):
        if model is None:
            raise ValueError(
                "The clip_contrastive reward needs a CLIP: get_reward('clip_contrastive', model=...) with a hub id, a "
                "local folder (e.g. 'checkpoints/shapes-clip-reward') or a (model, processor) pair."
            )
        if direction not in CONTRASTIVE_DIRECTIONS:
            raise ValueError(f"direction={direction!r} is not one of {CONTRASTIVE_DIRECTIONS}.")
        if num_neighbours < 0:
            raise ValueError(f"num_neighbours must be >= 0, got {num_neighbours}.")
        self.__name__ = "clip_contrastive"
        self.model, self.processor = load_clip(model, local_files_only=local_files_only)
        self.model_name = os.fspath(model) if isinstance(model, str | os.PathLike) else type(self.model).__name__
        self.temperature = self._clip_temperature() if temperature is None else float(temperature)
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}.")
        self.direction = direction
        self.num_neighbours = num_neighbours
        self.cache_path = None if cache_path is None else os.fspath(cache_path)
        self.prompt = prompt
        self.pixel_mean = tuple(pixel_mean)
        self.pixel_std = tuple(pixel_std)
        self.batch_size = batch_size
        self.mined: MinedNeighbours | None = None

    def _clip_temperature(self) -> float:
        logit_scale = getattr(self.model, "logit_scale", None)
        if logit_scale is None:
            raise ValueError(
                f"{type(self.model).__name__} has no `logit_scale` to take the contrastive temperature from; pass "
                "`temperature=` (e.g. 0.01, OpenAI CLIP's)."
            )
        return float(1.0 / torch.as_tensor(logit_scale).detach().float().exp())

    # ---------------------------------------------------------------- mining, once before training
    def prepare(self, train_dataset: Any, processor: Any = None) -> None:
        """
        Embeds every training image with the CLIP and keeps each one's `num_neighbours` nearest other images, or
        reads them from `cache_path` when that file exists (then no image is embedded).

        Args:
            train_dataset (`datasets.Dataset`): with an `image_id` column and an `image` (PIL images) or
                `pixel_values` column.
            processor: unused (the CLIP's own processor prepares images); part of the reward protocol.

        Raises:
            `ValueError`: when the dataset has no `image_id` or image column, or the cached file was mined for other
                images, another k or another CLIP.
        """
        if "image_id" not in train_dataset.column_names:
            raise ValueError(
                f"The clip_contrastive reward finds each image's mined neighbours by its `image_id`; the training set "
                f"has only the columns {train_dataset.column_names}."
            )
        image_ids = list(train_dataset["image_id"])
        if self.cache_path is not None and os.path.isfile(self.cache_path):
            self.mined = self._checked_cache(MinedNeighbours.load(self.cache_path), image_ids)
            return
        embeddings = self._embed_dataset_images(train_dataset)
        neighbours = mine_neighbours(embeddings, min(self.num_neighbours, len(image_ids) - 1))
        self.mined = MinedNeighbours(image_ids, embeddings, neighbours, self.model_name)
        if self.cache_path is not None:
            self.mined.save(self.cache_path)

    def _checked_cache(self, mined: MinedNeighbours, image_ids: list[Hashable]) -> MinedNeighbours:
        expected = min(self.num_neighbours, len(image_ids) - 1)
        problems = []
        if mined.image_ids != image_ids:
            problems.append(f"its {len(mined.image_ids)} image ids are not the {len(image_ids)} of the training set")
        if mined.neighbours.size(1) != expected:
            problems.append(f"it holds {mined.neighbours.size(1)} neighbours per image, not {expected}")
        if mined.clip != self.model_name:
            problems.append(f"it was mined with the CLIP {mined.clip!r}, not {self.model_name!r}")
        if problems:
            raise ValueError(
                f"The mined neighbours in {self.cache_path} do not belong to this run: {'; '.join(problems)}. Delete "
                "the file to mine again, or train in another output directory."
            )
        return mined

    def _embed_dataset_images(self, dataset: Any) -> torch.Tensor:
        if "image" in dataset.column_names:
            column = "image"
        elif "pixel_values" in dataset.column_names:
            column = "pixel_values"
        else:
            raise ValueError(
                f"The clip_contrastive reward embeds the training images from an `image` or `pixel_values` column; "
                f"the training set has {dataset.column_names} (a CLIP cannot read precomputed `image_features`)."
            )
        images = dataset.select_columns([column])
        chunks = []
        for start in range(0, len(images), _MINING_CHUNK):
            rows = images[start : start + _MINING_CHUNK][column]
            if column == "pixel_values":
                rows = pixel_values_to_images(torch.as_tensor(rows), self.pixel_mean, self.pixel_std)
            else:
                rows = [decode_image(image) for image in rows]
            chunks.append(embed_images(self.model, self.processor, rows, batch_size=self.batch_size))
        return torch.cat(chunks)

    # ---------------------------------------------------------------- the sets T and I
    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """L2-normalised CLIP embeddings of `texts`, each distinct text embedded once: `(len(texts), dim)`, CPU."""
        unique = list(dict.fromkeys(texts))
        embeddings = embed_texts(self.model, self.processor, unique, 4 * self.batch_size, prompt=self.prompt)
        row = {text: index for index, text in enumerate(unique)}
        return embeddings[[row[text] for text in texts]]

    def image_set(self, image_columns: dict[str, Any], num_images: int) -> torch.Tensor:
        """
        The embeddings of `I`: the batch's images in their order, then the mined neighbours of those images that are
        not batch images themselves, each image once (a neighbour shared by two batch images is one negative).

        Args:
            image_columns: one row per image: `image_id` and `pixel_values` (`(num_images, 3, H, W)`) or `image`.
            num_images (`int`): the batch's images.

        Returns:
            `torch.FloatTensor` of shape `(num_images + num_mined, dim)` on the CPU.
        """
        image_ids = row_keys(image_columns.get("image_id"), num_images)
        mined_rows = [None] * num_images
        if self.mined is not None and image_ids is not None:
            mined_rows = [self.mined.row_of.get(image_id) for image_id in image_ids]
        unknown = [image for image, row in enumerate(mined_rows) if row is None]
        embeddings: list[torch.Tensor | None] = [None] * num_images
        if unknown:
            fresh = embed_images(
                self.model, self.processor, self._images(image_columns, unknown, num_images), self.batch_size
            )
            for image, embedding in zip(unknown, fresh, strict=True):
                embeddings[image] = embedding
        for image, row in enumerate(mined_rows):
            if row is not None:
                embeddings[image] = self.mined.image_embeddings[row]
        batch_rows = {row for row in mined_rows if row is not None}
        neighbour_rows = []
        for row in mined_rows:
            if row is None:
                continue
            for neighbour in self.mined.neighbours[row].tolist():
                if neighbour not in batch_rows:
                    batch_rows.add(neighbour)
                    neighbour_rows.append(neighbour)
        batch = torch.stack(embeddings)  # (num_images, dim)
        if not neighbour_rows:
            return batch
        return torch.cat([batch, self.mined.image_embeddings[neighbour_rows].to(batch.dtype)])

    def _images(self, columns: dict[str, Any], rows: list[int], num_images: int) -> list[Any]:
        """The images of `rows`, from the `pixel_values` or `image` column (one row per image)."""
        if columns.get("pixel_values") is not None:
            pixel_values = columns["pixel_values"]
            if len(pixel_values) != num_images:
                raise ValueError(f"pixel_values holds {len(pixel_values)} images for {num_images} groups.")
            return pixel_values_to_images(pixel_values[rows], self.pixel_mean, self.pixel_std)
        if columns.get("image") is not None:
            images = list(columns["image"])
            if len(images) != num_images:
                raise ValueError(f"image holds {len(images)} images for {num_images} groups.")
            return [decode_image(images[row]) for row in rows]
        raise ValueError(
            "The clip_contrastive reward needs the images it has not mined: a `pixel_values` tensor (N, 3, H, W) or "
            f"an `image` column, one row per image; got columns {sorted(columns)}."
        )

    def rewards(
        self,
        text_embeddings: torch.Tensor,
        text_image_index: Sequence[int],
        image_columns: dict[str, Any],
        num_images: int,
    ) -> ContrastiveRewards:
        """
        Eq. 2 for texts already embedded ([`embed_texts`]): `T` is all of them, `I` the [`image_set`] of the batch.

        Args:
            text_embeddings (`torch.Tensor` of shape `(num_texts, dim)`): the texts of `T`.
            text_image_index (`Sequence[int]` of length `num_texts`): the batch image of every text.
            image_columns: one row per batch image (see [`image_set`]).
            num_images (`int`): the batch's images.

        Returns:
            [`ContrastiveRewards`] of shape `(num_texts,)` each.
        """
        images = self.image_set(image_columns, num_images)
        return decoupled_contrastive_rewards(text_embeddings, images, text_image_index, self.temperature)

    def score_groups(
        self, *, completions: list[list[Any]], references: list[list[str]] | None = None, **image_columns
    ) -> list[list[float]]:
        """
        The reward of every completion, `T` being all the completions of the call and `I` the groups' images and
        their mined neighbours.

        Args:
            completions (`list[list[str]]` of length `num_images`): group `i` holds image `i`'s texts.
            references: unused (the CLIP scores the completions against the images).
            **image_columns: one row per image: `image_id`, and `pixel_values` (`(num_images, 3, H, W)`) or `image`
                for the images that were not mined.

        Returns:
            `list[list[float]]`: one list per group, as long as the group.
        """
        sizes = group_sizes(completions)
        texts = [text for group in completions for text in completion_texts(group)]
        image_index = [image for image, size in enumerate(sizes) for _ in range(size)]
        if not texts:
            return [[] for _ in sizes]
        rewards = self.rewards(self.embed_texts(texts), image_index, image_columns, len(sizes))
        values = rewards.combined(self.direction).tolist()
        groups, start = [], 0
        for size in sizes:
            groups.append(values[start : start + size])
            start += size
        return groups

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={self.model_name!r}, temperature={self.temperature:g}, "
            f"direction={self.direction!r}, num_neighbours={self.num_neighbours})"
        )
