"""CaptionProcessor: image preprocessing plus a word-level caption tokenizer.

Captions are normalised with the metrics' tokenizer ([`rlcaption.metrics.tokenization.normalize_caption`]: the COCO
toolkit's PTB tokenization, lower-casing, punctuation removal) *before* they reach the word-level tokenizer, so the
words the model learns are exactly the words CIDEr-D, BLEU, ... compare. The `tokenizers` model only splits the
normalised text on whitespace; re-implementing the PTB lexer as `tokenizers` regexes would not match it on every
caption. The processor (`CaptionProcessor.from_pretrained`, `AutoProcessor.from_pretrained`) therefore always
normalises; the bare tokenizer expects already-normalised text.

Images go through a standard `transformers` image processor (`ViTImageProcessorPil`: resize, rescale, normalise)
after being converted to 8-bit RGB, whatever their mode, by [`rlcaption.data.images.convert_to_rgb`], the conversion
the dataset loaders use (grayscale, 16-bit, float, CMYK, palette, transparency composited on white, ...). A captioner
trained on precomputed features reads the `pixel_values` of the backbone that extracted them: its processor carries
that backbone's image processor, as the config records it ([`image_processor_of_extractor`]), so that the captioner
runs the backbone on them (`model.generate(pixel_values=...)`, the `image-text-to-text` pipeline).

Saved processors carry no code: they load as `CaptionProcessor` wherever rlcaption is imported. A processor saved
after `CaptionProcessor.register_for_auto_class()` also loads with `AutoProcessor.from_pretrained(...,
trust_remote_code=True)` for users without rlcaption: this module and the two it imports (`images.py`,
`tokenization.py`, which need only the standard library, numpy and Pillow) are saved next to it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import AutoImageProcessor, BatchFeature, PreTrainedTokenizerFast, ProcessorMixin
from transformers.models.vit import ViTImageProcessorPil
from transformers.utils import CONFIG_NAME, cached_file

from rlcaption.data.images import convert_to_rgb, rgb_for_image_processor
from rlcaption.metrics.tokenization import normalize_caption

__all__ = ["SPECIAL_TOKENS", "CaptionProcessor", "image_processor_of_extractor"]

# Order fixes the ids: <pad> = 0, <bos> = 1, <eos> = 2, <unk> = 3 (the defaults of ShowTellRLConfig).
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
_PAD, _BOS, _EOS, _UNK = SPECIAL_TOKENS


def _build_word_tokenizer(words: Sequence[str]) -> PreTrainedTokenizerFast:
    """Word-level fast tokenizer over `SPECIAL_TOKENS + words`; encoding adds `<bos>` ... `<eos>`."""
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *words])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=_UNK))
    # lower-casing is idempotent on normalised captions and keeps the bare tokenizer sensible on raw text
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{_BOS} $A {_EOS}", special_tokens=[(_BOS, vocab[_BOS]), (_EOS, vocab[_EOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=_PAD, bos_token=_BOS, eos_token=_EOS, unk_token=_UNK
    )


def image_processor_of_extractor(extractor: Mapping):
    """
    The image processor that prepared the images of precomputed features, from the record of their extractor (a
    captioner config's `image_feature_extractor`, a features manifest's): its recorded settings, or, for records of
    older versions without them, the backbone's own image processor (`AutoImageProcessor.from_pretrained`).
    """
    settings = dict(extractor.get("image_processor") or {})
    if not settings:
        return AutoImageProcessor.from_pretrained(extractor["model"])
    return getattr(transformers, settings.pop("image_processor_type")).from_dict(settings)


def _recorded_feature_extractor(pretrained_model_name_or_path, hub_kwargs: Mapping) -> dict | None:
    """The `image_feature_extractor` of the captioner saved beside a processor (its own config's, its policy's or its
    speaker's), or `None`: a captioner of images, features without a record, or no model config there."""
    hub_options = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
    config_file = cached_file(
        pretrained_model_name_or_path,
        CONFIG_NAME,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
        **{name: hub_kwargs[name] for name in hub_options if name in hub_kwargs},
    )
    if config_file is None:
        return None
    config = json.loads(Path(config_file).read_text(encoding="utf-8"))
    for captioner in (config, config.get("policy_config"), config.get("speaker_config")):
        if isinstance(captioner, dict) and captioner.get("encoder_type") == "features":
            return captioner.get("image_feature_extractor")
    return None


def _check_captions(captions: Sequence) -> list[str]:
    if isinstance(captions, str):
        return [captions]
    captions = list(captions)
    for index, caption in enumerate(captions):
        if not isinstance(caption, str):
            raise ValueError(
                f"Caption {index} is a {type(caption).__name__} ({caption!r}), expected a str; convert or drop "
                "non-string captions before tokenizing."
            )
    return captions


def _array_to_rgb_array(array: np.ndarray) -> np.ndarray:
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3:
        raise ValueError(f"Expected an image array of shape (H, W), (H, W, C) or (C, H, W), got {array.shape}.")
    if array.shape[0] in (1, 3, 4) and array.shape[-1] not in (1, 3, 4):
        array = np.moveaxis(array, 0, -1)  # channels first -> channels last
    if np.issubdtype(array.dtype, np.floating):
        if array.size and (array.min() < 0.0 or array.max() > 1.0):
            raise ValueError(
                f"Float image arrays must hold values in [0, 1], got [{array.min()}, {array.max()}]; pass uint8 "
                "arrays for 0-255 values."
            )
        array = np.round(array * 255.0).astype(np.uint8)
    elif array.dtype != np.uint8:
        raise ValueError(f"Image arrays must be uint8 or float in [0, 1], got dtype {array.dtype}.")
    if array.shape[-1] not in (1, 3, 4):
        raise ValueError(f"Image arrays must have 1, 3 or 4 channels, got shape {array.shape}.")
    # gray, RGB or RGBA image, converted like PIL images of these modes
    image = Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)
    return np.asarray(convert_to_rgb(image))


def _describe_image(image) -> str:
    """What an image of a batch is, for error messages: its file when it was opened from one."""
    if isinstance(image, Image.Image):
        filename = getattr(image, "filename", "")
        return f"image file {filename}" if filename else f"in-memory {image.mode} image of size {image.size}"
    if isinstance(image, (np.ndarray, torch.Tensor)):
        kind = "array" if isinstance(image, np.ndarray) else "tensor"
        return f"{image.dtype} {kind} of shape {tuple(image.shape)}"
    return type(image).__name__


def _image_list(images) -> list:
    """One image or a batch of them (list, tuple, datasets `Column`, generator, `(batch, ...)` array) -> a list."""
    if isinstance(images, (np.ndarray, torch.Tensor)):
        return list(images) if images.ndim == 4 else [images]
    # a str or bytes (a file path or encoded file) and a mapping (an undecoded datasets image) are one image each,
    # rejected with their type by `_prepare_image`, not iterated over
    if isinstance(images, Iterable) and not isinstance(images, (str, bytes, Mapping)):
        return list(images)
    return [images]


class CaptionProcessor(ProcessorMixin):
    """Prepares images and captions for rlcaption's captioners and decodes generated token ids.

    Args:
        image_processor ([`ViTImageProcessorPil`] or any `transformers` image processor):
            Resizes, rescales and normalises RGB images into `pixel_values`.
        tokenizer ([`PreTrainedTokenizerFast`]):
            Word-level tokenizer with the special tokens `<pad>` (id 0), `<bos>`, `<eos>`, `<unk>`; build one
            with [`CaptionProcessor.from_captions`].

    Example:

    ```python
    >>> processor = CaptionProcessor.from_captions(dataset["train"]["captions"], min_count=5)
    >>> batch = processor(images=images, text=["A red circle.", "Two squares."])
    >>> batch["input_ids"]  # <bos> a red circle <eos> / <bos> two squares <eos> <pad>
    >>> processor.batch_decode(model.generate(pixel_values=batch["pixel_values"]))
    ```
    """

    def __init__(self, image_processor, tokenizer):
        super().__init__(image_processor, tokenizer)

    @classmethod
    def from_captions(
        cls,
        captions: Iterable[str] | Iterable[Sequence[str]],
        min_count: int = 1,
        image_size: int = 64,
        image_mean: Sequence[float] = (0.5, 0.5, 0.5),
        image_std: Sequence[float] = (0.5, 0.5, 0.5),
        max_vocab_size: int | None = None,
    ) -> CaptionProcessor:
        """Build a processor whose vocabulary holds the words of `captions` seen at least `min_count` times.

        Args:
            captions: training captions, flat (`["a cat", ...]`) or one list per image (a `captions` column).
            min_count: rarer words map to `<unk>`.
            image_size: side of the square `pixel_values`.
            image_mean, image_std: per-channel normalisation of pixel values scaled to [0, 1].
            max_vocab_size: keep at most this many entries, the 4 special tokens included (most frequent words).

        Words are ordered by decreasing count, ties alphabetically, so the same captions give the same ids.
        """
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}.")
        if max_vocab_size is not None and max_vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(
                f"max_vocab_size={max_vocab_size} leaves no room for words next to the {len(SPECIAL_TOKENS)} "
                "special tokens."
            )
        counts: Counter[str] = Counter()
        num_captions = 0
        for item in captions:
            for caption in _check_captions(item):
                counts.update(normalize_caption(caption).split())
                num_captions += 1
        if num_captions == 0:
            raise ValueError("from_captions got no captions; pass the training captions to build the vocabulary.")
        words = sorted((word for word, count in counts.items() if count >= min_count), key=lambda w: (-counts[w], w))
        words = [word for word in words if word not in SPECIAL_TOKENS]
        if max_vocab_size is not None:
            words = words[: max_vocab_size - len(SPECIAL_TOKENS)]
        image_processor = ViTImageProcessorPil(
            size={"height": image_size, "width": image_size}, image_mean=list(image_mean), image_std=list(image_std)
        )
        return cls(image_processor=image_processor, tokenizer=_build_word_tokenizer(words))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs):
        """`ProcessorMixin.from_pretrained`; beside a captioner trained on precomputed features, the image processor
        is the one its config records (`image_feature_extractor`).

        Processors saved with such captioners by older versions hold the captioner's own image processor (a square of
        `image_size`), which the backbone that turns `pixel_values` into features was not trained on: the record
        replaces it, so that these checkpoints caption photos too.
        """
        loaded = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        processor = loaded[0] if isinstance(loaded, tuple) else loaded  # (processor, unused kwargs) when asked for
        extractor = _recorded_feature_extractor(pretrained_model_name_or_path, kwargs)
        if extractor is not None:
            processor.image_processor = image_processor_of_extractor(extractor)
        return loaded

    @property
    def model_input_names(self) -> list[str]:
        return ["pixel_values", "input_ids", "attention_mask"]

    def _prepare_image(self, image) -> np.ndarray:
        if isinstance(image, Image.Image):
            return np.asarray(rgb_for_image_processor(image, self.image_processor))
        if isinstance(image, torch.Tensor):
            return _array_to_rgb_array(image.detach().cpu().numpy())
        if isinstance(image, np.ndarray):
            return _array_to_rgb_array(image)
        raise ValueError(
            f"Unsupported image type {type(image).__name__}; pass PIL images, numpy arrays or torch tensors (open "
            "image files with `rlcaption.data.open_image`)."
        )

    def __call__(
        self,
        images=None,
        text: str | Sequence[str] | None = None,
        max_length: int | None = None,
        padding: bool | str = True,
        return_tensors: str | None = "pt",
    ) -> BatchFeature:
        """Prepare a batch.

        Args:
            images: one image or a batch: any iterable of images (a list, a tuple, the `image` column of a
                `datasets.Dataset`, a generator) or a `(batch_size, ...)` array or tensor. Images are PIL images of
                any mode, or `(H, W[, C])`/`(C, H, W)` uint8 or [0, 1] float arrays or tensors.
            text: one caption or a list; normalised like the metrics, then `<bos> w_1 ... <eos>`.
            max_length: truncate captions to this many tokens, `<bos>` and `<eos>` included.
            padding: `True`/"longest" pads to the longest caption, "max_length" to `max_length`, False not at all.
            return_tensors: "pt", "np" or None (lists).

        Returns:
            [`BatchFeature`] with `pixel_values` `(batch_size, 3, size, size)` when `images` is given, and
            `input_ids`, `attention_mask` `(batch_size, length)` when `text` is given.
        """
        if images is None and text is None:
            raise ValueError("CaptionProcessor needs images, text or both.")
        data = {}
        if images is not None:
            image_list = _image_list(images)
            arrays = []
            for index, image in enumerate(image_list):
                try:
                    arrays.append(self._prepare_image(image))
                except ValueError as error:
                    if len(image_list) == 1:
                        raise
                    raise ValueError(f"Image {index} of the batch ({_describe_image(image)}): {error}") from error
            if not arrays:
                raise ValueError(
                    "CaptionProcessor got an empty batch of images; pass at least one image, or no images."
                )
            pixel_values = self.image_processor(
                arrays, return_tensors=return_tensors, input_data_format="channels_last"
            )["pixel_values"]
            data["pixel_values"] = pixel_values
        if text is not None:
            normalised = [normalize_caption(caption) for caption in _check_captions(text)]
            encoded = self.tokenizer(
                normalised,
                padding=padding,
                truncation=max_length is not None,
                max_length=max_length,
                return_tensors=return_tensors,
                return_token_type_ids=False,
            )
            data.update(encoded)
        return BatchFeature(data=data, tensor_type=return_tensors)

    def batch_decode(self, sequences, skip_special_tokens: bool = True, **kwargs) -> list[str]:
        """Token ids `(batch_size, length)` -> captions, each cut after its first `<eos>` (after position 0).

        With `skip_special_tokens=True` (the default) `<pad>`, `<bos>`, `<eos>` and `<unk>` are dropped and the
        words joined by single spaces: the result is already normalised like the metrics' tokenizer output.
        """
        if isinstance(sequences, torch.Tensor):
            sequences = sequences.tolist()
        elif isinstance(sequences, np.ndarray):
            sequences = sequences.tolist()
        eos_id = self.tokenizer.eos_token_id
        # each distinct caption is decoded once: a trained policy's rollouts repeat themselves (3,177 rollouts of 128
        # images held 464 distinct captions)
        position: dict[tuple[int, ...], int] = {}
        rows = []
        for ids in sequences:
            ids = tuple(ids)
            if eos_id in ids[1:]:
                ids = ids[: ids.index(eos_id, 1) + 1]
            rows.append(position.setdefault(ids, len(position)))
        texts = self._decode_distinct([list(ids) for ids in position], skip_special_tokens, **kwargs)
        return [texts[row] for row in rows]

    def _decode_distinct(self, captions: list[list[int]], skip_special_tokens: bool, **kwargs) -> list[str]:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None or set(kwargs) - {"clean_up_tokenization_spaces"}:
            return [self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, **kwargs) for ids in captions]
        # one call into the Rust tokenizer for the whole batch: around a call per caption, Python cost more than the
        # decoding itself (10 ms for the 768 captions of an SCST step at 128 images, on one core)
        texts = backend.decode_batch(captions, skip_special_tokens=skip_special_tokens)
        clean_up = kwargs.get("clean_up_tokenization_spaces")
        if clean_up if clean_up is not None else self.tokenizer.clean_up_tokenization_spaces:
            return [self.tokenizer.clean_up_tokenization(text) for text in texts]
        return texts

    def decode(self, token_ids, skip_special_tokens: bool = True, **kwargs) -> str:
        """One caption: see [`batch_decode`]."""
        if isinstance(token_ids, (torch.Tensor, np.ndarray)):
            token_ids = token_ids.tolist()
        return self.batch_decode([token_ids], skip_special_tokens=skip_special_tokens, **kwargs)[0]

    def post_process_image_text_to_text(self, generated_outputs, skip_special_tokens: bool = True, **kwargs):
        """Captions from `generate` outputs (what the `image-text-to-text` pipeline calls)."""
        return self.batch_decode(generated_outputs, skip_special_tokens=skip_special_tokens, **kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs) -> list[str]:
        """`ProcessorMixin.save_pretrained`; when registered for `trust_remote_code`, also makes the code standalone.

        The saved `processing.py` imports the image conversion and the caption normalisation from the package; next
        to the checkpoint it must import them from copies in the same folder, so that users without `rlcaption` can
        load the processor with `trust_remote_code=True`.
        """
        saved_files = super().save_pretrained(save_directory)
        if self._auto_class is not None:
            _make_remote_code_standalone(Path(save_directory))
        if push_to_hub:
            # `push_to_hub` saves again through this method, so the uploaded code is the standalone one
            self.push_to_hub(kwargs.pop("repo_id", Path(save_directory).name), **kwargs)
        return saved_files


def _make_remote_code_standalone(save_directory: Path) -> None:
    """Copy the modules this one imports from the package next to the saved `processing.py`, importing the copies."""
    processing_file = save_directory / Path(__file__).name
    source = processing_file.read_text(encoding="utf-8")
    for function in (convert_to_rgb, normalize_caption):
        module_file = Path(sys.modules[function.__module__].__file__)  # the package's or a remote copy
        source = source.replace(f"from {function.__module__} import", f"from .{module_file.stem} import")
        if module_file.resolve() != (save_directory / module_file.name).resolve():
            shutil.copyfile(module_file, save_directory / module_file.name)
    processing_file.write_text(source, encoding="utf-8")
