"""
Teacher-forcing (XE) training of a ShowTellRL captioner: the warm start of every RL recipe.

    accelerate launch examples/train_xe.py --output_dir runs/xe --use_cpu

The defaults are those of the published warm start `checkpoints/show-tell-rl-shapes-xe` on the embedded shapes
dataset: a CNN image encoder pretrained on the scene annotations (`--scene_pretraining_steps`) and then kept fixed, a
256-unit LSTM that attends over the encoder's 3x3 feature grid, 6 epochs at learning rate 2e-3. The test split is
scored at the end (greedy decoding: CIDEr-D, BLEU-4, ROUGE-L, scene grounding), the scores are printed, and the output
folder gets the model, its processor, a model card and `eval_results.json`.

`--dataset` also takes a folder written by `save_to_disk` (see `rlcaption.data.load_karpathy`) or a Hub dataset id
(no scene pretraining there); `accelerate launch --multi_gpu --num_processes 2` runs two processes; a run whose
`--output_dir` holds a complete checkpoint resumes from it (`--overwrite_output_dir` starts again,
`--resume_from_checkpoint <folder>` picks one); `--push_to_hub --hub_model_id org/name` publishes the folder.
"""

import functools
from dataclasses import dataclass, field

from rlcaption.processing import CaptionProcessor
from rlcaption.recipes import (
    RecipeArguments,
    load_recipe_dataset,
    new_show_tell_rl,
    parse_recipe_arguments,
    pretrain_on_scenes,
    recipe_model_card,
    train_and_finish,
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


@dataclass
class ScriptArguments(RecipeArguments):
    min_word_count: int = field(default=1, metadata={"help": "Words rarer than this in training captions -> <unk>."})
    cnn_channels: list[int] = field(
        default_factory=lambda: [32, 64, 64, 64],
        metadata={"help": "CNN encoder channels; four blocks at 48 px give the 3x3 grid scene pretraining needs."},
    )
    hidden_size: int = field(default=256, metadata={"help": "LSTM hidden size (512 in the papers)."})
    image_attention: bool = field(default=True, metadata={"help": "Attend over the image grid at every step."})
    dropout: float = field(default=0.2, metadata={"help": "Dropout before the word classifier."})
    scene_pretraining_steps: int = field(
        default=400, metadata={"help": "Steps of encoder pretraining on the scene annotations (0: none)."}
    )
    freeze_image_encoder: bool = field(
        default=True, metadata={"help": "Keep the pretrained encoder fixed during XE and every later training."}
    )


def _pretrains_on_scenes(script_args, train_split) -> bool:
    return script_args.scene_pretraining_steps > 0 and "scene" in train_split.column_names


def _model_card(
    model, training_args, script_args, scores, num_test_images, pretrained, accuracies, optimizer_steps=None
):
    encoder = f"CNN {script_args.cnn_channels} at {script_args.image_size} px"
    if pretrained:
        encoder += f", pretrained {script_args.scene_pretraining_steps} steps on the scene annotations"
        if accuracies:  # known unless the run was resumed
            encoder += (
                f" (cell accuracy: shape {accuracies['shape_accuracy']:.3f}, colour "
                f"{accuracies['color_accuracy']:.3f})"
            )
        encoder += ", then fixed" if script_args.freeze_image_encoder else ""
    repo_id = training_args.hub_model_id or training_args.output_dir
    return recipe_model_card(
        model, training_args, script_args, scores, num_test_images,
        model_summary=(
            f"An image captioner trained by teacher forcing on the `{script_args.dataset}` dataset: the warm start "
            "that rlcaption's RL recipes (`train_scst.py`, `train_spider.py`, ...) start from with "
            f"`--model_name_or_path {repo_id}`."
        ),
        recipe="train_xe.py",
        training_settings={
            "objective": "`xe` (teacher forcing on all five references)",
            "image encoder": encoder,
            "decoder": f"LSTM {script_args.hidden_size}"
            + (", attention over the grid" if script_args.image_attention else ""),
            "epochs": f"{training_args.num_train_epochs:g}",
            "learning rate": f"{training_args.learning_rate:g}",
        },
        tags=["show-tell-rl", "xe"],
        optimizer_steps=optimizer_steps,
    )  # fmt: skip


def main(argv=None):
    script_args, training_args = parse_recipe_arguments(ScriptArguments, RECIPE_DEFAULTS, argv)
    if training_args.objective != "xe":
        raise ValueError(
            f"train_xe.py trains by teacher forcing; --objective {training_args.objective} belongs to another recipe "
            "(train_scst.py, train_spider.py, ...)."
        )
    dataset = load_recipe_dataset(script_args)
    train_captions = [caption for captions in dataset["train"]["captions"] for caption in captions]
    processor = CaptionProcessor.from_captions(
        train_captions, min_count=script_args.min_word_count, image_size=script_args.image_size
    )
    model = new_show_tell_rl(
        processor, script_args.image_size, script_args.cnn_channels, script_args.hidden_size,
        image_attention=script_args.image_attention, dropout=script_args.dropout,
        max_caption_length=training_args.max_caption_length,
    )  # fmt: skip
    pretrained, accuracies = _pretrains_on_scenes(script_args, dataset["train"]), None
    if not training_args.resume_from_checkpoint:
        accuracies = pretrain_on_scenes(
            model, processor, dataset["train"], script_args.scene_pretraining_steps,
            freeze=script_args.freeze_image_encoder, seed=training_args.seed,
        )  # fmt: skip
        if accuracies:
            print("scene pretraining of the image encoder:", {name: round(v, 4) for name, v in accuracies.items()})
    elif pretrained:
        # the checkpoint holds the pretrained encoder; it must be frozen as it was, before the optimizer is built
        model.freeze_image_encoder(script_args.freeze_image_encoder)

    model_card = functools.partial(_model_card, pretrained=pretrained, accuracies=accuracies)
    train_and_finish(model, processor, dataset, script_args, training_args, model_card)


if __name__ == "__main__":
    main()
