"""
Actor-critic captioning with a value network (Ren et al. 2017), from the published XE warm
start:

    accelerate launch examples/train_actor_critic.py --output_dir runs/actor_critic --use_cpu

The XE captioner becomes the policy of a new `PolicyValueCaptioner`. Its value network first learns alone, by
regression on the rewards of captions sampled from the fixed policy (`--value_pretraining_steps`); then both learn
together: the policy by the policy gradient with advantage `R − v(s_t)`, the value network by regression
(`--value_loss_weight`, `--value_learning_rate`). A budget in epochs (`--num_train_epochs`, 1 by default) counts policy
updates, as `train_scst.py`'s does, and the value pretraining comes on top: by default both recipes give the captioner
the same updates (one epoch, 125 on shapes), here after 100 value-pretraining steps. A budget in `--max_steps` counts
both phases. The reward is `--reward_funcs` (CIDEr-D by default) plus, with
`--embedding_model <folder or Hub id>` and `--embedding_weight`, the visual-semantic embedding reward
`cos(h_T(S), l_e(f_I))` of that model (`rlcaption.rewards.embedding`).

The test split is scored at the end with plain beam search (`--eval_num_beams`) and, beside it, with lookahead beam
search `λ · log p + (1 − λ) · v` (`--test_lookahead_lambda`, 0.4 as in Ren et al.; keys `lookahead_CIDEr`, ...), and
the value network by its explained variance on captions sampled for the test images, `1 − Var(R − v(s_t)) / Var(R)`
over all their states (`value_explained_variance`: 1 when it predicts each caption's reward from every prefix, 0 when
no better than a constant). The output folder gets the model (both networks), its processor, a model card and
`eval_results.json`. A run whose
`--output_dir` holds a complete checkpoint resumes from it; `--push_to_hub --hub_model_id org/name` publishes it.
"""

from dataclasses import dataclass, field

from transformers import set_seed

from rlcaption.evaluation import evaluate_model
from rlcaption.models import PolicyValueCaptioner, ShowTellRL
from rlcaption.objectives import ActorCriticConfig
from rlcaption.objectives.actor_critic import value_explained_variance
from rlcaption.recipes import (
    RecipeArguments,
    check_the_captioner_gets_steps,
    dataset_name,
    finish_recipe,
    fit_image_columns_to_run,
    load_pretrained_captioner,
    load_recipe_dataset,
    parse_recipe_arguments,
    phase_steps_description,
    recipe_model_card,
    reward_description,
)
from rlcaption.rewards import get_reward
from rlcaption.trainer import RLCaptionTrainer

RECIPE_DEFAULTS = {
    "objective": "actor_critic",
    "reward_funcs": ["cider"],
    "learning_rate": 5e-4,
    "num_train_epochs": 1.0,
    "per_device_train_batch_size": 32,
    "num_samples_per_image": 5,
    "value_pretraining_steps": 100,
    "eval_metrics": ["cider", "bleu", "rouge_l"],
}


@dataclass
class ScriptArguments(RecipeArguments):
    model_name_or_path: str = field(
        default="checkpoints/show-tell-rl-shapes-xe",
        metadata={"help": "The policy to start from (a ShowTellRL checkpoint) or a PolicyValueCaptioner checkpoint."},
    )
    value_hidden_size: int = field(default=256, metadata={"help": "Recurrent state size of a new value network."})
    value_rnn_type: str = field(
        default="gru",
        metadata={
            "help": "Recurrent network of a new value network over the partial caption: `gru` (the default, with "
            "which the published checkpoints and reproduction tables ran) or `lstm` (Ren et al. 2017's). For Ren et "
            "al.'s learning rate, decayed x0.9 every two epochs, add `--lr_scheduler_type constant --lr_decay_factor "
            "0.9 --lr_decay_epochs 2`; the default schedule is linear decay over the policy's steps."
        },
    )
    embedding_model: str | None = field(
        default=None, metadata={"help": "A VisualSemanticEmbedding (folder or Hub id) whose cosine joins the reward."}
    )
    embedding_weight: float = field(default=1.0, metadata={"help": "Weight of the embedding reward in the mix."})
    test_lookahead_lambda: float = field(
        default=0.4, metadata={"help": "λ of the lookahead beam search scored at the end (1: plain beam search)."}
    )


def _model_card(model, training_args, script_args, scores, num_test_images, budget, optimizer_steps=None):
    embedding = [f"embedding (`{script_args.embedding_model}`)"] if script_args.embedding_model else []
    reward = reward_description(training_args, [*training_args.reward_funcs, *embedding])
    return recipe_model_card(
        model, training_args, script_args, scores, num_test_images,
        model_summary=(
            "A policy network and a value network trained on the "
            f"`{dataset_name(script_args)}` dataset by actor-critic "
            "policy gradient (Ren et al. 2017): the value network's estimate of each prefix is the "
            f"baseline, and lookahead beam search uses it at inference. Reward: {reward}. Started from "
            f"`{script_args.model_name_or_path}`."
        ),
        recipe="train_actor_critic.py",
        training_settings={
            "start": f"`{script_args.model_name_or_path}`",
            "objective": "`actor_critic`",
            "reward": reward,
            "value pretraining steps (policy fixed)": training_args.value_pretraining_steps,
            "value loss weight": training_args.value_loss_weight,
            "value network recurrence": model.config.value_rnn_type.upper(),
            "sampled captions per image": training_args.num_samples_per_image,
            "budget": budget,
            "learning rate": f"{training_args.learning_rate:g}",
        },
        tags=["policy-value", "actor-critic"],
        optimizer_steps=optimizer_steps,
    )  # fmt: skip


def main(argv=None):
    script_args, training_args = parse_recipe_arguments(
        ScriptArguments, RECIPE_DEFAULTS, argv, config_classes=[ActorCriticConfig]
    )
    model, processor = load_pretrained_captioner(script_args.model_name_or_path)
    if isinstance(model, ShowTellRL):
        set_seed(training_args.seed)  # the new value network's initialisation is the run's seed's, not chance's
        model = PolicyValueCaptioner.from_policy(
            model, value_hidden_size=script_args.value_hidden_size, value_rnn_type=script_args.value_rnn_type
        )
    rewards, weights = list(training_args.reward_funcs), training_args.reward_weights
    if script_args.embedding_model:
        rewards.append(get_reward("embedding", model=script_args.embedding_model))
        weights = [*(weights or [1.0] * len(training_args.reward_funcs)), script_args.embedding_weight]
    training_args.reward_weights = weights
    dataset = fit_image_columns_to_run(model, load_recipe_dataset(script_args), training_args)

    # built here rather than by `train_and_finish`: the scores of a split need the run's sampling and rewards
    trainer = RLCaptionTrainer(
        model=model, args=training_args, processing_class=processor, train_dataset=dataset["train"],
        eval_dataset=dataset.get("validation"), reward_funcs=rewards,
    )  # fmt: skip
    if training_args.max_steps <= 0 and not script_args.pretraining_only:
        # epochs count policy updates, as in train_scst.py: the value pretraining's steps come on top of them
        epochs_steps = trainer.planned_steps()
        training_args.max_steps = epochs_steps + training_args.value_pretraining_steps
        budget = f"{training_args.num_train_epochs:g} epoch(s) of policy updates ({epochs_steps} steps)"
    else:
        budget = f"{training_args.max_steps} optimizer steps, value pretraining included"
    check_the_captioner_gets_steps(trainer, script_args)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    def lookahead_and_value_scores(split):
        # max_length (<bos> + the caption), the setting of the model's generation config: max_new_tokens beside it
        # made transformers warn once per test batch
        scores = evaluate_model(
            model.eval(), processor, split, metrics=["cider", "bleu"],
            batch_size=training_args.per_device_eval_batch_size, num_beams=max(training_args.eval_num_beams, 2),
            max_length=training_args.max_caption_length + 1, lookahead_lambda=script_args.test_lookahead_lambda,
        )  # fmt: skip
        scores = {f"lookahead_{name}": scores[name] for name in ("CIDEr", "Bleu_4", "object_f1") if name in scores}
        scores["value_explained_variance"] = value_explained_variance(trainer, split, seed=training_args.seed)
        return scores

    def card(scores, num_test_images):
        steps = phase_steps_description(trainer)
        return _model_card(model, training_args, script_args, scores, num_test_images, budget, optimizer_steps=steps)

    finish_recipe(trainer, processor, dataset, script_args, card, lookahead_and_value_scores)


if __name__ == "__main__":
    main()
