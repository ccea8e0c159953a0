"""
SPIDEr policy gradient with Monte-Carlo rollouts and a learned baseline (seed 000, Liu et al. 2017), warm-started
from teacher forcing (XE):

    accelerate launch examples/train_spider.py --output_dir runs/spider --reward_funcs cider

trains XE for `--xe_epochs` on the embedded shapes dataset, then `spider_pg` (`--num_rollouts` K = 3 rollouts from
every prefix of `--num_paths_per_image` M = 1 sampled caption per image), scores the test split, and writes the model,
its processor and a model card with the test scores to `--output_dir`. Start from an XE checkpoint instead with
`--model_name_or_path runs/xe --xe_epochs 0`.

The reward defaults to SPIDEr, (CIDEr-D + SPICE) / 2, as in the paper; SPICE needs Stanford CoreNLP (`rlcaption
download-spice`), and where it cannot run the script stops at once with SPICE's error: name another reward, e.g.
`--reward_funcs cider`, or the paper's BCMR mix `--reward_funcs bleu cider meteor rouge` (BLEU-4, CIDEr-D, METEOR,
ROUGE-L, equal weights; METEOR runs in Java). `--push_to_hub --hub_model_id org/name` publishes the folder.
"""

import os
from dataclasses import dataclass, field, replace

from transformers import HfArgumentParser

from rlcaption.data import load_caption_dataset
from rlcaption.evaluation import evaluate_model
from rlcaption.hub import publish_folder, render_model_card
from rlcaption.metrics.spice import check_spice
from rlcaption.models import ShowTellRL, ShowTellRLConfig
from rlcaption.processing import CaptionProcessor
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer

_REWARDS_NEEDING_SPICE = ("spice", "spider")


@dataclass
class ScriptArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "XE checkpoint (folder or Hub id, with its processor) to start from; a new model if unset."},
    )
    xe_epochs: float = field(
        default=4.0,
        metadata={"help": "Epochs of teacher forcing before spider_pg (0 to start from --model_name_or_path as is)."},
    )
    xe_learning_rate: float = field(default=2e-3, metadata={"help": "Learning rate of the XE warm start."})
    dataset: str = field(default="shapes", metadata={"help": "`shapes`, a save_to_disk folder or a Hub dataset id."})
    num_train_images: int = field(default=4000, metadata={"help": "Training images of the shapes dataset."})
    num_validation_images: int = field(default=200, metadata={"help": "Validation images of the shapes dataset."})
    num_test_images: int = field(default=500, metadata={"help": "Test images of the shapes dataset."})
    shapes_seed: int = field(default=0, metadata={"help": "Seed of the generated shapes dataset."})
    image_size: int = field(default=48, metadata={"help": "Image side of a new model (and of shapes images)."})
    hidden_size: int = field(default=128, metadata={"help": "LSTM and embedding size of a new model."})
    cnn_channels: list[int] = field(
        default_factory=lambda: [16, 32, 32, 32], metadata={"help": "CNN encoder channels of a new model."}
    )
    test_metrics: list[str] = field(
        default_factory=lambda: ["cider", "bleu", "rouge_l", "meteor"],
        metadata={"help": "Metrics scored on the test split with beam search and written to the model card."},
    )


def _new_model(processor: CaptionProcessor, script_args: ScriptArguments, max_caption_length: int) -> ShowTellRL:
    tokenizer = processor.tokenizer
    config = ShowTellRLConfig(
        vocab_size=len(tokenizer),
        hidden_size=script_args.hidden_size,
        word_embedding_size=script_args.hidden_size,
        encoder_type="cnn",
        image_size=script_args.image_size,
        cnn_channels=script_args.cnn_channels,
        dropout=0.2,
        max_caption_length=max_caption_length + 1,  # + <bos>
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return ShowTellRL(config)


def _warm_start(script_args, training_args, dataset) -> tuple[ShowTellRL, CaptionProcessor]:
    """The XE model spider_pg starts from: loaded, trained from scratch, or loaded then trained further."""
    if script_args.model_name_or_path is not None:
        model = ShowTellRL.from_pretrained(script_args.model_name_or_path)
        processor = CaptionProcessor.from_pretrained(script_args.model_name_or_path)
    elif script_args.xe_epochs > 0:
        train_captions = [caption for captions in dataset["train"]["captions"] for caption in captions]
        processor = CaptionProcessor.from_captions(train_captions, min_count=1, image_size=script_args.image_size)
        model = _new_model(processor, script_args, training_args.max_caption_length)
    else:
        raise ValueError(
            "--xe_epochs is 0 and no --model_name_or_path was given: name an XE checkpoint to start from."
        )
    if script_args.xe_epochs > 0:
        xe_dir = os.path.join(training_args.output_dir, "xe")
        xe_args = replace(
            training_args,
            objective="xe",
            output_dir=xe_dir,
            learning_rate=script_args.xe_learning_rate,
            num_train_epochs=script_args.xe_epochs,
            max_steps=-1,
            push_to_hub=False,
            resume_from_checkpoint=None,
        )
        trainer = RLCaptionTrainer(
            model=model, args=xe_args, processing_class=processor, train_dataset=dataset["train"]
        )
        trainer.train()
        trainer.save_model(xe_dir)
        processor.save_pretrained(xe_dir)
    return model, processor


def _model_card(model, training_args, script_args, scores, num_test_images):
    repo_id = training_args.hub_model_id or os.path.basename(os.path.normpath(training_args.output_dir))
    weights = training_args.reward_weights or [1.0] * len(training_args.reward_funcs)
    rewards = " + ".join(
        f"{weight:g}·{name}" for name, weight in zip(training_args.reward_funcs, weights, strict=True)
    )
    settings = {
        "warm start": f"XE, {script_args.xe_epochs:g} epochs, lr {script_args.xe_learning_rate:g}"
        if script_args.xe_epochs > 0
        else f"`{script_args.model_name_or_path}`",
        "objective": "`spider_pg` (seed 000)",
        "reward": rewards,
        "sampled captions per image (M)": training_args.num_paths_per_image,
        "rollouts per prefix (K)": training_args.num_rollouts,
        "baseline loss weight": training_args.baseline_loss_weight,
        "RL epochs": f"{training_args.num_train_epochs:g}",
        "RL learning rate": f"{training_args.learning_rate:g}",
        "batch size": training_args.per_device_train_batch_size,
        "max caption length": training_args.max_caption_length,
        "seed": training_args.seed,
    }
    return render_model_card(
        model,
        repo_id=repo_id,
        scores=scores,
        dataset_type=script_args.dataset,
        dataset_name=script_args.dataset,
        model_summary=(
            f"An image captioner trained on the `{script_args.dataset}` dataset with the SPIDEr policy gradient of "
            "Liu et al. (2017): Monte-Carlo rollouts from every prefix of a sampled caption estimate Q, and a learned "
            f"MLP baseline reduces the variance of the gradient. Reward: {rewards}."
        ),
        training_summary=(
            "Trained with `examples/train_spider.py` of rlcaption (teacher forcing, then `spider_pg` with "
            "`RLCaptionTrainer`)."
        ),
        training_settings=settings,
        evaluation_summary=(
            f"Beam search (3 beams) on the {num_test_images} images of the `{script_args.dataset}` test split, scored "
            "with rlcaption's metrics (equal to the COCO caption evaluation code's); CIDEr-D document frequencies "
            "from the test references."
        ),
        limitations=(
            "Trained on synthetic scenes of coloured shapes (rlcaption's embedded `shapes` dataset): it describes "
            "such images and nothing else. It shows the method and the library end to end; it is not a "
            "general-purpose captioner."
            if script_args.dataset == "shapes"
            else "Inherits the biases of its training captions."
        ),
        tags=["show-tell-rl", "spider-pg", "image-to-text"],
    )


def main():
    parser = HfArgumentParser((ScriptArguments, RLCaptionConfig))
    # the recipe's own defaults: the paper's reward and an RL learning rate for a warm-started policy
    parser.set_defaults(objective="spider_pg", reward_funcs=["spider"], learning_rate=2e-4, num_train_epochs=1.0)
    script_args, training_args = parser.parse_args_into_dataclasses()
    if any(name in _REWARDS_NEEDING_SPICE for name in training_args.reward_funcs):
        check_spice()  # stop before any training where SPICE cannot run, with what is missing and how to fix it

    shapes_options = (
        {
            "num_train": script_args.num_train_images,
            "num_validation": script_args.num_validation_images,
            "num_test": script_args.num_test_images,
            "image_size": script_args.image_size,
            "seed": script_args.shapes_seed,
        }
        if script_args.dataset == "shapes"
        else {}
    )
    dataset = load_caption_dataset(script_args.dataset, **shapes_options)
    model, processor = _warm_start(script_args, training_args, dataset)

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
            model, processor, dataset["test"], metrics=script_args.test_metrics, num_beams=3,
            max_length=training_args.max_caption_length + 1,
        )  # fmt: skip
        print("test scores:", {name: round(value, 4) for name, value in scores.items()})
        card = _model_card(model, training_args, script_args, scores, dataset["test"].num_rows)
        card.save(os.path.join(training_args.output_dir, "README.md"))
    if training_args.push_to_hub:
        repo_id = training_args.hub_model_id or os.path.basename(os.path.normpath(training_args.output_dir))
        print(publish_folder(training_args.output_dir, repo_id, token=training_args.hub_token))


if __name__ == "__main__":
    main()
