"""CLIP-based caption metrics: CLIP-S (Hessel et al. 2021) and CLIP retrieval recall of generated captions.

Both take any CLIP-style dual encoder with the interface of `transformers.CLIPModel` (`get_image_features`,
`get_text_features`) and a processor taking `images=` and `text=`: a Hub id such as `openai/clip-vit-base-patch32`, a
local folder (the project's `checkpoints/shapes-clip-reward` or `checkpoints/shapes-clip-evaluator`, loaded through
the Auto classes that `import rlcaption` registers), or an already-loaded `(model, processor)` pair. Loading uses
the ordinary `from_pretrained`, which reads a local folder or the Hub cache and downloads a Hub id only when it is
not cached (pass `local_files_only=True`, or set `HF_HUB_OFFLINE=1`, to forbid that).

- CLIP-S of a caption `c` for an image `v`: `w * max(cos(E_I(v), E_T(c)), 0)` with `w = 2.5`; the corpus score is the
  mean over (image, caption) pairs (Hessel et al. 2021, eq. 1). Hessel et al. prefix each caption with
  "A photo depicts" for OpenAI CLIP (`prompt=`); the shapes CLIPs were trained on bare captions, hence no default.
- CLIP retrieval: each caption queries all images of the set (text -> image) and each image all captions
  (image -> text); `rlcaption.metrics.retrieval.retrieval_recall` computes R@K from the embeddings.

torch and transformers are imported inside the functions, so `import rlcaption.metrics` stays torch-free.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .retrieval import retrieval_recall

if TYPE_CHECKING:
    import torch

__all__ = ["CLIP_S_WEIGHT", "clip_retrieval", "clip_s", "clip_score", "embed_images", "embed_texts", "load_clip"]

# Hessel et al. 2021, eq. 1: w = 2.5 stretches the cosines CLIP gives to matching pairs (roughly [0, 0.4]) to [0, 1].
CLIP_S_WEIGHT = 2.5


def load_clip(model: Any, local_files_only: bool = False) -> tuple[Any, Any]:
    """A CLIP model in evaluation mode and its processor.

    Args:
        model (`str`, `os.PathLike` or `(model, processor)`): a Hub id or local folder loaded with
            `AutoModel.from_pretrained` and `AutoProcessor.from_pretrained`, or an already-loaded pair, returned as is
            (put in evaluation mode).
        local_files_only (`bool`, *optional*, defaults to `False`): never contact the Hub; a Hub id must then be in
            the local cache.

    Returns:
        `(model, processor)`.

    Raises:
        `FileNotFoundError`: at once, for a name that is neither a folder nor a Hub id that can be loaded now (see
            [`rlcaption.hub.check_pretrained_reference`]).
    """
    if isinstance(model, tuple | list):
        if len(model) != 2:
            raise ValueError(
                f"Pass a CLIP as a hub id, a folder or a (model, processor) pair, got {len(model)} items."
            )
        clip_model, processor = model
    elif isinstance(model, str | os.PathLike):
        from transformers import AutoModel, AutoProcessor

        import rlcaption.models  # noqa: F401  (registers the project's CLIPs with the Auto classes)
        from rlcaption.hub import check_pretrained_reference

        name = os.fspath(model)
        # a mistyped folder, or a Hub id not cached while the Hub is out of reach, fails now rather than after retries
        local_files_only = check_pretrained_reference(name, option="CLIP", local_files_only=local_files_only)
        clip_model = AutoModel.from_pretrained(name, local_files_only=local_files_only)
        processor = AutoProcessor.from_pretrained(name, local_files_only=local_files_only)
    else:
        raise ValueError(
            f"Unsupported CLIP {type(model).__name__} {model!r}: pass a hub id (e.g. 'openai/clip-vit-base-patch32'), "
            "a local folder, or a (model, processor) pair."
        )
    for method in ("get_image_features", "get_text_features"):
        if not callable(getattr(clip_model, method, None)):
            raise ValueError(
                f"{type(clip_model).__name__} has no `{method}`; CLIP metrics need a dual encoder with the interface "
                "of transformers.CLIPModel."
            )
    return clip_model.eval(), processor


def _embedding(output: Any) -> torch.Tensor:
    """The embedding of a `get_*_features` call: transformers 5 returns an output whose `pooler_output` it is."""
    if hasattr(output, "pooler_output"):
        return output.pooler_output
    return output  # transformers 4 returned the tensor itself


def _device(model: Any) -> torch.device:
    import torch

    parameter = next(iter(model.parameters()), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _accepts_keyword(function: Any, name: str) -> bool:
    parameters = inspect.signature(function).parameters
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")


def embed_images(model: Any, processor: Any, images: Sequence[Any], batch_size: int = 64) -> torch.Tensor:
    """L2-normalised image embeddings, computed in batches under `torch.no_grad()`.

    Args:
        model, processor: a CLIP and its processor (see [`load_clip`]).
        images (`Sequence`): PIL images, or arrays / tensors the processor accepts.
        batch_size (`int`, *optional*, defaults to 64): images per forward pass.

    Returns:
        `torch.FloatTensor` of shape `(len(images), projection_dim)` on the CPU.
    """
    import torch

    _check_batch_size(batch_size)
    images = list(images)
    if not images:
        raise ValueError("embed_images got no images.")
    device = _device(model)
    chunks = []
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            inputs = processor(images=images[start : start + batch_size], return_tensors="pt")
            pixel_values = inputs["pixel_values"].to(device)
            chunks.append(_embedding(model.get_image_features(pixel_values=pixel_values)).float().cpu())
    return torch.nn.functional.normalize(torch.cat(chunks), dim=-1)


def embed_texts(
    model: Any, processor: Any, texts: Sequence[str], batch_size: int = 256, prompt: str = ""
) -> torch.Tensor:
    """L2-normalised text embeddings of `prompt + text` for every text, in batches under `torch.no_grad()`.

    Long texts are truncated to the model's context when its processor supports truncation (OpenAI CLIP: 77 tokens).

    Returns:
        `torch.FloatTensor` of shape `(len(texts), projection_dim)` on the CPU.
    """
    import torch

    _check_batch_size(batch_size)
    texts = list(texts)
    if not texts:
        raise ValueError("embed_texts got no texts.")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"Text {index} is a {type(text).__name__} ({text!r}), expected a str.")
    options: dict[str, Any] = {"padding": True, "return_tensors": "pt"}
    if _accepts_keyword(processor.__call__, "truncation"):
        options["truncation"] = True
    device = _device(model)
    chunks = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            batch = [prompt + text for text in texts[start : start + batch_size]]
            inputs = processor(text=batch, **options)
            chunks.append(
                _embedding(
                    model.get_text_features(
                        input_ids=inputs["input_ids"].to(device),
                        attention_mask=inputs["attention_mask"].to(device) if "attention_mask" in inputs else None,
                    )
                )
                .float()
                .cpu()
            )
    return torch.nn.functional.normalize(torch.cat(chunks), dim=-1)


def clip_s(image_embeddings: Any, text_embeddings: Any, w: float = CLIP_S_WEIGHT) -> np.ndarray:
    """CLIP-S of matching rows: `w * max(cos(image_i, text_i), 0)` (Hessel et al. 2021, eq. 1).

    Args:
        image_embeddings, text_embeddings (`torch.Tensor` or `np.ndarray` of shape `(n, dim)`): row `i` of each is a
            pair; they need not be normalised.
        w (`float`, *optional*, defaults to 2.5): the rescaling weight.

    Returns:
        `np.ndarray` of shape `(n,)`, float64, each in `[0, w]`.
    """
    images = _as_numpy(image_embeddings)
    texts = _as_numpy(text_embeddings)
    if images.shape != texts.shape or images.ndim != 2:
        raise ValueError(
            f"CLIP-S pairs image i with text i: got embeddings of shapes {images.shape} and {texts.shape}."
        )
    norms = np.linalg.norm(images, axis=1) * np.linalg.norm(texts, axis=1)
    if np.any(norms == 0):
        raise ValueError("A zero embedding has no cosine similarity; check the CLIP's inputs.")
    cosine = np.einsum("nd,nd->n", images, texts) / norms
    return w * np.maximum(cosine, 0.0)


def _as_numpy(embeddings: Any) -> np.ndarray:
    if hasattr(embeddings, "detach"):
        embeddings = embeddings.detach().float().cpu().numpy()
    return np.asarray(embeddings, dtype=np.float64)


def _check_pairs(images: Sequence[Any], captions: Sequence[str]) -> tuple[list[Any], list[str]]:
    images, captions = list(images), list(captions)
    if len(images) != len(captions):
        raise ValueError(f"Got {len(images)} images and {len(captions)} captions; pass one caption per image.")
    if not images:
        raise ValueError("No images and captions to score.")
    return images, captions


def clip_score(
    images: Sequence[Any],
    captions: Sequence[str],
    model: Any,
    w: float = CLIP_S_WEIGHT,
    prompt: str = "",
    batch_size: int = 64,
    local_files_only: bool = False,
) -> tuple[float, list[float]]:
    """CLIP-S (Hessel et al. 2021) of each caption for its image, and their mean.

    Args:
        images (`Sequence`): one image per caption (PIL images, or arrays / tensors the CLIP's processor accepts).
        captions (`Sequence[str]`): the captions to score, `captions[i]` describing `images[i]`.
        model: a hub id, a local folder or a `(model, processor)` pair (see [`load_clip`]).
        w (`float`, *optional*, defaults to 2.5): the CLIP-S weight.
        prompt (`str`, *optional*, defaults to `""`): text put before every caption ("A photo depicts " in the
            paper, for OpenAI CLIP).
        batch_size (`int`, *optional*, defaults to 64): images (and 4x as many captions) per forward pass.
        local_files_only (`bool`, *optional*, defaults to `False`): never contact the Hub when loading `model`.

    Returns:
        `(corpus_score, per_caption)`: the mean CLIP-S and the CLIP-S of each caption, each in `[0, w]`.

    Example:
        ```python
        >>> from rlcaption.metrics import clip_score
        >>> score, per_caption = clip_score(images, captions, model="checkpoints/shapes-clip-evaluator")
        ```
    """
    images, captions = _check_pairs(images, captions)
    clip_model, processor = load_clip(model, local_files_only=local_files_only)
    image_embeddings = embed_images(clip_model, processor, images, batch_size=batch_size)
    text_embeddings = embed_texts(clip_model, processor, captions, batch_size=4 * batch_size, prompt=prompt)
    per_caption = clip_s(image_embeddings, text_embeddings, w=w)
    return float(per_caption.mean()), per_caption.tolist()


def clip_retrieval(
    images: Sequence[Any],
    captions: Sequence[str],
    model: Any,
    ks: Sequence[int] = (1, 5, 10),
    prompt: str = "",
    batch_size: int = 64,
    local_files_only: bool = False,
) -> dict[str, float]:
    """Retrieval recall R@K between a set of images and one caption per image, ranked by a CLIP's cosine similarity.

    Text -> image: caption `i` queries all images, a hit at K when image `i` is among the K most similar.
    Image -> text: image `i` queries all captions, a hit at K when caption `i` is among the K most similar. Ties count
    against the query (see [`retrieval_recall`]).

    Args:
        images, captions, model, prompt, batch_size, local_files_only: as for [`clip_score`].
        ks (`Sequence[int]`, *optional*, defaults to `(1, 5, 10)`): the cut-offs K.

    Returns:
        `dict[str, float]`: `"t2i_R@K"` and `"i2t_R@K"` for every K, each in [0, 1].
    """
    images, captions = _check_pairs(images, captions)
    clip_model, processor = load_clip(model, local_files_only=local_files_only)
    image_embeddings = embed_images(clip_model, processor, images, batch_size=batch_size)
    text_embeddings = embed_texts(clip_model, processor, captions, batch_size=4 * batch_size, prompt=prompt)
    return retrieval_recall(text_embeddings, image_embeddings, ks=ks)
