"""
Cooperative speaker-listener training with partial-sampling straight-through (PSST, Vered et al. 2019), from the
published XE warm start:

    accelerate launch examples/train_psst.py --output_dir runs/psst --use_cpu \
        --eval_clip checkpoints/shapes-clip-evaluator

The XE captioner becomes the speaker of a new `SpeakerListener`; the speaker and its listener then minimise
`λ · l_disc + (1 − λ) · l_nat` (`--psst_lambda`, 5e-3): the listener's VSE++ hardest-negative loss on the words the
speaker passes (`--psst_mode st | psst | gumbel | st_gumbel | psst_gumbel | reinforce`, `--psst_rho` 0.25) and
`−CIDEr-D` by self-critical REINFORCE, both networks in every step or in turns (`--psst_schedule joint | alternating`,
`--alternating_listener_steps`, `--alternating_speaker_steps`); the Gumbel modes' temperature is fixed or annealed
(`--gumbel_temperature_schedule constant | annealed`). A new listener first learns alone from the fixed speaker's
words for `--listener_pretraining_steps` (the hardest-negative hinge does not train a listener from scratch); its image
encoder is a fixed copy of the XE speaker's scene-pretrained CNN. `--model_name_or_path` also takes a
`SpeakerListener` checkpoint (e.g. one whose listener was warmed up by an earlier run: `--max_steps` equal to
`--listener_pretraining_steps` with `--pretraining_only True`).

The test split is scored at the end: the consensus metrics and scene grounding of the speaker's captions (beam search,
`--eval_num_beams`), the evaluator CLIP's retrieval with `--eval_clip` (so that a private speaker-listener code does
not pass for a good caption), and the listener's recall `listener_R@1/5/10` of each test image among the whole split
from the same beam-search captions; with more than one beam, the greedy captions are scored on the same axes too
(`greedy_CIDEr`, `greedy_listener_R@10`, `greedy_t2i_R@10`, ...). The output folder gets the SpeakerListener (speaker
and trained listener), its processor, a model card and `eval_results.json`. A run whose `--output_dir` holds a complete
checkpoint resumes from it; `--push_to_hub --hub_model_id org/name` publishes the folder.
"""

from dataclasses import dataclass, field

from transformers import set_seed

from rlcaption.evaluation import listener_recall
from rlcaption.models import ShowTellRL, SpeakerListener
from rlcaption.objectives import PSSTConfig
from rlcaption.recipes import (
    RecipeArguments,
    dataset_name,
    load_pretrained_captioner,
    load_recipe_dataset,
    parse_recipe_arguments,
    recipe_model_card,
    train_and_finish,
)
from rlcaption.rl_config import split_eval_metrics

# The paper's λ and ρ, and the demo's RL schedule for the shapes warm start.
RECIPE_DEFAULTS = {
    "objective": "psst",
    "reward_funcs": ["cider"],
    "learning_rate": 5e-4,
    "num_train_epochs": 1.0,
    "per_device_train_batch_size": 32,
    "num_samples_per_image": 5,
    "eval_metrics": ["cider", "bleu", "rouge_l"],
    "listener_learning_rate": 2e-3,
}


@dataclass
class ScriptArguments(RecipeArguments):
    model_name_or_path: str = field(
        default="checkpoints/show-tell-rl-shapes-xe",
        metadata={"help": "The speaker to start from (a ShowTellRL checkpoint) or a SpeakerListener checkpoint."},
    )
    listener_hidden_size: int = field(default=256, metadata={"help": "GRU size of a new listener."})
    joint_embedding_size: int = field(default=256, metadata={"help": "Joint caption-image space of a new listener."})


def _schedule_description(training_args) -> str:
    if training_args.psst_schedule == "joint":
        return "joint (speaker and listener learn in every step)"
    return (
        f"alternating: {training_args.alternating_listener_steps} listener step(s), then "
        f"{training_args.alternating_speaker_steps} speaker step(s)"
    )


def _gumbel_temperature_description(training_args) -> str:
    if training_args.gumbel_temperature_schedule == "constant":
        return f"Gumbel temperature {training_args.gumbel_temperature:g}"
    return (
        f"Gumbel temperature max({training_args.gumbel_min_temperature:g}, {training_args.gumbel_temperature:g}"
        f" · exp(−{training_args.gumbel_annealing_rate:g} t)), updated every "
        f"{training_args.gumbel_annealing_interval} steps"
    )


def _model_card(model, training_args, script_args, scores, num_test_images, optimizer_steps=None):
    mode = training_args.psst_mode
    return recipe_model_card(
        model, training_args, script_args, scores, num_test_images,
        model_summary=(
            "A speaker-listener pair trained on the "
            f"`{dataset_name(script_args)}` dataset by cooperative image captioning "
            "(Vered et al. 2019): the speaker captions, the listener finds the image from the caption, and "
            f"the speaker learns from the listener through its words passed in `{mode}` mode, beside self-critical "
            f"CIDEr-D. Started from `{script_args.model_name_or_path}`."
        ),
        recipe="train_psst.py",
        training_settings={
            "start": f"`{script_args.model_name_or_path}`",
            "objective": f"`psst`, word passing `{mode}`"
            + (f", ρ = {training_args.psst_rho:g}" if "psst" in mode else "")
            + (f", {_gumbel_temperature_description(training_args)}" if "gumbel" in mode else ""),
            "λ (listener loss weight)": f"{training_args.psst_lambda:g}",
            "naturalness reward": " + ".join(training_args.reward_funcs),
            "listener learning rate": f"{training_args.listener_learning_rate:g}",
            "listener warm-up steps (speaker fixed)": training_args.listener_pretraining_steps,
            "schedule": _schedule_description(training_args),
            "epochs": f"{training_args.num_train_epochs:g}",
            "learning rate": f"{training_args.learning_rate:g}",
        },
        tags=["speaker-listener", "psst"],
        optimizer_steps=optimizer_steps,
    )  # fmt: skip


def main(argv=None):
    script_args, training_args = parse_recipe_arguments(
        ScriptArguments, RECIPE_DEFAULTS, argv, config_classes=[PSSTConfig]
    )
    model, processor = load_pretrained_captioner(script_args.model_name_or_path)
    if isinstance(model, ShowTellRL):
        set_seed(training_args.seed)  # the new listener's initialisation is the run's seed's, not chance's
        model = SpeakerListener.from_speaker(
            model,
            listener_hidden_size=script_args.listener_hidden_size,
            joint_embedding_size=script_args.joint_embedding_size,
        )
    dataset = load_recipe_dataset(script_args)

    def listener_scores(split):
        # the listener ranks the captions `trainer.evaluate` scored (its beams, its length), so that listener recall
        # and CIDEr-D judge the same captions; greedy captions are scored on both axes too, keys `greedy_*`
        decoding = {
            "batch_size": training_args.per_device_eval_batch_size,
            "max_new_tokens": training_args.max_caption_length,
        }
        scores = listener_recall(model.eval(), processor, split, num_beams=training_args.eval_num_beams, **decoding)
        if training_args.eval_num_beams > 1:
            caption_metrics, _ = split_eval_metrics(training_args.eval_metrics)
            greedy = listener_recall(
                model.eval(), processor, split, num_beams=1, clip=training_args.eval_clip,
                caption_metrics=caption_metrics, **decoding,
            )  # fmt: skip
            # the evaluator CLIP's caption-to-image recall, named as `trainer.evaluate` names it
            greedy = {name.replace("clip_R@", "t2i_R@"): value for name, value in greedy.items()}
            scores.update({f"greedy_{name}": value for name, value in greedy.items()})
        return scores

    train_and_finish(model, processor, dataset, script_args, training_args, _model_card, listener_scores)


if __name__ == "__main__":
    main()
