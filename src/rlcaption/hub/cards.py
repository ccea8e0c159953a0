"""
Model cards of trained captioners: [`render_model_card`] fills a template of `rlcaption/hub/templates/` with a
model's facts and its evaluation scores; the scores also go into the card's metadata as `EvalResult`s
(`model-index`), so the Hub shows them on the model page.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from torch import nn

__all__ = [
    "MODEL_CARD_TEMPLATE",
    "OBJECTIVE_CITATIONS",
    "TEMPLATES",
    "caption_eval_results",
    "objective_citation",
    "parameter_count",
    "render_model_card",
]

# the Jinja templates of the package's model cards
TEMPLATES = Path(__file__).parent / "templates"
MODEL_CARD_TEMPLATE = TEMPLATES / "captioner_model_card.md"

# COCO evaluation keys (as returned by `rlcaption.metrics.evaluate_captions`) -> (Hub metric type, display name)
_CAPTION_METRICS = {
    "Bleu_1": ("bleu", "BLEU-1"),
    "Bleu_2": ("bleu", "BLEU-2"),
    "Bleu_3": ("bleu", "BLEU-3"),
    "Bleu_4": ("bleu", "BLEU-4"),
    "METEOR": ("meteor", "METEOR"),
    "ROUGE_L": ("rouge", "ROUGE-L"),
    "CIDEr": ("cider", "CIDEr-D"),
    "SPICE": ("spice", "SPICE"),
    "SPIDEr": ("spider", "SPIDEr"),
}


# Scene grounding keys (`rlcaption.shapes.scene_grounding`, datasets with a `scene` column) -> (type, display name)
_SCENE_METRICS = {
    "object_f1": ("f1", "Object F1 (colour+shape)"),
    "object_precision": ("precision", "Object precision"),
    "object_recall": ("recall", "Object recall"),
    "color_f1": ("f1", "Colour F1"),
    "shape_f1": ("f1", "Shape F1"),
    "size_accuracy": ("accuracy", "Size accuracy"),
    "relation_accuracy": ("accuracy", "Relation accuracy"),
    "location_accuracy": ("accuracy", "Location accuracy"),
    "count_accuracy": ("accuracy", "Count accuracy"),
    "generic_share": ("generic_share", "Generic captions"),
    "parse_failure_share": ("parse_failure_share", "Parse failures"),
}
# Diversity (`rlcaption.evaluation.diversity_scores`) and evaluator-CLIP (`clip_scores`) keys -> (type, display name)
_DIVERSITY_AND_CLIP_METRICS = {
    "Div-1": ("div_1", "Div-1"),
    "Div-2": ("div_2", "Div-2"),
    "mBLEU-4": ("mbleu_4", "mBLEU-4"),
    "Self-BLEU": ("self_bleu", "Self-BLEU"),
    "distinct_captions": ("distinct_captions", "Distinct captions"),
    "CLIP-S": ("clip_score", "CLIP-S (evaluator CLIP)"),
    **{
        f"{direction}_R@{k}": ("recall", f"{label} R@{k} (evaluator CLIP)")
        for direction, label in (("t2i", "Text-to-image"), ("i2t", "Image-to-text"))
        for k in (1, 5, 10)
    },
    **{f"listener_R@{k}": ("recall", f"Listener R@{k} (caption to image)") for k in (1, 5, 10)},
}
# Scores of the lookahead beam search of a policy-value captioner (Ren et al. 2017), beside those of plain beam search.
_DIVERSITY_AND_CLIP_METRICS.update(
    {
        f"lookahead_{key}": (metric_type, f"{name} (lookahead beam search)")
        for key, (metric_type, name) in {**_CAPTION_METRICS, **_SCENE_METRICS}.items()
        if key in ("CIDEr", "Bleu_4", "object_f1")
    }
)
# The same CLIP scores by the CLIP a reward used (Chaffin et al. 2024 reports both; the reward CLIP can be fooled).
_DIVERSITY_AND_CLIP_METRICS.update(
    {
        f"reward_clip_{key}": (metric_type, name.replace("(evaluator CLIP)", "(reward CLIP)"))
        for key, (metric_type, name) in _DIVERSITY_AND_CLIP_METRICS.items()
        if "evaluator CLIP" in name
    }
)
# The scores of greedy captions beside those of beam search: a speaker-listener's listener recall and naturalness on
# each decoding (Vered et al. 2019's trade-off, both axes on the same captions).
_DIVERSITY_AND_CLIP_METRICS.update(
    {
        f"greedy_{key}": (metric_type, f"{name} (greedy decoding)")
        for key, (metric_type, name) in {**_CAPTION_METRICS, **_DIVERSITY_AND_CLIP_METRICS}.items()
        if key in _CAPTION_METRICS or key.startswith(("listener_R@", "t2i_R@"))
    }
)
# How well a policy-value captioner's value network predicts the rewards of captions sampled for the test images
# (`rlcaption.objectives.actor_critic.value_explained_variance`, Ren et al. 2017).
_VALUE_METRICS = {
    "value_explained_variance": ("explained_variance", "Value network explained variance (sampled test captions)")
}
_REPORTED_METRICS = {**_CAPTION_METRICS, **_SCENE_METRICS, **_DIVERSITY_AND_CLIP_METRICS, **_VALUE_METRICS}
# Keys that qualify the scores (supports, per-part figures, what `Trainer.evaluate` adds) rather than being scores
# worth a card line.
_QUALIFYING_KEYS = (
    "loss",
    "runtime",
    "samples_per_second",
    "steps_per_second",
    "epoch",
    "num_captions",
    "num_images",
    "num_sizes_checked",
    "num_relations_checked",
    "num_locations_checked",
    "num_counts_checked",
    "color_precision",
    "color_recall",
    "shape_precision",
    "shape_recall",
)


# Scores of several captions per image (`rlcaption.evaluation.caption_set_scores`), keyed `sample5_CIDEr`, ...
_CAPTION_SET_KEY = re.compile(r"^(sample|beam)(\d+)_(CIDEr|Div-1|Div-2|mBLEU-4|object_f1|parse_failure_share)$")


def _caption_set_metric(key: str) -> tuple[str, str] | None:
    match = _CAPTION_SET_KEY.match(key)
    if match is None:
        return None
    decoding, size, name = match.groups()
    metric_type, display_name = _REPORTED_METRICS[name]
    drawn = f"{size} samples" if decoding == "sample" else f"beam-{size} top {size}"
    return metric_type, f"{display_name}, {drawn} per image"


def _metric_names(scores: Mapping[str, float]) -> dict[str, tuple[str, str]]:
    names = {key: name for key, name in _REPORTED_METRICS.items() if key in scores}
    names.update({key: name for key in scores if (name := _caption_set_metric(key)) is not None})
    unknown = sorted(set(scores) - set(names) - set(_QUALIFYING_KEYS))
    if unknown:
        raise ValueError(
            f"Unknown caption metric keys {unknown}; expected keys of `evaluate_captions` or `scene_grounding` "
            f"results: {list(_REPORTED_METRICS)}."
        )
    # a ratio with nothing to count (nan: e.g. no relation stated) is not a result
    return {key: name for key, name in names.items() if scores[key] == scores[key]}


def caption_eval_results(
    scores: Mapping[str, float],
    dataset_type: str,
    dataset_name: str,
    dataset_split: str = "test",
    task_type: str = "image-to-text",
    task_name: str = "Image captioning",
) -> list[EvalResult]:
    """
    One `huggingface_hub.EvalResult` per score, in the card's `model-index` format.

    Args:
        scores: `{"CIDEr": 1.23, "Bleu_4": 0.45, ...}` as returned by [`rlcaption.metrics.evaluate_captions`].
        dataset_type: the dataset's Hub id or loader name (e.g. `"shapes"`).
        dataset_name: its human-readable name.
    """
    return [
        EvalResult(
            task_type=task_type,
            task_name=task_name,
            dataset_type=dataset_type,
            dataset_name=dataset_name,
            dataset_split=dataset_split,
            metric_type=metric_type,
            metric_name=display_name,
            metric_value=round(float(scores[key]), 4),
        )
        for key, (metric_type, display_name) in _metric_names(scores).items()
    ]


def parameter_count(model: nn.Module) -> str:
    """The number of parameters as a card shows it: `1.35M` or `446k`."""
    count = sum(parameter.numel() for parameter in model.parameters())
    return f"{count / 1e6:.2f}M" if count >= 1e6 else f"{count / 1e3:.0f}k"


# The paper of each training objective, the citation of the cards of the captioners it trains.
OBJECTIVE_CITATIONS = {
    "xe": """@inproceedings{vinyals2015show,
  title     = {Show and Tell: A Neural Image Caption Generator},
  author    = {Vinyals, Oriol and Toshev, Alexander and Bengio, Samy and Erhan, Dumitru},
  booktitle = {Proceedings of the IEEE Conference on Computer Vision and Pattern Recognition (CVPR)},
  year      = {2015}
}""",
    "scst": """@inproceedings{rennie2017scst,
  title     = {Self-critical Sequence Training for Image Captioning},
  author    = {Rennie, Steven J. and Marcheret, Etienne and Mroueh, Youssef and Ross, Jerret and Goel, Vaibhava},
  booktitle = {Proceedings of the IEEE Conference on Computer Vision and Pattern Recognition (CVPR)},
  year      = {2017}
}""",
    "spider_pg": """@inproceedings{liu2017spider,
  title     = {Improved Image Captioning via Policy Gradient optimization of SPIDEr},
  author    = {Liu, Siqi and Zhu, Zhenhai and Ye, Ning and Guadarrama, Sergio and Murphy, Kevin},
  booktitle = {Proceedings of the IEEE International Conference on Computer Vision (ICCV)},
  year      = {2017}
}""",
    "sle": """@inproceedings{chen2020sle,
  title     = {Better Captioning with Sequence-Level Exploration},
  author    = {Chen, Jia and Jin, Qin},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)},
  year      = {2020}
}""",
    "wtf": """@misc{chaffin2024distinctive,
  title  = {Distinctive Image Captioning: Leveraging Ground Truth Captions in CLIP Guided Reinforcement Learning},
  author = {Chaffin, Antoine and Kijak, Ewa and Claveau, Vincent},
  note   = {arXiv preprint},
  year   = {2024}
}""",
    "actor_critic": """@inproceedings{ren2017embedding,
  title     = {Deep Reinforcement Learning-based Image Captioning with Embedding Reward},
  author    = {Ren, Zhou and Wang, Xiaoyu and Zhang, Ning and Lv, Xutao and Li, Li-Jia},
  booktitle = {Proceedings of the IEEE Conference on Computer Vision and Pattern Recognition (CVPR)},
  year      = {2017}
}""",
    "psst": """@inproceedings{vered2019joint,
  title     = {Joint Optimization for Cooperative Image Captioning},
  author    = {Vered, Gilad and Oren, Gal and Atzmon, Yuval and Chechik, Gal},
  booktitle = {Proceedings of the IEEE/CVF International Conference on Computer Vision (ICCV)},
  year      = {2019}
}""",
}


def objective_citation(objective: str) -> str:
    """The BibTeX entry of `objective`'s paper ([`OBJECTIVE_CITATIONS`]), as a captioner's card cites it."""
    if objective not in OBJECTIVE_CITATIONS:
        raise ValueError(
            f"No paper is known for objective {objective!r}; the cards cite one of {sorted(OBJECTIVE_CITATIONS)}. "
            "Add its BibTeX entry to `rlcaption.hub.OBJECTIVE_CITATIONS`."
        )
    return OBJECTIVE_CITATIONS[objective]


def render_model_card(
    model: nn.Module,
    repo_id: str,
    scores: Mapping[str, float],
    dataset_type: str,
    dataset_name: str,
    model_summary: str,
    training_summary: str,
    training_settings: Mapping[str, object],
    evaluation_summary: str,
    limitations: str,
    objective: str,
    dataset_split: str = "test",
    tags: Sequence[str] = (),
    license: str = "apache-2.0",
    template_path: str | os.PathLike = MODEL_CARD_TEMPLATE,
) -> ModelCard:
    """
    The model card of a trained captioner, from a Jinja template and real evaluation scores.

    Args:
        model: the trained model: a `ShowTellRL` (its config gives the architecture lines of the card) or any
            transformers captioner (the card names its class and loads it with the Auto classes).
        repo_id: the Hub id the card's usage snippet loads (`org/name`).
        scores: the evaluation scores, keys of [`rlcaption.metrics.evaluate_captions`] (`CIDEr`, `Bleu_4`, ...); they
            become both the card's results table and its `model-index` metadata.
        dataset_type / dataset_name / dataset_split: where the scores come from.
        model_summary, training_summary, evaluation_summary, limitations: Markdown paragraphs of the card.
        training_settings: `{setting: value}` rows of the training table.
        objective: the objective that trained it (`"scst"`, `"psst"`, ...); the card cites its paper
            ([`objective_citation`]).
        tags: Hub tags added to the library's own.
        template_path: a Jinja Markdown template with a `{{ card_data }}` front matter (default: the library's).

    Returns:
        `huggingface_hub.ModelCard`; `card.save(folder / "README.md")` or `card.push_to_hub(repo_id)`.
    """
    names = _metric_names(scores)
    card_data = ModelCardData(
        language="en",
        license=license,
        library_name="rlcaption",
        # transformers 5 runs captioners as `image-text-to-text` (with an empty text); it renamed `image-to-text`
        pipeline_tag="image-text-to-text",
        tags=["image-captioning", "reinforcement-learning", "rlcaption", *tags],
        metrics=sorted({metric_type for metric_type, _ in names.values()}),
        model_name=repo_id.split("/")[-1],
        eval_results=caption_eval_results(scores, dataset_type, dataset_name, dataset_split),
    )
    config = model.config
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path),
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        model_summary=model_summary,
        model_class=type(model).__name__,
        # rlcaption's own models reach the Auto classes once the package is imported
        registers_with_import=type(model).__module__.startswith("rlcaption."),
        model_type=config.model_type,
        num_layers=getattr(config, "num_layers", None),
        hidden_size=getattr(config, "hidden_size", None),
        image_attention=getattr(config, "image_attention", False),
        num_parameters=parameter_count(model),
        max_length=model.generation_config.max_length,
        training_summary=training_summary,
        training_settings=dict(training_settings),
        citation=objective_citation(objective),
        evaluation_summary=evaluation_summary,
        dataset_name=dataset_name,
        dataset_split=dataset_split,
        scores={display_name: float(scores[key]) for key, (_, display_name) in names.items()},
        limitations=limitations,
    )
