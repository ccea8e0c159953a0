"""
Teacher-forcing (XE) training of a ShowTellRL captioner: the warm start of every RL recipe.

    accelerate launch examples/train_xe.py --output_dir runs/xe --use_cpu

The defaults are those of the published warm start `checkpoints/show-tell-rl-shapes-xe` on the embedded shapes
dataset: a CNN image encoder pretrained on the scene annotations (`--scene_pretraining_steps`) and then kept fixed, a
256-unit LSTM that attends over the encoder's 3x3 feature grid, 6 epochs at learning rate 2e-3. The test split is
scored at the end (CIDEr-D, BLEU-4, scene grounding), and the output folder gets the model, its processor, a model
card and `eval_results.json`. `--dataset` also takes a folder written by `save_to_disk` (see
`rlcaption.data.load_karpathy`) or a Hub dataset id (no scene pretraining there); `accelerate launch --multi_gpu
--num_processes 2` runs two processes; `--push_to_hub --hub_model_id org/name` publishes the folder.
"""

import json
import os
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from rlcaption.data import load_caption_dataset
from rlcaption.evaluation import evaluate_model
from rlcaption.hub import publish_folder, render_model_card
from rlcaption.models import ShowTellRL, ShowTellRLConfig
from rlcaption.processing import CaptionProcessor
from rlcaption.scene_pretraining import pretrain_image_encoder_on_scenes
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer


@dataclass
class ScriptArguments:
    dataset: str = field(default="shapes", metadata={"help": "`shapes`, a save_to_disk folder or a Hub dataset id."})
    num_train_images: int = field(default=4000, metadata={"help": "Training images of the shapes dataset."})
    num_validation_images: int = field(default=200, metadata={"help": "Validation images of the shapes dataset."})
    num_test_images: int = field(default=500, metadata={"help": "Test images of the shapes dataset."})
    min_word_count: int = field(default=1, metadata={"help": "Words rarer than this in training captions -> <unk>."})
    image_size: int = field(default=48, metadata={"help": "Side of the square input images, in pixels."})
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
    test_metrics: list[str] = field(
        default_factory=lambda: ["cider", "bleu", "rouge_l"],
        metadata={"help": "Metrics scored on the test split (greedy decoding) and written to the model card."},
    )


def _model_card(model, training_args, script_args, scores, num_test_images, pretraining):
    repo_id = training_args.hub_model_id or os.path.basename(os.path.normpath(training_args.output_dir))
    settings = {
        "objective": "`xe` (teacher forcing on all five references)",
        "image encoder": f"CNN {script_args.cnn_channels} at {script_args.image_size} px"
        + (
            f", pretrained {script_args.scene_pretraining_steps} steps on the scene annotations"
            f" (cell accuracy: shape {pretraining['shape_accuracy']:.3f}, colour {pretraining['color_accuracy']:.3f})"
            if pretraining
            else ""
        )
        + (", then fixed" if script_args.freeze_image_encoder else ""),
        "decoder": f"LSTM {script_args.hidden_size}"
        + (", attention over the grid" if script_args.image_attention else ""),
        "epochs": f"{training_args.num_train_epochs:g}",
        "learning rate": f"{training_args.learning_rate:g}",
        "batch size": training_args.per_device_train_batch_size,
        "seed": training_args.seed,
    }
    return render_model_card(
        model,
        repo_id=repo_id,
        scores=scores,
        dataset_type=script_args.dataset,
        dataset_name=script_args.dataset,
        model_summary=(
            f"An image captioner trained by teacher forcing on the `{script_args.dataset}` dataset: the warm start "
            "that rlcaption's RL recipes (`train_scst.py`, `train_spider.py`, ...) start from with "
            f"`--model_name_or_path {repo_id}`."
        ),
        training_summary="Trained with `examples/train_xe.py` of rlcaption.",
        training_settings=settings,
        evaluation_summary=(
            f"Greedy decoding on the {num_test_images} images of the `{script_args.dataset}` test split, scored with "
            "rlcaption's metrics (equal to the COCO caption evaluation code's; CIDEr-D document frequencies from the "
            "test references) and, where the dataset has scenes, with the scene grounding metrics."
        ),
        limitations=(
            "Trained on synthetic scenes of coloured shapes (rlcaption's embedded `shapes` dataset): it describes "
            "such "
            'images and nothing else. Its relations ("left of", "above") are no better than chance.'
            if script_args.dataset == "shapes"
            else "Inherits the biases of its training captions."
        ),
        tags=["show-tell-rl", "xe", "image-to-text"],
    )


def main():
    parser = HfArgumentParser((ScriptArguments, RLCaptionConfig))
    # the recipe's own defaults: the Trainer's 5e-5 is far too low for a captioner trained from scratch
    parser.set_defaults(objective="xe", learning_rate=2e-3, num_train_epochs=6.0, per_device_train_batch_size=32)
    script_args, training_args = parser.parse_args_into_dataclasses()
    if training_args.objective != "xe":
        raise ValueError(f"This recipe trains by teacher forcing; --objective {training_args.objective} is not xe.")

    shapes_options = (
        {
            "num_train": script_args.num_train_images,
            "num_validation": script_args.num_validation_images,
            "num_test": script_args.num_test_images,
            "image_size": script_args.image_size,
        }
        if script_args.dataset == "shapes"
        else {}
    )
    dataset = load_caption_dataset(script_args.dataset, **shapes_options)
    train_captions = [caption for captions in dataset["train"]["captions"] for caption in captions]
    processor = CaptionProcessor.from_captions(
        train_captions, min_count=script_args.min_word_count, image_size=script_args.image_size
    )
    tokenizer = processor.tokenizer
    config = ShowTellRLConfig(
        vocab_size=len(tokenizer),
        hidden_size=script_args.hidden_size,
        word_embedding_size=script_args.hidden_size,
        encoder_type="cnn",
        image_size=script_args.image_size,
        cnn_channels=script_args.cnn_channels,
        image_attention=script_args.image_attention,
        dropout=script_args.dropout,
        max_caption_length=training_args.max_caption_length + 1,  # + <bos>
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = ShowTellRL(config)
    pretraining = None
    if script_args.scene_pretraining_steps > 0 and "scene" in dataset["train"].column_names:
        pretraining = pretrain_image_encoder_on_scenes(
            model.image_encoder,
            processor,
            dataset["train"],
            script_args.scene_pretraining_steps,
            seed=training_args.seed,
        )
        print(
            "scene pretraining of the image encoder:", {name: round(value, 4) for name, value in pretraining.items()}
        )
        model.freeze_image_encoder(script_args.freeze_image_encoder)

    trainer = RLCaptionTrainer(
        model=model,
        args=training_args,
        processing_class=processor,
        train_dataset=dataset["train"],
        eval_dataset=dataset.get("validation"),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if not trainer.is_world_process_zero():
        return
    processor.save_pretrained(training_args.output_dir)

    if "test" in dataset:
        scores = evaluate_model(
            model.eval(), processor, dataset["test"], metrics=script_args.test_metrics, num_beams=1,
            max_length=training_args.max_caption_length + 1,
        )  # fmt: skip
        print("test scores:", {name: round(value, 4) for name, value in scores.items()})
        with open(os.path.join(training_args.output_dir, "eval_results.json"), "w", encoding="utf-8") as handle:
            json.dump({"test": scores}, handle, indent=2)
        card = _model_card(model, training_args, script_args, scores, dataset["test"].num_rows, pretraining)
        card.save(os.path.join(training_args.output_dir, "README.md"))
    if training_args.push_to_hub:
        repo_id = training_args.hub_model_id or os.path.basename(os.path.normpath(training_args.output_dir))
        print(publish_folder(training_args.output_dir, repo_id, token=training_args.hub_token))


if __name__ == "__main__":
    main()
