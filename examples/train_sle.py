"""
Sequence-level exploration (SLE, Chen & Jin 2020): policy gradient on precision (a reward, CIDEr-D by default) and on
the diversity of each image's samples, from the published XE warm start:

    accelerate launch examples/train_sle.py --output_dir runs/sle --use_cpu

Each image gets `--num_samples_per_image` (s = 5) samples; the loss of eqs. 15-16 weighs precision by `--sle_alpha`
(0.75) against diversity, with the greedy caption's reward as the precision baseline and the mean pairwise distance of
the samples as the diversity baseline; the distance is 1 - (BLEU-3 + BLEU-4) / 2 (`--sle_distance bleu`) or a
normalised word edit distance (`--sle_distance edit`).

The paper's baselines run with the same recipe and evaluation: SLL is `--objective scst`, SLL-ME is `--objective
scst --entropy_bonus_weight 1e-2`; with `--objective scst` the recipe takes SCST's options (`--objective scst --help`
lists them). The test split is scored at the end as in the paper's Table 4: per image 5 random
samples and, separately, the beam-5 top 5, each set with mean CIDEr-D, Div-1, Div-2, mBLEU-4 and (on shapes) object
F1, beside the beam-5 caption's consensus metrics; the output folder gets the model, its processor, a model card and
`eval_results.json`. A run whose `--output_dir` holds a complete checkpoint resumes from it; `--push_to_hub
--hub_model_id org/name` publishes the folder.
"""

from dataclasses import dataclass, field

from rlcaption.objectives import SCSTConfig, SLEConfig
from rlcaption.recipes import (
    RecipeArguments,
    dataset_name,
    load_pretrained_captioner,
    load_recipe_dataset,
    parse_recipe_arguments,
    recipe_model_card,
    train_and_finish,
)

# The paper's settings (alpha 0.75, 5 samples, beam 5 at test) and the demo's RL schedule for the shapes warm start.
RECIPE_DEFAULTS = {
    "objective": "sle",
    "reward_funcs": ["cider"],
    "learning_rate": 5e-4,
    "num_train_epochs": 1.0,
    "per_device_train_batch_size": 32,
    "num_samples_per_image": 5,
    "eval_num_beams": 5,
    "eval_metrics": ["cider", "bleu", "rouge_l"],
    "eval_caption_sets": ["sample", "beam"],
    "eval_caption_set_size": 5,
}
# SLE, and its SLL and SLL-ME baselines, which are `scst` runs (SLL-ME with an entropy bonus)
CONFIG_CLASSES = (SLEConfig, SCSTConfig)


@dataclass
class ScriptArguments(RecipeArguments):
    model_name_or_path: str = field(
        default="checkpoints/show-tell-rl-shapes-xe",
        metadata={"help": "The captioner to start from (folder or Hub id, with its processor)."},
    )


def method_name(training_args) -> str:
    """The paper's name of the configured method: SLE, SLL or SLL-ME."""
    if training_args.objective == "sle":
        return "SLE"
    return "SLL-ME" if training_args.entropy_bonus_weight > 0 else "SLL"


def _model_card(model, training_args, script_args, scores, num_test_images, optimizer_steps=None):
    method = method_name(training_args)
    settings = {
        "start": f"`{script_args.model_name_or_path}`",
        "method": method,
        "reward (precision)": " + ".join(training_args.reward_funcs),
        "samples per image (s)": training_args.num_samples_per_image,
        "epochs": f"{training_args.num_train_epochs:g}",
        "learning rate": f"{training_args.learning_rate:g}",
    }
    if method == "SLE":
        settings.update({"alpha": training_args.sle_alpha, "distance": training_args.sle_distance})
    if method == "SLL-ME":
        settings["entropy bonus weight"] = training_args.entropy_bonus_weight
    return recipe_model_card(
        model, training_args, script_args, scores, num_test_images,
        model_summary=(
            f"An image captioner fine-tuned on the `{dataset_name(script_args)}` dataset with {method} from "
            f"`{script_args.model_name_or_path}`"
            + (
                ": sequence-level exploration (Chen & Jin 2020) rewards both the precision of each sampled caption "
                "and its distance to the image's other samples, for captions that are right and varied."
                if method == "SLE"
                else ", the sequence-level learning baseline of Chen & Jin 2020."
            )
            + " The scores of several captions per image (5 samples, and the beam-5 top 5) follow the paper's "
            "Table 4."
        ),
        recipe="train_sle.py",
        training_settings=settings,
        tags=["show-tell-rl", method.lower()],
        optimizer_steps=optimizer_steps,
    )  # fmt: skip


def main(argv=None):
    script_args, training_args = parse_recipe_arguments(ScriptArguments, RECIPE_DEFAULTS, argv, CONFIG_CLASSES)
    model, processor = load_pretrained_captioner(script_args.model_name_or_path)
    dataset = load_recipe_dataset(script_args)
    train_and_finish(model, processor, dataset, script_args, training_args, _model_card)


if __name__ == "__main__":
    main()
