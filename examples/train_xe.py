"""
Teacher-forcing (XE) training of a ShowTellRL captioner: the warm start of every RL recipe.

    accelerate launch examples/train_xe.py --output_dir runs/xe --use_cpu

The defaults are those of the published warm start `checkpoints/show-tell-rl-shapes-xe` on the embedded shapes
dataset: a CNN image encoder pretrained on the scene annotations (`--scene_pretraining_steps`) and then kept fixed, a
256-unit LSTM that attends over the encoder's 3x3 feature grid, 6 epochs at learning rate 2e-3. The test split is
scored at the end (greedy decoding: CIDEr-D, BLEU-4, ROUGE-L, scene grounding), the scores are printed, and the output
folder gets the model, its processor, a model card and `eval_results.json`.

The image encoder is the CNN by default, or

- a pretrained `transformers` vision model, `--vision_model <hub id or folder>` (ViT, ResNet, CLIP vision, ...), fixed
  unless `--train_vision_model`; images are sized and normalised as its image processor says, and the LSTM attends
  over its patches or feature map;
- precomputed features, `--image_features <folder>` (an `rlcaption extract-features` output folder, or region
  features joined with `rlcaption.data.add_region_features` and saved with `save_to_disk`), which replaces
  `--dataset`: pooled vectors are read once, before `<bos>`; grids and regions (their count may vary) are attended
  over, as the bottom-up features of most RL captioning papers are:

    accelerate launch examples/train_xe.py --output_dir runs/xe-coco --image_features features/coco-bottom-up \
        --hidden_size 512 --learning_rate 5e-4 --num_train_epochs 30

Every RL recipe then starts from the output folder (`--model_name_or_path runs/xe-coco`) with the same
`--image_features`. The vocabulary keeps the training words seen at least `--min_word_count` times: 5 on any dataset
but the shapes one (Karpathy's COCO preprocessing, about 9.5k words), 1 on shapes (its every word is frequent).

`--dataset` also takes a folder written by `save_to_disk` (see `rlcaption.data.load_karpathy`) or a Hub dataset id
(no scene pretraining there); `accelerate launch --multi_gpu --num_processes 2` runs two processes; a run whose
`--output_dir` holds a complete checkpoint resumes from it (`--overwrite_output_dir` starts again,
`--resume_from_checkpoint <folder>` picks one); `--push_to_hub --hub_model_id org/name` publishes the folder.
"""

import functools
from dataclasses import dataclass, field

from rlcaption.processing import CaptionProcessor, image_processor_of_extractor
from rlcaption.recipes import (
    RecipeArguments,
    dataset_name,
    load_recipe_dataset,
    new_image_encoder_fields,
    new_show_tell_rl,
    parse_recipe_arguments,
    pretrain_on_scenes,
    recipe_model_card,
    train_and_finish,
    vision_model_image_settings,
    warn_if_most_words_are_unknown,
)

# The recipe's own defaults: the Trainer's 5e-5 is far too low for a captioner trained from scratch; the published
# warm start is scored with greedy decoding.
RECIPE_DEFAULTS = {
    "objective": "xe",
    "learning_rate": 2e-3,
    "num_train_epochs": 6.0,
    "per_device_train_batch_size": 32,
    "eval_num_beams": 1,
    "eval_metrics": ["cider", "bleu", "rouge_l"],
}


# Karpathy's COCO preprocessing keeps the words of at least 5 training captions; every shapes word is frequent.
DEFAULT_MIN_WORD_COUNT = 5
SHAPES_MIN_WORD_COUNT = 1


@dataclass
class ScriptArguments(RecipeArguments):
    min_word_count: int | None = field(
        default=None,
        metadata={
            "help": "Words rarer than this in training captions -> <unk>. Default: 5 (Karpathy's COCO preprocessing, "
            "about 9.5k words on COCO), 1 on the shapes dataset."
        },
    )
    cnn_channels: list[int] = field(
        default_factory=lambda: [32, 64, 64, 64],
        metadata={"help": "CNN encoder channels; four blocks at 48 px give the 3x3 grid scene pretraining needs."},
    )
    vision_model: str | None = field(
        default=None,
        metadata={
            "help": "Instead of the CNN, this pretrained transformers vision model (hub id or local folder: ViT, "
            "ResNet, CLIP vision, ...): images sized and normalised as its image processor says, attention over its "
            "patches or feature map."
        },
    )
    train_vision_model: bool = field(
        default=False, metadata={"help": "Fine-tune --vision_model with the captioner instead of keeping it fixed."}
    )
    hidden_size: int = field(default=256, metadata={"help": "LSTM hidden size (512 in the papers)."})
    image_attention: bool = field(
        default=True,
        metadata={
            "help": "Attend over the image grid at every step: the CNN's grid, a vision model's patches, grid or "
            "region features (pooled features have none, and are read once)."
        },
    )
    dropout: float = field(default=0.2, metadata={"help": "Dropout before the word classifier."})
    scene_pretraining_steps: int = field(
        default=400, metadata={"help": "Steps of CNN encoder pretraining on the scene annotations (0: none)."}
    )
    freeze_image_encoder: bool = field(
        default=True,
        metadata={"help": "Keep the pretrained CNN encoder fixed during XE and every later training."},
    )

    def __post_init__(self):
        if self.vision_model is not None and self.image_features is not None:
            raise ValueError(
                "--vision_model reads images and --image_features reads features extracted before: pass one of them."
            )
        if self.train_vision_model and self.vision_model is None:
            raise ValueError("--train_vision_model fine-tunes --vision_model: pass --vision_model too.")
        if self.min_word_count is None:
            uses_shapes = self.dataset == "shapes" and self.image_features is None
            self.min_word_count = SHAPES_MIN_WORD_COUNT if uses_shapes else DEFAULT_MIN_WORD_COUNT


def _pretrains_on_scenes(script_args, model, train_split) -> bool:
    return (
        model.config.encoder_type == "cnn"
        and script_args.scene_pretraining_steps > 0
        and "scene" in train_split.column_names
    )


def _encoder_description(model, script_args, pretrained, accuracies) -> str:
    """What the model card says of the image encoder."""
    config = model.config
    if config.encoder_type == "features":
        kind = "pooled" if config.image_feature_layout == "pooled" else "grid or region"
        return f"precomputed {kind} features of width {config.image_feature_size} (`{script_args.image_features}`)"
    if config.encoder_type == "backbone":
        state = "fixed" if config.freeze_backbone else "fine-tuned"
        return f"the {state} pretrained vision model `{config.backbone}` at {script_args.image_size} px"
    encoder = f"CNN {script_args.cnn_channels} at {script_args.image_size} px"
    if pretrained:
        encoder += f", pretrained {script_args.scene_pretraining_steps} steps on the scene annotations"
        if accuracies:  # known unless the run was resumed
            encoder += (
                f" (cell accuracy: shape {accuracies['shape_accuracy']:.3f}, colour "
                f"{accuracies['color_accuracy']:.3f})"
            )
        encoder += ", then fixed" if script_args.freeze_image_encoder else ""
    return encoder


def _model_card(
    model, training_args, script_args, scores, num_test_images, pretrained, accuracies, optimizer_steps=None
):
    repo_id = training_args.hub_model_id or training_args.output_dir
    return recipe_model_card(
        model, training_args, script_args, scores, num_test_images,
        model_summary=(
            "An image captioner trained by teacher forcing on the "
            f"`{dataset_name(script_args)}` dataset: the warm start "
            "that rlcaption's RL recipes (`train_scst.py`, `train_spider.py`, ...) start from with "
            f"`--model_name_or_path {repo_id}`."
        ),
        recipe="train_xe.py",
        training_settings={
            "objective": "`xe` (teacher forcing on all five references)",
            "image encoder": _encoder_description(model, script_args, pretrained, accuracies),
            "decoder": f"LSTM {script_args.hidden_size}"
            + (", attention over the grid" if model.config.image_attention else ""),
            "vocabulary": f"{model.config.vocab_size} tokens (words of at least {script_args.min_word_count} "
            "training captions)",
            "epochs": f"{training_args.num_train_epochs:g}",
            "learning rate": f"{training_args.learning_rate:g}",
        },
        tags=["show-tell-rl", "xe"],
        optimizer_steps=optimizer_steps,
    )  # fmt: skip


def main(argv=None):
    script_args, training_args = parse_recipe_arguments(ScriptArguments, RECIPE_DEFAULTS, argv)
    dataset = load_recipe_dataset(script_args)
    train_captions = [caption for captions in dataset["train"]["captions"] for caption in captions]
    image_settings = {"image_size": script_args.image_size}
    if script_args.vision_model is not None:
        image_settings = vision_model_image_settings(script_args.vision_model)
        script_args.image_size = image_settings["image_size"]  # the model card states it
    processor = CaptionProcessor.from_captions(train_captions, min_count=script_args.min_word_count, **image_settings)
    warn_if_most_words_are_unknown(processor, train_captions, script_args.min_word_count)
    image_encoder = new_image_encoder_fields(
        script_args.image_features, script_args.vision_model, script_args.train_vision_model, script_args.cnn_channels
    )
    if "image_feature_extractor" in image_encoder:
        # photos reach a captioner of features as the pixels of the backbone that extracted them, which it runs
        processor.image_processor = image_processor_of_extractor(image_encoder["image_feature_extractor"])
    model = new_show_tell_rl(
        processor, script_args.image_size, script_args.cnn_channels, script_args.hidden_size,
        image_attention=script_args.image_attention, dropout=script_args.dropout,
        max_caption_length=training_args.max_caption_length, image_encoder=image_encoder,
    )  # fmt: skip
    pretrained, accuracies = _pretrains_on_scenes(script_args, model, dataset["train"]), None
    if not training_args.resume_from_checkpoint:
        if pretrained:
            accuracies = pretrain_on_scenes(
                model, processor, dataset["train"], script_args.scene_pretraining_steps,
                freeze=script_args.freeze_image_encoder, seed=training_args.seed,
            )  # fmt: skip
            print("scene pretraining of the image encoder:", {name: round(v, 4) for name, v in accuracies.items()})
    elif pretrained:
        # the checkpoint holds the pretrained encoder; it must be frozen as it was, before the optimizer is built
        model.freeze_image_encoder(script_args.freeze_image_encoder)

    model_card = functools.partial(_model_card, pretrained=pretrained, accuracies=accuracies)
    train_and_finish(model, processor, dataset, script_args, training_args, model_card)


if __name__ == "__main__":
    main()
