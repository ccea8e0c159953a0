"""Batches dataset rows (image, references, id) into model inputs for every objective."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..generation.captioners import CaptionTokens
from ..generation.prompted_captioners import prompt_inputs

__all__ = ["CaptionCollator", "pad_regions"]

# Columns the collator turns into tensors or reads itself; any other column is passed through as a list.
_HANDLED_COLUMNS = ("image", "pixel_values", "image_features", "image_boxes", "captions", "image_id")


class CaptionCollator:
    """
    Collates rows of a captioning dataset (columns `image` or `pixel_values` or `image_features`, `captions`,
    `image_id`, and any others) into:

    - `pixel_values` (`torch.FloatTensor` of shape `(B, 3, H, W)`) or `image_features` (`(B, F)`);
    - for rows whose `image_features` are a grid or regions (`(N_i, F)` per row, `N_i` varying with the image, as
      `rlcaption.data.regions` gives them): `image_features` (`torch.FloatTensor` of shape `(B, N, F)`, `N` the
      largest `N_i`, zero-padded) and `image_feature_mask` (`torch.LongTensor` of shape `(B, N)`, 1 for a real
      region, 0 for padding), and `image_boxes` (`(B, N, 4)`, zero-padded) when the rows have them;
    - `references` (`list[list[str]]`): every reference of every image, as written;
    - `image_id` (`list`): the rows' ids (rewards cache reference statistics by them), when the rows have one;
    - `caption_input_ids`, `caption_attention_mask` (`(N, T)`) and `caption_image_index` (`(N,)`, the row of
      each caption's image): the tokenized references for teacher forcing, all of them or
      `captions_per_image` drawn at random per image, each `start w_1 ... w_n end` and right-padded;
    - every other column as a list under its own name (datasets columns reach reward functions this way), and
      `image` beside `image_features`: the images a CLIP reward reads;
    - with a `prompt` (models conditioned on one, see [`rlcaption.generation.prompted_captioners`]), the processor's
      outputs for each image with the prompt instead of `pixel_values` alone: the prompt's tokens, left-padded,
      renamed `prompt_input_ids`, `prompt_attention_mask` (`prompt_token_type_ids`, ...), and the image tensors the
      processor gives under their own names (`pixel_values`, `image_grid_thw`, `pixel_attention_mask`, ...).

    References are tokenized by the processor, stripped of the special tokens its tokenizer puts around them
    (`[CLS]`/`[SEP]`, `<bos>`/`<eos>`, ...), then framed by the model's start and end tokens: a GPT-2 tokenizer adds
    none, a BERT tokenizer adds `[CLS]`/`[SEP]` but BLIP starts captions with its own bos, so only the model knows
    which tokens teacher forcing must see (the ones its `generate()` starts with and stops at).

    Args:
        processor: the model's processor: a [`CaptionProcessor`] or any processor taking `images=` and `text=`
            (`TrOCRProcessor`, `BlipProcessor`, `GitProcessor`, ...).
        captions_per_image (`int`, *optional*): references tokenized per image; all when `None`.
        max_length (`int`, *optional*): truncation length of tokenized references, start and end tokens included
            (the end token is kept), as `generate`'s `max_length` counts the start token.
        caption_tokens ([`CaptionTokens`], *optional*): the model's start, end and pad tokens, e.g.
            `captioner_for(model).tokens` (what [`RLCaptionTrainer`] passes). When `None`, the tokenizer's bos and
            eos tokens, and a tokenizer without them is refused.
        tokenize_references (`bool`, *optional*, defaults to `True`): `False` to collate images and references as
            written only (evaluation needs no token ids).
        prompt (`str`, *optional*): the text the processor reads with every image, for a model conditioned on a
            prompt: `captioner_for(model).prompt_text(processor, prompt)` (what [`RLCaptionTrainer`] passes, the
            family's default prompt unless `RLCaptionConfig.prompt` is set). References are then tokenized by the
            processor's tokenizer alone, as the words that follow the prompt.
    """

    def __init__(
        self,
        processor: Any,
        captions_per_image: int | None = None,
        max_length: int | None = None,
        caption_tokens: CaptionTokens | None = None,
        tokenize_references: bool = True,
        prompt: str | None = None,
    ):
        if captions_per_image is not None and captions_per_image < 1:
            raise ValueError(f"captions_per_image must be >= 1 or None, got {captions_per_image}.")
        if max_length is not None and max_length < 2:
            raise ValueError(f"max_length must be >= 2 (the start and end tokens) or None, got {max_length}.")
        self.processor = processor
        self.captions_per_image = captions_per_image
        self.max_length = max_length
        self.tokenize_references = tokenize_references
        self.prompt = prompt
        # a prompted model's processor would frame a reference as a prompt (image tokens, task words): its tokenizer
        # tokenizes the words that follow the prompt
        self._reference_tokenizer = processor if prompt is None else getattr(processor, "tokenizer", processor)
        self.caption_tokens = None
        if tokenize_references:
            tokenizer = getattr(processor, "tokenizer", processor)
            if caption_tokens is None:
                caption_tokens = _tokenizer_caption_tokens(tokenizer)
            self.caption_tokens = caption_tokens
            # the tokens a tokenizer may put around a caption; an unknown word is a word of the caption
            self._boundary_token_ids = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if not rows:
            raise ValueError("Cannot collate an empty list of rows.")
        batch: dict[str, Any] = {}
        first = rows[0]
        # 1. image inputs, with the prompt's tokens for a model conditioned on a prompt
        if self.prompt is not None:
            batch.update(self._prompted_image_inputs(rows))
        elif "image_features" in first and first["image_features"] is not None:
            if np.ndim(first["image_features"]) == 2:
                batch["image_features"], batch["image_feature_mask"] = pad_regions(rows, "image_features")
                if first.get("image_boxes") is not None:
                    batch["image_boxes"], boxes_mask = pad_regions(rows, "image_boxes")
                    _check_boxes_match_regions(rows, boxes_mask, batch["image_feature_mask"])
            else:
                batch["image_features"] = _stack_rows(rows, "image_features")
        elif "pixel_values" in first and first["pixel_values"] is not None:
            batch["pixel_values"] = _stack_rows(rows, "pixel_values")
        elif "image" in first:
            batch["pixel_values"] = self._pixel_values(rows)
        else:
            raise ValueError(
                "Rows have no image column: expected `image`, `pixel_values` or `image_features`, got "
                f"{sorted(first)}."
            )

        # 2. references, as written, and ids; a position in the batch is not an id (rewards cache by image_id)
        references = None
        if "captions" in first:
            references = []
            for row in rows:
                captions = row["captions"]
                if (
                    not isinstance(captions, list | tuple)
                    or not captions
                    or not all(isinstance(caption, str) for caption in captions)
                ):
                    raise ValueError(
                        f"Image {row.get('image_id', '?')!r} has no usable references: `captions` must be a "
                        f"non-empty list of strings, got {captions!r}."
                    )
                references.append(list(captions))
            batch["references"] = references
        if "image_id" in first:
            batch["image_id"] = [row["image_id"] for row in rows]

        # 3. tokenized references for teacher forcing
        if references is not None and self.tokenize_references:
            texts, image_index = [], []
            for row_index, captions in enumerate(references):
                chosen = captions
                if self.captions_per_image is not None and len(captions) > self.captions_per_image:
                    chosen = random.sample(captions, self.captions_per_image)
                texts.extend(chosen)
                image_index.extend([row_index] * len(chosen))
            batch["caption_input_ids"], batch["caption_attention_mask"] = self._tokenize(texts)
            batch["caption_image_index"] = torch.tensor(image_index, dtype=torch.long)

        # 4. pass-through columns; the images of rows read through their features go to the rewards that read
        # pixels (a CLIP)
        for name in first:
            if name not in _HANDLED_COLUMNS or (name == "image" and "image_features" in batch):
                batch[name] = [row[name] for row in rows]
        return batch

    def _pixel_values(self, rows: Sequence[dict[str, Any]]) -> torch.FloatTensor:
        """The processor's `pixel_values` of the rows' images; an image it cannot use is named by its row."""
        try:
            return self.processor(images=[row["image"] for row in rows], return_tensors="pt")["pixel_values"]
        except (ValueError, OSError):
            # not every processor says which image of a batch failed: process the rows one by one to find it
            for position, row in enumerate(rows):
                try:
                    self.processor(images=[row["image"]], return_tensors="pt")
                except (ValueError, OSError) as row_error:
                    message = f"The image of {_name_row(row, position)} cannot be used: {row_error}"
                    raise ValueError(message) from row_error
            raise

    def _prompted_image_inputs(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """The processor's outputs for every row's image with the prompt, the prompt's tokens renamed `prompt_*`."""
        if "image" not in rows[0]:
            raise ValueError(
                f"A prompted captioner reads images through its processor, with the prompt, but the rows have no "
                f"`image` column (got {sorted(rows[0])}): give the dataset its images, not precomputed "
                "`pixel_values` or `image_features`."
            )
        # one list of images per prompt: processors that split images (Idefics3) or count them per text need it
        images = [[row["image"]] for row in rows]
        outputs = self.processor(
            images=images, text=[self.prompt] * len(rows), padding=True, padding_side="left", return_tensors="pt"
        )
        return prompt_inputs(outputs)

    def _tokenize(self, texts: list[str]) -> tuple[torch.LongTensor, torch.LongTensor]:
        """`start w_1 ... w_n end pad ...` for every text: `input_ids` and `attention_mask` of shape `(N, T)`."""
        tokens = self.caption_tokens
        # the processor's own text handling (CaptionProcessor normalises like the metrics), without padding: the
        # framing below changes the lengths
        encoded = self._reference_tokenizer(text=texts, padding=False, return_tensors=None)["input_ids"]
        max_words = None if self.max_length is None else self.max_length - 2
        sequences = []
        for ids in encoded:
            start, end = 0, len(ids)
            while start < end and ids[start] in self._boundary_token_ids:
                start += 1
            while end > start and ids[end - 1] in self._boundary_token_ids:
                end -= 1
            words = list(ids[start:end])[:max_words]
            sequences.append([tokens.start_token_id, *words, tokens.end_token_id])
        length = max(len(sequence) for sequence in sequences)
        input_ids = torch.full((len(sequences), length), tokens.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
        for row, sequence in enumerate(sequences):
            input_ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            attention_mask[row, : len(sequence)] = 1
        return input_ids, attention_mask


def _name_row(row: dict[str, Any], position: int) -> str:
    """A batch row as the dataset knows it: by its `image_id` when it has one, else by its position."""
    if row.get("image_id") is not None:
        return f"the row with image_id {row['image_id']!r}"
    return f"row {position} of the batch"


def _stack_rows(rows: Sequence[dict[str, Any]], column: str) -> torch.FloatTensor:
    """The precomputed `column` of every row as one float tensor; a row of another shape is named."""
    tensors = [torch.as_tensor(row[column]) for row in rows]
    for position, tensor in enumerate(tensors):
        if tensor.shape != tensors[0].shape:
            row_name = _name_row(rows[position], position)
            raise ValueError(
                f"{row_name[0].upper()}{row_name[1:]} has {column} of shape {tuple(tensor.shape)}, "
                f"unlike {_name_row(rows[0], 0)} ({column} of shape {tuple(tensors[0].shape)}): compute the "
                f"{column} of every image with the same extractor and settings."
            )
    return torch.stack(tensors).float()


def pad_regions(rows: Sequence[dict[str, Any]], column: str) -> tuple[torch.FloatTensor, torch.LongTensor]:
    """The `(N_i, F)` arrays of `column` zero-padded to `(B, max N_i, F)`, and the mask `(B, max N_i)` of the rows'
    real positions; a row of another width or of another number of dimensions is named."""
    arrays = [np.asarray(row[column], dtype=np.float32) for row in rows]
    width = arrays[0].shape[-1]
    for position, array in enumerate(arrays):
        if array.ndim != 2 or array.shape[1] != width or array.shape[0] == 0:
            row_name = _name_row(rows[position], position)
            raise ValueError(
                f"{row_name[0].upper()}{row_name[1:]} has {column} of shape {array.shape}, unlike "
                f"{_name_row(rows[0], 0)} ({column} of shape {arrays[0].shape}): every image needs at least one "
                f"position of width {width}, (num_regions, {width}); compute the {column} of every image with the "
                "same extractor and settings."
            )
    num_positions = [array.shape[0] for array in arrays]
    padded = np.zeros((len(arrays), max(num_positions), width), dtype=np.float32)
    mask = torch.zeros((len(arrays), max(num_positions)), dtype=torch.long)
    for index, array in enumerate(arrays):
        padded[index, : num_positions[index]] = array
        mask[index, : num_positions[index]] = 1
    return torch.from_numpy(padded), mask


def _check_boxes_match_regions(
    rows: Sequence[dict[str, Any]], boxes_mask: torch.LongTensor, feature_mask: torch.LongTensor
) -> None:
    """Refuse rows with another number of boxes than of region features."""
    counts = zip(boxes_mask.sum(dim=1).tolist(), feature_mask.sum(dim=1).tolist(), strict=True)
    for position, (num_boxes, num_regions) in enumerate(counts):
        if num_boxes != num_regions:
            row_name = _name_row(rows[position], position)
            raise ValueError(
                f"{row_name[0].upper()}{row_name[1:]} has {num_boxes} image_boxes for {num_regions} regions in "
                "image_features; take both from the same feature files."
            )


def _tokenizer_caption_tokens(tokenizer: Any) -> CaptionTokens:
    """The tokenizer's bos and eos as start and end tokens, for a collator not told the model's."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if bos is None or eos is None:
        raise ValueError(
            f"{type(tokenizer).__name__} has no {'bos' if bos is None else 'eos'} token, so references would be "
            "tokenized without a start or end token and a model trained on them would never end its captions. "
            "Pass the model's tokens: `CaptionCollator(processor, caption_tokens=captioner_for(model).tokens)` "
            "(`rlcaption.generation.captioners.captioner_for`; RLCaptionTrainer does this)."
        )
    pad = tokenizer.pad_token_id
    return CaptionTokens(start_token_id=bos, end_token_id=eos, pad_token_id=eos if pad is None else pad)
