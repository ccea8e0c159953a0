"""
What every training recipe of `examples/` shares: its command line ([`rlcaption.recipe_arguments`]), the dataset
(images or precomputed features), loading the captioner to start from, building a new `ShowTellRL` on any image
encoder, and the end of a run (test scores, `eval_results.json`, model card, publishing).

A recipe is then only its method: `examples/train_xe.py`, `train_scst.py`, `train_spider.py`, ... each parse
`(their ScriptArguments, their method's config)` with [`parse_recipe_arguments`], load data with
[`load_recipe_dataset`], train with [`RLCaptionTrainer`] and end with [`finish_recipe`]. The demo (`rlcaption demo`)
builds its models with the same [`new_show_tell_rl`] and [`pretrain_on_scenes`].
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import datasets
import numpy as np
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor

from . import auto as _auto  # noqa: F401  (registers our Auto classes, so AutoProcessor finds ours)
from .data import check_dataset_images, load_caption_dataset
from .data.features import read_feature_extractor
from .data.loading import load_saved_dataset
from .hub import check_pretrained_reference, model_loading_kwargs, publish_folder, render_model_card
from .hub.provenance import training_run
from .inference import check_features_match_model
from .metrics.tokenization import normalize_caption
from .models import ShowTellRL, ShowTellRLConfig
from .processing import CaptionProcessor
from .recipe_arguments import (
    RECIPE_OF_OBJECTIVE,
    RecipeArguments,
    check_pretraining_leaves_steps,
    check_the_captioner_gets_steps,
    dataloader_workers_for_images,
    parse_recipe_arguments,
    phase_steps_description,
    resolve_resume_from_checkpoint,
)
from .rewards import reward_reads_images
from .shapes.scene_pretraining import pretrain_image_encoder_on_scenes
from .trainer import RLCaptionConfig, RLCaptionTrainer

__all__ = [
    "RECIPE_OF_OBJECTIVE",
    "RecipeArguments",
    "check_features_match_model",
    "check_pretrained_reference",
    "check_pretraining_leaves_steps",
    "check_the_captioner_gets_steps",
    "dataloader_workers_for_images",
    "dataset_name",
    "finish_recipe",
    "fit_image_columns_to_run",
    "load_features_dataset",
    "load_pretrained_captioner",
    "load_recipe_dataset",
    "new_image_encoder_fields",
    "new_show_tell_rl",
    "parse_recipe_arguments",
    "phase_steps_description",
    "pretrain_on_scenes",
    "recipe_model_card",
    "resolve_resume_from_checkpoint",
    "reward_description",
    "run_reads_images",
    "train_and_finish",
    "vision_model_image_settings",
    "warn_if_most_words_are_unknown",
]


def load_pretrained_captioner(name_or_path: str, **kwargs: Any):
    """
    The captioner a recipe starts from and its processor, by folder or Hub id: a `ShowTellRL` checkpoint of ours or
    any transformers captioner the trainer supports (VisionEncoderDecoder, BLIP, GIT), each with its own processor.

    Returns:
        `(model, processor)`.
    """
    if check_pretrained_reference(
        name_or_path, **{key: kwargs[key] for key in ("revision", "cache_dir", "local_files_only") if key in kwargs}
    ):
        kwargs["local_files_only"] = True  # a cached Hub id while the Hub cannot be reached
    processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    model = AutoModelForImageTextToText.from_pretrained(name_or_path, **model_loading_kwargs(kwargs))
    return model, processor


def load_recipe_dataset(script_args: RecipeArguments):
    """The dataset of `--image_features`, else of `--dataset` (with the shapes options for the shapes dataset)."""
    image_checks = {
        "verify_images": script_args.verify_images,
        "skip_unreadable_images": script_args.skip_unreadable_images,
    }
    if script_args.image_features is not None:
        dataset = load_features_dataset(script_args.image_features)
        if "image" in dataset["train"].column_names and (
            script_args.verify_images or script_args.skip_unreadable_images
        ):
            dataset = check_dataset_images(dataset, script_args.skip_unreadable_images)
        return dataset
    if script_args.dataset != "shapes":
        return load_caption_dataset(script_args.dataset, **image_checks)
    return load_caption_dataset(
        "shapes",
        num_train=script_args.num_train_images,
        num_validation=script_args.num_validation_images,
        num_test=script_args.num_test_images,
        image_size=script_args.image_size,
        seed=script_args.shapes_seed,
    )


def load_features_dataset(folder: str) -> datasets.DatasetDict:
    """The dataset with an `image_features` column in `folder`, or in its `dataset/` (where `rlcaption
    extract-features` writes it; [`rlcaption.data.loading.saved_dataset_folder`], as `rlcaption evaluate --dataset`
    reads it)."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"--image_features {folder}: no such folder. Name an `rlcaption extract-features` output folder or a "
            "dataset saved with save_to_disk."
        )
    dataset = load_saved_dataset(folder)
    if "train" not in dataset or "image_features" not in dataset["train"].column_names:
        raise ValueError(
            f"--image_features {folder}: expected a dataset with a `train` split and an `image_features` column, got "
            f"splits {sorted(dataset)}"
            + (f" with train columns {dataset['train'].column_names}" if "train" in dataset else "")
            + "; extract them with `rlcaption extract-features`."
        )
    return dataset


def dataset_name(script_args: RecipeArguments) -> str:
    """What the run trained on, as its model card names it: the features folder, else `--dataset`."""
    return script_args.image_features or script_args.dataset


def run_reads_images(training_args: RLCaptionConfig) -> bool:
    """Whether the run reads pixels besides what its captioner reads: WTF-RL's reward CLIP, a reward that reads images
    ([`rlcaption.rewards.reward_reads_images`]: `clip_score`, `clip_contrastive`, or one of yours that says so) or the
    evaluator CLIP of `eval_clip`."""
    return (
        training_args.objective == "wtf"
        or training_args.eval_clip is not None
        or any(reward_reads_images(reward) for reward in training_args.reward_funcs or [])
    )


def fit_image_columns_to_run(model, dataset, training_args: RLCaptionConfig):
    """
    The dataset with the image columns the run reads. A captioner of precomputed features needs `image_features`, a
    captioner of pixels an `image` or `pixel_values` column. Beside features, an `image` column is kept for a run whose
    CLIP reads pixels ([`run_reads_images`]) and dropped otherwise, so that no image file is decoded at every step;
    where it is kept, the training images stay undecoded until a reward asks for one (the CLIP rewards embed each
    training image once and keep its embedding), and evaluation splits are decoded as they are read.

    Raises:
        `ValueError`: the captioner's input, or the images a CLIP reads, are not in the dataset; the message says how
            to get them.
    """
    columns = dataset["train"].column_names
    reads_features = getattr(model.config, "encoder_type", None) == "features" or (
        # a policy-value or speaker-listener captioner: its policy or speaker reads the images
        any(getattr(getattr(model.config, name, None), "encoder_type", None) == "features"
            for name in ("policy_config", "speaker_config"))
    )  # fmt: skip
    has_features = "image_features" in columns
    if reads_features and not has_features:
        raise ValueError(
            "The captioner reads precomputed image features (encoder_type='features'), but the dataset has none "
            f"(train columns {columns}): pass them with --image_features <folder>."
        )
    if not reads_features and not any(column in columns for column in ("image", "pixel_values")):
        raise ValueError(
            f"The captioner reads images, but the dataset has none (train columns {columns}): train on --dataset with "
            "images, or start from a captioner of these features (train_xe.py --image_features <folder>)."
        )
    if not has_features:
        return dataset
    if run_reads_images(training_args):
        missing = [name for name, split in dataset.items() if "image" not in split.column_names]
        if missing:
            raise ValueError(
                f"This run scores captions with a CLIP (objective {training_args.objective!r}, rewards "
                f"{training_args.reward_funcs}, eval_clip {training_args.eval_clip!r}), which reads images, not "
                f"precomputed features; the {missing} split(s) of the features dataset have no `image` column. Keep "
                "the images beside the features: `rlcaption extract-features` keeps the `image` column, and region "
                "features keep it with `add_region_features(load_karpathy(json_path, images_root), regions, "
                "keep_images=True)`."
            )
        return datasets.DatasetDict(
            {**dataset, "train": dataset["train"].cast_column("image", datasets.Image(decode=False))}
        )
    return datasets.DatasetDict(
        {name: split.remove_columns([column for column in ("image",) if column in split.column_names])
         for name, split in dataset.items()}
    )  # fmt: skip


def vision_model_image_settings(vision_model: str) -> dict[str, Any]:
    """The `image_size`, `image_mean` and `image_std` of a [`CaptionProcessor`] for the pretrained vision model
    `vision_model` (hub id or folder), read from its image processor: the images it was trained on."""
    local_files_only = check_pretrained_reference(vision_model, option="--vision_model")
    try:
        image_processor = AutoImageProcessor.from_pretrained(vision_model, local_files_only=local_files_only)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"--vision_model {vision_model}: its image processor (preprocessor_config.json) says what size and "
            f"normalisation its images need, and it cannot be loaded: {error}"
        ) from error
    crop_size = (
        getattr(image_processor, "crop_size", None) if getattr(image_processor, "do_center_crop", False) else None
    )
    size = crop_size or image_processor.size
    side = size.get("height") or size.get("shortest_edge")
    mean, std = image_processor.image_mean, image_processor.image_std
    return {
        "image_size": int(side),
        "image_mean": tuple(mean) if isinstance(mean, Sequence) else (float(mean),) * 3,
        "image_std": tuple(std) if isinstance(std, Sequence) else (float(std),) * 3,
    }


# Above this share of reference words mapped to <unk>, captions decode mostly to "" and every metric is near 0.
_MOSTLY_UNKNOWN = 0.5


def warn_if_most_words_are_unknown(processor: CaptionProcessor, captions: Sequence[str], min_word_count: int) -> float:
    """
    Warns when the vocabulary of `processor` leaves most words of the training `captions` `<unk>` (a `min_word_count`
    too high for a small dataset): the captioner would learn to say little but `<unk>`, which decodes to "".

    Returns:
        The share of the captions' words that are `<unk>`.
    """
    vocabulary = processor.tokenizer.get_vocab()
    words = [word for caption in captions for word in normalize_caption(caption).split()]
    unknown = sum(word not in vocabulary for word in words) / max(len(words), 1)
    if unknown > _MOSTLY_UNKNOWN:
        warnings.warn(
            f"The vocabulary (words of at least {min_word_count} training captions, {len(vocabulary)} tokens) leaves "
            f"{unknown:.0%} of the training captions' words <unk>, which decodes to an empty caption: every score "
            "would be near 0. Lower --min_word_count (1 keeps every word).",
            stacklevel=2,
        )
    return unknown


def new_image_encoder_fields(
    image_features: str | None = None,
    vision_model: str | None = None,
    train_vision_model: bool = False,
    cnn_channels: Sequence[int] | None = None,
) -> dict[str, Any]:
    """
    The config fields of a new image encoder, as a captioner's or an embedding's config names them: precomputed
    features of the dataset in `image_features` (their width, and `grid` for grids and regions, read from its first
    row, and the extractor its manifest records, [`rlcaption.data.features.read_feature_extractor`]), the pretrained
    vision model `vision_model` (fixed unless `train_vision_model`), or a CNN of `cnn_channels`.
    """
    if image_features is not None:
        first_row = np.asarray(load_features_dataset(image_features)["train"][0]["image_features"])
        layout = "pooled" if first_row.ndim == 1 else "grid"
        fields = {"encoder_type": "features", "image_feature_size": first_row.shape[-1]}
        fields["image_feature_layout"] = layout
        extractor = read_feature_extractor(image_features)
        # the backbone that made the features, so that the captioner can caption photos (region features have none)
        return fields if extractor is None else {**fields, "image_feature_extractor": extractor}
    if vision_model is not None:
        check_pretrained_reference(vision_model, option="--vision_model")
        return {"encoder_type": "backbone", "backbone": vision_model, "freeze_backbone": not train_vision_model}
    return {"encoder_type": "cnn", "cnn_channels": list(cnn_channels)}


def new_show_tell_rl(
    processor: CaptionProcessor,
    image_size: int,
    cnn_channels: Sequence[int],
    hidden_size: int,
    image_attention: bool = True,
    dropout: float = 0.2,
    max_caption_length: int = 20,
    image_encoder: Mapping[str, Any] | None = None,
) -> ShowTellRL:
    """
    A randomly initialised `ShowTellRL` over the vocabulary of `processor`, with a CNN encoder of `cnn_channels`, or
    the encoder of `image_encoder` ([`new_image_encoder_fields`]: a pretrained vision model, precomputed features).
    `image_attention` attends over the encoder's grid where it has one (pooled features have none).
    """
    tokenizer = processor.tokenizer
    image_encoder = dict(image_encoder or {"encoder_type": "cnn", "cnn_channels": list(cnn_channels)})
    if image_encoder.get("image_feature_layout") == "pooled":
        image_attention = False
    config = ShowTellRLConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        word_embedding_size=hidden_size,
        image_size=image_size,
        **image_encoder,
        image_attention=image_attention,
        dropout=dropout,
        max_caption_length=max_caption_length,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return ShowTellRL(config)


def pretrain_on_scenes(
    model: ShowTellRL, processor, train_split, num_steps: int, freeze: bool, seed: int = 0
) -> dict[str, float] | None:
    """
    Pretrains `model`'s CNN encoder on the scene annotations of `train_split` (when it has them and `num_steps` > 0),
    then freezes it when `freeze`, which the saved config remembers.

    Returns:
        The encoder's cell accuracies, or `None` when there was nothing to pretrain on.
    """
    if num_steps <= 0 or "scene" not in train_split.column_names:
        return None
    accuracies = pretrain_image_encoder_on_scenes(model.image_encoder, processor, train_split, num_steps, seed=seed)
    model.freeze_image_encoder(freeze)
    return accuracies


def reward_description(training_args: RLCaptionConfig, names: Sequence[str] | None = None) -> str:
    """
    The reward of a run as a card states it: `1·cider + 0.5·bleu`; `names` for rewards the recipe built itself
    (default: `training_args.reward_funcs`), weighted by `training_args.reward_weights`.
    """
    names = list(training_args.reward_funcs if names is None else names)
    weights = training_args.reward_weights or [1.0] * len(names)
    return " + ".join(f"{weight:g}·{name}" for name, weight in zip(names, weights, strict=True))


def recipe_model_card(
    model,
    training_args: RLCaptionConfig,
    script_args: RecipeArguments,
    scores: Mapping[str, float],
    num_test_images: int,
    model_summary: str,
    recipe: str,
    training_settings: Mapping[str, object],
    tags: Sequence[str] = (),
    optimizer_steps: str | None = None,
):
    """
    The model card of a recipe's output folder: the method's own summary and settings, and what every recipe says
    alike (how the test split was decoded and scored, the dataset's limitations). `optimizer_steps` says the steps
    each phase of the run took ([`phase_steps_description`]).
    """
    # the id the card's snippets load: the Hub repo it is published to, else the folder it was saved in
    repo_id = training_args.hub_model_id or (
        os.path.basename(os.path.normpath(training_args.output_dir))
        if training_args.push_to_hub
        else training_args.output_dir
    )
    beams = training_args.eval_num_beams
    decoding = "Greedy decoding" if beams == 1 else f"Beam search ({beams} beams)"
    card = render_model_card(
        model,
        repo_id=repo_id,
        scores=scores,
        dataset_type=dataset_name(script_args),
        dataset_name=dataset_name(script_args),
        model_summary=model_summary,
        training_summary=f"Trained with `examples/{recipe}` of rlcaption (`RLCaptionTrainer`).",
        training_settings={
            **training_settings,
            **({"optimizer steps": optimizer_steps} if optimizer_steps else {}),
            "batch size": training_args.per_device_train_batch_size,
            "max caption length": training_args.max_caption_length,
            "seed": training_args.seed,
            "run": training_run(),
        },
        evaluation_summary=(
            f"{decoding}, at most {training_args.max_caption_length} tokens, on the {num_test_images} images of the "
            f"`{dataset_name(script_args)}` test split, scored by `RLCaptionTrainer.evaluate` with rlcaption's "
            "metrics (equal to the COCO caption evaluation code's; CIDEr-D document frequencies from the test "
            "references)"
            + (", the scene grounding metrics" if dataset_name(script_args) == "shapes" else "")
            + (f" and the evaluator CLIP `{training_args.eval_clip}`" if training_args.eval_clip else "")
            + "."
        ),
        limitations=(
            "Trained on synthetic scenes of coloured shapes (rlcaption's embedded `shapes` dataset): it describes "
            "such images and nothing else. It shows the method and the library end to end; it is not a "
            "general-purpose captioner."
            if dataset_name(script_args) == "shapes"
            else "Inherits the biases of its training captions."
        ),
        objective=training_args.objective,
        tags=tags,
    )
    if training_args.use_peft:
        _describe_lora_adapter(card, repo_id, script_args.model_name_or_path)
    return card


def _describe_lora_adapter(card, repo_id: str, base_model: str) -> None:
    """With `--use_peft` the folder holds LoRA adapters: the card names their base model (the Hub's `base_model`) and
    says how to load them."""
    card.data.base_model = base_model
    card.data.library_name = "peft"
    card.data.tags = [*(card.data.tags or []), "lora"]
    card.text += (
        f"\n\n## LoRA adapters\n\nThis folder holds LoRA adapters (peft) of `{base_model}`, not whole weights. "
        "Load them on their base model:\n\n```python\nfrom peft import PeftModel\n"
        "from transformers import AutoModelForImageTextToText\n\n"
        f'base = AutoModelForImageTextToText.from_pretrained("{base_model}")\n'
        f'model = PeftModel.from_pretrained(base, "{repo_id}")\n```\n'
    )


def _score_split(
    trainer, split, name: str, extra_scores: Callable[[Any], Mapping[str, float]] | None
) -> dict[str, float]:
    """`trainer.evaluate` of one split on every process, without the split's prefix, with the method's
    `extra_scores` added and printed on the main process."""
    metrics = trainer.evaluate(split, metric_key_prefix=name)
    scores = {key.removeprefix(f"{name}_"): value for key, value in metrics.items()}
    if trainer.is_world_process_zero():
        if extra_scores is not None:
            scores.update(extra_scores(split))
        print(f"{name} scores:", {key: round(value, 4) for key, value in scores.items()})
    return scores


def finish_recipe(
    trainer,
    processor,
    dataset,
    script_args: RecipeArguments,
    model_card: Callable[[Mapping[str, float], int], Any],
    extra_scores: Callable[[Any], Mapping[str, float]] | None = None,
) -> dict[str, float] | None:
    """
    The end of every recipe: saves the model and its processor to `--output_dir`, scores the test split on every
    process with `trainer.evaluate` (its `eval_metrics`, `eval_num_beams` and `eval_clip`), prints the scores, writes
    `eval_results.json` and the model card `README.md` (`model_card(scores, num_test_images)`), and publishes the
    folder with `--push_to_hub`. `extra_scores(split)`, run on the main process, adds a method's own scores (e.g. a
    listener's recall). With `--score_validation`, the validation split is scored the same way first and written
    beside the test scores. Every process returns together, with the process group closed.

    Returns:
        The test scores without their `test_` prefix, or `None` when the dataset has no test split.

    Raises:
        `RuntimeError`: publishing failed; the saved folder is intact and the message says how to publish it later.
    """
    args = trainer.args
    trainer.save_model(args.output_dir)
    if trainer.is_world_process_zero():
        processor.save_pretrained(args.output_dir)
    scores = None
    if "test" in dataset:
        splits = ["validation", "test"] if script_args.score_validation and "validation" in dataset else ["test"]
        results = {split: _score_split(trainer, dataset[split], split, extra_scores) for split in splits}
        scores = results["test"]
        if trainer.is_world_process_zero():
            with open(os.path.join(args.output_dir, "eval_results.json"), "w", encoding="utf-8") as handle:
                # a ratio with nothing to count (nan) is written as null: strict JSON has no NaN
                json.dump(
                    {
                        split: {name: None if value != value else value for name, value in split_scores.items()}
                        for split, split_scores in results.items()
                    },
                    handle,
                    indent=2,
                )
            card = model_card(scores, dataset["test"].num_rows)
            card.save(os.path.join(args.output_dir, "README.md"))
    if args.push_to_hub and trainer.is_world_process_zero():
        repo_id = args.hub_model_id or os.path.basename(os.path.normpath(args.output_dir))
        print(publish_folder(args.output_dir, repo_id, token=args.hub_token))
    # every process waits for the main one's scores, card and upload, then leaves the process group: a process that
    # exits while a peer still holds the group open is aborted by gloo ("terminate called without an active exception")
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return scores


def train_and_finish(
    model,
    processor,
    dataset,
    script_args: RecipeArguments,
    training_args: RLCaptionConfig,
    model_card: Callable[..., Any],
    extra_scores: Callable[[Any], Mapping[str, float]] | None = None,
    reward_funcs: Sequence[Any] | None = None,
) -> RLCaptionTrainer:
    """
    The body of a recipe once its model is built: trains `model` on the train split with [`RLCaptionTrainer`]
    (validation split for the evaluations during training, resuming as `training_args.resume_from_checkpoint` says),
    then [`finish_recipe`] with the card `model_card(model, training_args, script_args, scores, num_test_images)` and
    the method's `extra_scores`. `reward_funcs` (built rewards or names) replace `training_args.reward_funcs`. The
    dataset's image columns are first fitted to the run ([`fit_image_columns_to_run`]), and a run whose steps would
    all go to pretraining phases is refused before training ([`check_the_captioner_gets_steps`]).
    """
    check_features_match_model(model, dataset, script_args.image_features)
    dataset = fit_image_columns_to_run(model, dataset, training_args)
    trainer = RLCaptionTrainer(
        model=model,
        args=training_args,
        processing_class=processor,
        train_dataset=dataset["train"],
        eval_dataset=dataset.get("validation"),
        reward_funcs=reward_funcs,
    )
    check_the_captioner_gets_steps(trainer, script_args)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    def card(scores: Mapping[str, float], num_test_images: int):
        steps = phase_steps_description(trainer)
        return model_card(model, training_args, script_args, scores, num_test_images, optimizer_steps=steps)

    finish_recipe(trainer, processor, dataset, script_args, card, extra_scores)
    return trainer
