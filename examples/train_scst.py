"""
Self-critical sequence training (SCST, Rennie et al. 2017) of any captioner, CIDEr-D reward by default.

    accelerate launch examples/train_scst.py --model_name_or_path checkpoints/show-tell-rl-shapes-xe \
        --output_dir runs/scst --use_cpu

`--model_name_or_path` is an XE checkpoint of ours (`examples/train_xe.py`) or any transformers captioner the trainer
supports, by folder or Hub id: a VisionEncoderDecoderModel, BLIP or GIT, loaded with its own processor
(`AutoProcessor`). Rewards are any weighted mix of built-ins (`--reward_funcs cider bleu --reward_weights 1.0 0.5`);
the baseline is the greedy caption's reward (`--baseline greedy`, the default) or the mean of the image's other
samples (`--baseline mean_of_others`). Captions are sampled with the trainer's settings (`--temperature`, `--top_k`,
`--top_p`, `--max_caption_length`), never with those of the checkpoint's generation config.

The test split is scored at the end (beam search, `--eval_num_beams`), the scores are printed, and the output folder
gets the model, its processor, a model card and `eval_results.json`. A run whose `--output_dir` holds a complete
checkpoint resumes from it; `--push_to_hub --hub_model_id org/name` publishes the folder.
"""

from dataclasses import dataclass, field

from rlcaption.objectives import SCSTConfig
from rlcaption.recipes import (
    RecipeArguments,
    dataset_name,
    load_pretrained_captioner,
    load_recipe_dataset,
    parse_recipe_arguments,
    recipe_model_card,
    reward_description,
    train_and_finish,
)

# The recipe's own defaults: the demo's SCST settings (an RL learning rate for a warm-started policy).
RECIPE_DEFAULTS = {
    "objective": "scst",
    "reward_funcs": ["cider"],
    "learning_rate": 5e-4,
    "num_train_epochs": 1.0,
    "per_device_train_batch_size": 32,
    "num_samples_per_image": 5,
}


@dataclass
class ScriptArguments(RecipeArguments):
    model_name_or_path: str = field(
        default="checkpoints/show-tell-rl-shapes-xe",
        metadata={"help": "The captioner to start from (folder or Hub id, with its processor)."},
    )


def _model_card(model, training_args, script_args, scores, num_test_images, optimizer_steps=None):
    rewards = reward_description(training_args)
    return recipe_model_card(
        model, training_args, script_args, scores, num_test_images,
        model_summary=(
            f"An image captioner fine-tuned on the `{dataset_name(script_args)}` dataset by self-critical sequence "
            f"training (Rennie et al., 2017) from `{script_args.model_name_or_path}`. Reward: {rewards}."
        ),
        recipe="train_scst.py",
        training_settings={
            "start": f"`{script_args.model_name_or_path}`",
            "objective": f"`scst`, baseline `{training_args.baseline}`",
            "reward": rewards,
            "sampled captions per image": training_args.num_samples_per_image,
            "epochs": f"{training_args.num_train_epochs:g}",
            "learning rate": f"{training_args.learning_rate:g}",
        },
        tags=["scst"],
        optimizer_steps=optimizer_steps,
    )  # fmt: skip


def main(argv=None):
    script_args, training_args = parse_recipe_arguments(
        ScriptArguments, RECIPE_DEFAULTS, argv, config_classes=[SCSTConfig]
    )
    model, processor = load_pretrained_captioner(script_args.model_name_or_path)
    dataset = load_recipe_dataset(script_args)
    train_and_finish(model, processor, dataset, script_args, training_args, _model_card)


if __name__ == "__main__":
    main()
