"""
SPIDEr policy gradient with Monte-Carlo rollouts and a learned baseline (Liu et al. 2017), warm-started
from teacher forcing (XE):

    accelerate launch examples/train_spider.py --output_dir runs/spider --reward_funcs cider

starts from the published XE captioner (`--model_name_or_path`, `checkpoints/show-tell-rl-shapes-xe`: a CNN
pretrained on the scenes, attention over its grid), trains `spider_pg` (`--num_rollouts` K = 3 rollouts from every
prefix of `--num_paths_per_image` M = 1 sampled caption per image), scores the test split, and writes the model, its
processor and a model card with the test scores to `--output_dir`. `--xe_epochs N` first continues its teacher
forcing for N epochs; `examples/train_xe.py` trains a new XE captioner.

The reward defaults to SPIDEr, (CIDEr-D + SPICE) / 2, as in the paper; SPICE needs Stanford CoreNLP (`rlcaption
download-spice`), and where it cannot run the script stops at once with SPICE's error: name another reward, e.g.
`--reward_funcs cider`, or the paper's BCMR mix `--reward_funcs bleu cider meteor rouge_l` (BLEU-4, CIDEr-D, METEOR,
ROUGE-L, equal weights; METEOR runs in Java). A run whose `--output_dir` holds a complete checkpoint resumes from it;
`--push_to_hub --hub_model_id org/name` publishes the folder.
"""

import os
from dataclasses import dataclass, field, replace

from rlcaption.metrics.spice import check_spice
from rlcaption.objectives import SpiderPGConfig
from rlcaption.recipes import (
    RecipeArguments,
    check_pretrained_reference,
    dataset_name,
    load_pretrained_captioner,
    load_recipe_dataset,
    parse_recipe_arguments,
    recipe_model_card,
    reward_description,
    train_and_finish,
)
from rlcaption.trainer import RLCaptionTrainer

_REWARDS_NEEDING_SPICE = ("spice", "spider")

# The recipe's own defaults: the paper's reward, an RL learning rate for a warm-started policy, and the test split
# scored with 3 beams and METEOR as in the paper.
RECIPE_DEFAULTS = {
    "objective": "spider_pg",
    "reward_funcs": ["spider"],
    "learning_rate": 2e-4,
    "num_train_epochs": 1.0,
    "eval_num_beams": 3,
    "eval_metrics": ["cider", "bleu", "rouge_l", "meteor"],
}


@dataclass
class ScriptArguments(RecipeArguments):
    # the captioner every RL recipe starts from: without it, a new model would not see (no scene pretraining, no
    # attention) and XE would write one caption for every image
    model_name_or_path: str = field(
        default="checkpoints/show-tell-rl-shapes-xe",
        metadata={"help": "XE captioner (folder or Hub id, with its processor) spider_pg starts from."},
    )
    xe_epochs: float = field(
        default=0.0,
        metadata={"help": "Epochs of teacher forcing of --model_name_or_path before spider_pg (0: start from it)."},
    )
    xe_learning_rate: float = field(default=2e-3, metadata={"help": "Learning rate of those XE epochs."})

    def __post_init__(self):
        if self.xe_epochs < 0 or self.xe_learning_rate <= 0:
            raise ValueError(
                f"--xe_epochs must be >= 0 and --xe_learning_rate > 0, got {self.xe_epochs} and "
                f"{self.xe_learning_rate}."
            )


def _warm_start(script_args, training_args, dataset):
    """The XE captioner spider_pg starts from, with `--xe_epochs` more of teacher forcing."""
    xe_dir = os.path.join(training_args.output_dir, "xe")
    model, processor = load_pretrained_captioner(script_args.model_name_or_path)
    if script_args.xe_epochs > 0:
        xe_args = replace(
            training_args,
            objective="xe",
            output_dir=xe_dir,
            learning_rate=script_args.xe_learning_rate,
            num_train_epochs=script_args.xe_epochs,
            max_steps=-1,
            push_to_hub=False,
            resume_from_checkpoint=None,
            eval_strategy="no",
        )
        trainer = RLCaptionTrainer(
            model=model, args=xe_args, processing_class=processor, train_dataset=dataset["train"]
        )
        trainer.train()
        trainer.save_model(xe_dir)
        if trainer.is_world_process_zero():
            processor.save_pretrained(xe_dir)
    return model, processor


def _model_card(model, training_args, script_args, scores, num_test_images, optimizer_steps=None):
    rewards = reward_description(training_args)
    return recipe_model_card(
        model, training_args, script_args, scores, num_test_images,
        model_summary=(
            "An image captioner trained on the "
            f"`{dataset_name(script_args)}` dataset with the SPIDEr policy gradient of "
            "Liu et al. (2017): Monte-Carlo rollouts from every prefix of a sampled caption estimate Q, and a learned "
            f"MLP baseline reduces the variance of the gradient. Reward: {rewards}."
        ),
        recipe="train_spider.py",
        training_settings={
            "warm start": f"`{script_args.model_name_or_path}`"
            + (
                f", then XE for {script_args.xe_epochs:g} epochs at lr {script_args.xe_learning_rate:g}"
                if script_args.xe_epochs > 0
                else ""
            ),
            "objective": "`spider_pg` (Liu et al. 2017)",
            "reward": rewards,
            "sampled captions per image (M)": training_args.num_paths_per_image,
            "rollouts per prefix (K)": training_args.num_rollouts,
            "baseline loss weight": training_args.baseline_loss_weight,
            "RL epochs": f"{training_args.num_train_epochs:g}",
            "RL learning rate": f"{training_args.learning_rate:g}",
        },
        tags=["show-tell-rl", "spider-pg"],
        optimizer_steps=optimizer_steps,
    )  # fmt: skip


def main(argv=None):
    script_args, training_args = parse_recipe_arguments(
        ScriptArguments, RECIPE_DEFAULTS, argv, config_classes=[SpiderPGConfig]
    )
    if any(name in _REWARDS_NEEDING_SPICE for name in training_args.reward_funcs):
        check_spice()  # stop before any training where SPICE cannot run, with what is missing and how to fix it
    check_pretrained_reference(script_args.model_name_or_path)  # a typo fails before any data is loaded

    dataset = load_recipe_dataset(script_args)
    if training_args.resume_from_checkpoint:
        # the checkpoint holds the weights: the model and processor come from the warm start saved before RL
        xe_dir = os.path.join(training_args.output_dir, "xe")
        model, processor = load_pretrained_captioner(
            xe_dir if os.path.isdir(xe_dir) else script_args.model_name_or_path
        )
    else:
        model, processor = _warm_start(script_args, training_args, dataset)

    train_and_finish(model, processor, dataset, script_args, training_args, _model_card)


if __name__ == "__main__":
    main()
