"""Model cards of the shapes CLIPs: retrieval results as `model-index` metadata and a Markdown card from a template.

The caption metrics of `rlcaption.hub` do not describe a dual encoder; [`render_clip_model_card`] fills
`templates/shapes_clip_model_card.md` with a [`ShapesCLIPModel`]'s architecture and its retrieval recalls (the keys
of [`rlcaption.metrics.clip_retrieval`]), which also become `huggingface_hub.EvalResult`s.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from rlcaption.hub import TEMPLATES, parameter_count
from rlcaption.models.shapes_clip import ShapesCLIPModel

__all__ = ["CLIP_MODEL_CARD_TEMPLATE", "render_clip_model_card", "retrieval_eval_results"]

CLIP_MODEL_CARD_TEMPLATE = TEMPLATES / "shapes_clip_model_card.md"

_RECALL_KEY = re.compile(r"^(t2i|i2t)_R@(\d+)$")
_DIRECTIONS = {"t2i": "text-to-image", "i2t": "image-to-text"}


def _display_name(key: str) -> str:
    match = _RECALL_KEY.match(key)
    if match is None:
        raise ValueError(
            f"Unknown retrieval score key {key!r}; expected keys of `clip_retrieval` results such as 't2i_R@1'."
        )
    return f"{_DIRECTIONS[match.group(1)]} R@{match.group(2)}"


def retrieval_eval_results(
    scores: Mapping[str, float], dataset_type: str, dataset_name: str, dataset_split: str = "test"
) -> list[EvalResult]:
    """One `EvalResult` per recall (`{"t2i_R@1": 0.9, "i2t_R@5": 0.99, ...}`), in the card's `model-index` format."""
    return [
        EvalResult(
            task_type="image-text-retrieval",
            task_name="Image-text retrieval",
            dataset_type=dataset_type,
            dataset_name=dataset_name,
            dataset_split=dataset_split,
            metric_type="recall",
            metric_name=_display_name(key),
            metric_value=round(float(value), 4),
        )
        for key, value in scores.items()
    ]


def _image_tower(model: ShapesCLIPModel) -> str:
    config = model.config
    if config.encoder_type == "cnn":
        return f"a {len(config.cnn_channels)}-block CNN (channels {list(config.cnn_channels)}, flattened last map)"
    backbone = config.backbone_config
    details = ", ".join(
        f"{name} {backbone[key]}"
        for key, name in (("num_hidden_layers", "layers"), ("hidden_size", "width"), ("patch_size", "patch"))
        if key in backbone
    )
    return f"a `{backbone['model_type']}` backbone ({details}, pooled output)"


def render_clip_model_card(
    model: ShapesCLIPModel,
    repo_id: str,
    scores: Mapping[str, float],
    model_summary: str,
    training_settings: Mapping[str, object],
    num_images: int,
    dataset_type: str = "shapes",
    dataset_name: str = "shapes",
    dataset_split: str = "test",
    validation_scores: Mapping[str, float] | None = None,
    tags: Sequence[str] = (),
    license: str = "apache-2.0",
    template_path: str | os.PathLike = CLIP_MODEL_CARD_TEMPLATE,
) -> ModelCard:
    """The model card of a trained [`ShapesCLIPModel`], with its retrieval results.

    Args:
        model: the trained model (its config gives the architecture lines).
        repo_id: the Hub id of the usage snippet (`org/name`).
        scores: retrieval recalls on `dataset_split` (`clip_retrieval` keys); the results table and the
            `model-index` metadata.
        model_summary: what the model is for (a Markdown sentence or paragraph).
        training_settings: `{setting: value}` rows of the training table.
        num_images: images of the evaluation split (the size of the retrieval gallery).
        validation_scores: the same recalls on the validation split, shown as a second column.
        tags: Hub tags added to the card's own.
        template_path: a Jinja Markdown template with a `{{ card_data }}` front matter.

    Returns:
        `huggingface_hub.ModelCard`; `card.save(folder / "README.md")` or `card.push_to_hub(repo_id)`.
    """
    if validation_scores is not None and set(validation_scores) != set(scores):
        raise ValueError(
            f"validation_scores has keys {sorted(validation_scores)} but scores has {sorted(scores)}; give both the "
            "same recalls."
        )
    card_data = ModelCardData(
        language="en",
        license=license,
        library_name="rlcaption",
        pipeline_tag="zero-shot-image-classification",
        tags=["clip", "image-text-retrieval", "rlcaption", "shapes-clip", *tags],
        metrics=["recall"],
        model_name=repo_id.split("/")[-1],
        eval_results=retrieval_eval_results(scores, dataset_type, dataset_name, dataset_split),
    )
    config = model.config
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path),
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        model_summary=model_summary,
        image_tower=_image_tower(model),
        text_hidden_size=config.text_hidden_size,
        projection_dim=config.projection_dim,
        image_size=config.image_size,
        num_parameters=parameter_count(model),
        training_settings=dict(training_settings),
        dataset_name=dataset_name,
        dataset_split=dataset_split,
        num_images=f"{num_images:,}",
        scores={_display_name(key): float(value) for key, value in scores.items()},
        validation_scores=(
            {_display_name(key): float(value) for key, value in validation_scores.items()}
            if validation_scores is not None
            else None
        ),
    )
