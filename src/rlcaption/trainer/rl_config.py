"""Training arguments of [`RLCaptionTrainer`]: the usual `TrainingArguments` plus what RL captioning needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments

from ..metrics.diversity import PAIRWISE_DISTANCES
from ..metrics.evaluation import AVAILABLE_METRICS, resolve_metric_names

__all__ = ["DIVERSITY_METRICS", "RLCaptionConfig", "split_eval_metrics"]

BASELINES = ("greedy", "mean_of_others", "none")
LOSS_NORMALIZATIONS = ("token", "sequence")
# `eval_metrics` names of the diversity metrics (`rlcaption.evaluation.diversity_scores`).
DIVERSITY_METRICS = ("div_1", "div_2", "mbleu_4", "self_bleu", "distinct_captions")
# The diversity metrics that compare the `eval_num_beams` best beams of each image with each other.
SET_DIVERSITY_METRICS = ("div_1", "div_2", "mbleu_4")


def split_eval_metrics(names: list[str]) -> tuple[list[str], list[str]]:
    """
    `eval_metrics` as `(caption_metrics, diversity_metrics)`: the names for
    [`rlcaption.metrics.evaluate_captions`] (any case, its aliases accepted) and the [`DIVERSITY_METRICS`] names.

    Raises:
        `ValueError`: for a name that is neither, listing the valid names.
    """
    caption_metrics, diversity_metrics = [], []
    for name in names:
        if name.lower() in DIVERSITY_METRICS:
            diversity_metrics.append(name.lower())
            continue
        try:
            resolve_metric_names([name])
        except ValueError:
            valid = [*AVAILABLE_METRICS, *DIVERSITY_METRICS]
            raise ValueError(f"eval_metrics={names!r}: unknown metric {name!r}; valid names: {valid}.") from None
        caption_metrics.append(name)
    return caption_metrics, diversity_metrics


@dataclass
class RLCaptionConfig(TrainingArguments):
    """
    Configuration of [`RLCaptionTrainer`]. Every field of [`~transformers.TrainingArguments`] applies; the fields
    below choose the objective, the rewards, how captions are sampled, and how the model is evaluated during training.

    Label smoothing for the `xe` objective is the inherited `label_smoothing_factor`.
    """

    # > Objective
    objective: str = field(
        default="xe",
        metadata={"help": "Training objective: `xe` (teacher forcing) or an RL objective such as `scst`."},
    )

    # > Rewards
    reward_funcs: list[str] = field(
        default_factory=lambda: ["cider"],
        metadata={"help": "Names of built-in rewards (see `rlcaption.rewards.available_rewards()`)."},
    )
    reward_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": "One weight per reward function (names here or callables given to the trainer); all 1.0 "
            "when unset."
        },
    )
    document_frequencies: str | None = field(
        default=None,
        metadata={
            "help": "CIDEr-D document-frequency file for the `cider`/`spider` rewards; by default they are computed "
            "once from the training split's references."
        },
    )

    # > Sampling
    num_samples_per_image: int = field(
        default=5,
        metadata={
            "help": "Captions sampled per image and step by `scst`, `sle` and `actor_critic` (k, s in seed 002; 5 "
            "as in self-critical.pytorch and the paper). `spider_pg` "
            "has its own count, `num_paths_per_image`: each of its samples also costs `num_rollouts` rollouts per "
            "token and the paper samples 1, so one setting for both would change one method's cost and recipe "
            "whenever a configuration is switched to the other objective."
        },
    )
    baseline: str = field(
        default="greedy",
        metadata={
            "help": "Reward baseline of `scst`: `greedy` (reward of the greedy caption, Rennie et al. 2017), "
            "`mean_of_others` (mean reward of the other samples of the same image) or `none`."
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature for RL objectives."})
    top_k: int = field(
        default=0,
        metadata={"help": "RL sampling from the k most likely tokens only; 0 samples from the whole vocabulary."},
    )
    top_p: float = field(
        default=1.0,
        metadata={"help": "RL nucleus sampling: the smallest token set of this total probability; 1.0 disables it."},
    )
    max_caption_length: int = field(
        default=20,
        metadata={
            "help": "Most tokens of a caption after its start token, the end token included: the `max_new_tokens` of "
            "sampling, greedy and beam-search decoding. References are cut to as many tokens (`max_caption_length "
            "- 1` words and the end token) for teacher forcing, so that XE never trains a caption longer than "
            "decoding can produce. `ShowTellRLConfig.max_caption_length` counts alike; `generate`'s `max_length` "
            "counts the start token too, so it is this value + 1."
        },
    )
    loss_normalization: str = field(
        default="token",
        metadata={
            "help": "Policy-gradient loss normalisation: `token` (sum over tokens / number of tokens, as in "
            "self-critical.pytorch) or `sequence` (mean over captions of the summed log-probabilities)."
        },
    )
    xe_captions_per_image: int | None = field(
        default=None,
        metadata={"help": "References used per image and step by `xe`; all of them when unset."},
    )

    # > Evaluation during training
    eval_num_beams: int = field(default=3, metadata={"help": "Beam size of the captions scored during evaluation."})
    eval_metrics: list[str] = field(
        default_factory=lambda: ["cider", "bleu"],
        metadata={
            "help": "Metrics of the evaluation captions, logged beside `eval_loss` (the teacher-forced cross-entropy "
            "of the references): caption metrics (`bleu`, `meteor`, `rouge_l`, `cider`, `spice`, `spider`; METEOR "
            "and SPICE need Java), logged under the COCO toolkit's keys (`eval_CIDEr`, `eval_Bleu_4`, ...), and "
            "diversity metrics: `div_1`, `div_2` and `mbleu_4` of each image's `eval_num_beams` best beams (needs "
            "`eval_num_beams >= 2`), `self_bleu` and `distinct_captions` of the best captions of the split, logged as "
            "`eval_Div-1`, `eval_Div-2`, `eval_mBLEU-4`, `eval_Self-BLEU`, `eval_distinct_captions`. Lower mBLEU-4 "
            "and Self-BLEU are more diverse: set `greater_is_better=False` to select the best model by them."
        },
    )
    eval_clip: str | None = field(
        default=None,
        metadata={
            "help": "CLIP (local folder or Hub id, loaded when the trainer is built) that scores the evaluation "
            "captions against their images: `eval_CLIP-S` and the retrieval recalls `eval_t2i_R@1`, `eval_i2t_R@1`, "
            "... (`rlcaption.metrics.clip`). The evaluation split needs its `image` column. Use a CLIP the rewards "
            "do not use, or RL will have learned to please the judge."
        },
    )
    eval_caption_sets: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Also caption every evaluation image `eval_caption_set_size` times, by random sampling (`sample`) "
            "and/or as the top of a beam search of that width (`beam`), and score each set as seed 002's Table 4 "
            "does: mean CIDEr-D, Div-1, Div-2, mBLEU-4 and, with scenes, object F1, logged as `eval_sample5_CIDEr`, "
            "`eval_beam5_Div-2`, ... Sampling is seeded with `seed`, so every evaluation draws alike."
        },
    )
    eval_caption_set_size: int = field(
        default=5, metadata={"help": "Captions per image of each `eval_caption_sets` set (5 in seed 002)."}
    )

    # > psst (seed 004: cooperative speaker-listener training with partial-sampling straight-through)
    psst_lambda: float = field(
        default=5e-3,
        metadata={
            "help": "λ of seed 004's eq. 1, `λ · l_disc + (1 − λ) · l_nat`: the weight of the listener's "
            "discriminability loss against the naturalness loss (−CIDEr-D by `scst`'s REINFORCE) in `psst`. The "
            "paper traces the trade-off over λ in {10, 5, 2.5, 1.6, 1, 0.5} × 1e-3; 0 is `scst`."
        },
    )
    psst_mode: str = field(
        default="psst",
        metadata={
            "help": "How the `psst` speaker passes words to the listener (`rlcaption.word_passing`): `st` "
            "(straight-through one-hots, ρ = 0), `psst` (the full distribution at a share `psst_rho` of the steps), "
            "`gumbel` (Gumbel-softmax vectors), `st_gumbel`, `psst_gumbel`, or `reinforce` (plain one-hots; the "
            "speaker is rewarded by the negated listener loss)."
        },
    )
    psst_rho: float = field(
        default=0.25,
        metadata={
            "help": "ρ of the `psst` and `psst_gumbel` modes: the probability that a step passes the full "
            "distribution instead of a straight-through one-hot. The paper finds 0.25 best; 0 and 1 are worse."
        },
    )
    gumbel_temperature: float = field(
        default=1.0,
        metadata={"help": "Temperature τ of the Gumbel-softmax in the `gumbel`, `st_gumbel` and `psst_gumbel` modes."},
    )
    listener_pretraining_steps: int = field(
        default=0,
        metadata={
            "help": "Steps at the start of a `psst` run where only the listener learns, from the words of the fixed "
            "speaker, by the hinge averaged over all negatives (the hardest-negative hinge of eq. 2 does not train a "
            "new listener); then the joint phase. 0: joint from the first step."
        },
    )
    listener_learning_rate: float = field(
        default=1e-3,
        metadata={
            "help": "Learning rate of the `psst` listener (its own optimizer parameter group, no weight decay), "
            "scheduled like `learning_rate`."
        },
    )

    # > wtf (seed 003: CLIP-guided RL with ground-truth captions, WTF-RL)
    wtf_variant: str = field(
        default="wtf_rl",
        metadata={
            "help": "Which trajectories `wtf` trains on (seed 003's Table 1): `wtf_rl` (eq. 3: the beam-search "
            "caption by RL plus the reward-weighted ground-truth caption), `wtf` (the weighted ground truth only), "
            "`rl` (the beam-search caption only), `rl_unidirectional` (`rl` with the image-to-text part r_i2t only), "
            "`scst_discriminator` (`rl` with the CLIP similarity minus the greedy caption's as similarity reward) "
            "or `tf` (unweighted teacher forcing of the ground truth, the control)."
        },
    )
    wtf_alpha: float = field(
        default=0.94,
        metadata={
            "help": "α of seed 003's reward `α · r_bicont + (1 − α) · p_D`: the contrastive CLIP reward against the "
            "discriminator's probability that the caption is human-written. The paper uses 0.94."
        },
    )
    wtf_num_beams: int = field(
        default=5,
        metadata={"help": "Beam size of the beam-search caption `wtf` trains on and the discriminator sees."},
    )
    reward_clip: str | None = field(
        default=None,
        metadata={
            "help": "The fixed CLIP (local folder or Hub id) of the `wtf` rewards, e.g. "
            "`checkpoints/shapes-clip-reward`: it embeds captions for the contrastive reward and the discriminator, "
            "and mines the training images' neighbours."
        },
    )
    contrastive_temperature: float | None = field(
        default=None,
        metadata={
            "help": "τ of seed 003's contrastive reward (eq. 2). The paper gives no value; by default the reward "
            "CLIP's own learned temperature `1 / exp(logit_scale)` (0.01 for OpenAI CLIP, as the authors' code uses), "
            "so that the reward follows the contrastive objective the CLIP was trained with."
        },
    )
    num_mined_neighbours: int = field(
        default=5,
        metadata={
            "help": "Most similar training images (CLIP image space, mined once before training and kept in "
            "`<output_dir>/mined_neighbours.safetensors`) added for each batch image to the images of `wtf`'s "
            "text-to-image reward; 0 uses the batch's images only."
        },
    )
    discriminator_learning_rate: float = field(
        default=7e-5,
        metadata={
            "help": "Learning rate of the `wtf` discriminator (its own optimizer parameter group, no weight decay), "
            "scheduled like `learning_rate`; 7e-5 as in the authors' code."
        },
    )
    discriminator_pretraining_steps: int = field(
        default=0,
        metadata={
            "help": "Optimizer steps at the start of `wtf` that train only the discriminator, to tell the ground "
            "truth from the fixed policy's beam-search captions (the paper pretrains it so that it guides the policy "
            "from the first step); then both train. 0: joint from the first step."
        },
    )
    discriminator_hidden_size: int = field(
        default=512,
        metadata={"help": "Hidden width of the `wtf` discriminator, a 3-layer MLP on the CLIP text embedding."},
    )

    # > actor_critic (seed 001: a policy network and a value network, the value as the baseline)
    value_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Learning rate of the `actor_critic` value network (its own optimizer parameter group, no weight "
            "decay), scheduled like `learning_rate`; `learning_rate` when unset. The value network is a regression "
            "that can learn faster than the policy."
        },
    )
    value_pretraining_steps: int = field(
        default=0,
        metadata={
            "help": "Optimizer steps at the start of `actor_critic` that regress the value network on the rewards of "
            "captions sampled from the fixed policy (seed 001's training step 3), so that joint training starts "
            "with a value network that predicts the reward; then both networks learn. 0: joint from the first step."
        },
    )
    value_loss_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the value network's mean squared error in the joint `actor_critic` loss. Only the "
            "value network receives this gradient; with Adam its step size is set by `value_learning_rate`, not by "
            "this weight."
        },
    )

    # > Logging
    log_completions: bool = field(
        default=True,
        metadata={
            "help": "At every training log, print a few of the captions RL objectives sampled, with their rewards, "
            "and log them as a table to Weights & Biases when it is in `report_to`."
        },
    )
    num_completions_to_print: int = field(
        default=3, metadata={"help": "Sampled captions shown at each log with `log_completions`."}
    )

    # > spider_pg (seed 000: SPIDEr policy gradient with Monte-Carlo rollouts and a learned baseline); validated by
    # the objective
    num_paths_per_image: int = field(
        default=1,
        metadata={
            "help": "Captions sampled per image and step by `spider_pg` (M in Liu et al. 2017, who use 1), each "
            "continued by `num_rollouts` rollouts from every prefix; `scst` samples `num_samples_per_image`."
        },
    )
    num_rollouts: int = field(
        default=3,
        metadata={
            "help": "Monte-Carlo rollouts continued from every prefix of a sampled caption by `spider_pg` to estimate "
            "Q (K in Liu et al. 2017, who use 3)."
        },
    )
    baseline_loss_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the baseline's mean squared error in the `spider_pg` loss. Only the baseline receives "
            "this gradient; with Adam its step size is set by `learning_rate`, not by this weight."
        },
    )

    baseline_pretraining_steps: int = field(
        default=0,
        metadata={
            "help": "Optimizer steps at the start of `spider_pg` that fit the baseline to Q with the policy fixed, "
            "so that joint training starts with a baseline that explains Q (an untrained one only adds noise)."
        },
    )
    baseline_hidden_size: int = field(
        default=512,
        metadata={"help": "Hidden width of the `spider_pg` baseline, an MLP on the captioner's hidden state."},
    )
    baseline_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Learning rate of the `spider_pg` baseline (its own optimizer parameter group, no weight decay); "
            "`learning_rate` when unset. The baseline is a regression that can learn faster than the policy."
        },
    )

    # > sle (seed 002: sequence-level exploration) and the entropy bonus of its SLL-ME baseline
    sle_alpha: float = field(
        default=0.75,
        metadata={
            "help": "Weight α of precision (the rewards) against diversity (the distances between an image's "
            "`num_samples_per_image` samples) in the `sle` loss, seed 002's eqs. 15-16: 1 is SCST with the greedy "
            "baseline, 0 trains for diversity alone. The paper uses 0.75."
        },
    )
    sle_distance: str = field(
        default="bleu",
        metadata={
            "help": "Distance d between two samples of an image in `sle`: `bleu`, 1 - (BLEU-3 + BLEU-4) / 2 of one "
            "caption against the other as its single reference (the paper's), or `edit`, the word-level edit "
            "distance divided by the longer caption's length."
        },
    )
    entropy_bonus_weight: float = field(
        default=0.0,
        metadata={
            "help": "Weight w of a maximum-entropy bonus in `scst`: the loss gets -w * H, H the mean entropy of the "
            "policy's next-word distributions at the prefixes of the sampled captions. 1e-2 gives seed 002's "
            "SLL-ME baseline; 0 disables it."
        },
    )

    # Changed defaults. Captions, references and image ids are not forward() arguments, so the Trainer must not
    # drop those columns.
    remove_unused_columns: bool = field(
        default=False,
        metadata={"help": "Kept False: objectives need the `captions` and `image_id` columns."},
    )
    # A recipe's loss is logged often enough to see RL progress on small datasets.
    logging_steps: float = field(default=10, metadata={"help": "Log every X update steps."})
    # Parts of a network may receive no gradient in a step (an auxiliary network in another phase of its objective,
    # a captioner's heads that an objective does not use); DDP must then look for unused parameters instead of
    # waiting for their gradients forever.
    ddp_find_unused_parameters: bool | None = field(
        default=True, metadata={"help": "Kept True: some parameters are unused in some steps or objectives."}
    )
    # same annotation order as TrainingArguments: HfArgumentParser reads the type after NoneType in the union
    report_to: None | str | list[str] = field(
        default="none", metadata={"help": "Integrations to report to; none by default (runs offline)."}
    )

    def __post_init__(self):
        # before the parent, which would import deepspeed or set FSDP up first
        for name, value in (("fsdp", self.fsdp), ("deepspeed", self.deepspeed)):
            if value:
                raise ValueError(
                    f"{name}={value!r} is not supported by RLCaptionTrainer: objectives decode with the whole model "
                    "and train auxiliary networks in the same optimizer, both only on replicated weights. Use DDP "
                    "(`accelerate launch --multi_gpu`); the library's captioners fit on one device."
                )
        super().__post_init__()
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline={self.baseline!r} is not one of {BASELINES}.")
        if self.loss_normalization not in LOSS_NORMALIZATIONS:
            raise ValueError(f"loss_normalization={self.loss_normalization!r} is not one of {LOSS_NORMALIZATIONS}.")
        if self.num_samples_per_image < 1:
            raise ValueError(f"num_samples_per_image must be >= 1, got {self.num_samples_per_image}.")
        if self.baseline == "mean_of_others" and self.num_samples_per_image < 2:
            raise ValueError("baseline='mean_of_others' needs num_samples_per_image >= 2.")
        if not 0.0 <= self.sle_alpha <= 1.0:
            raise ValueError(f"sle_alpha must be in [0, 1] (1 is precision only), got {self.sle_alpha}.")
        if self.sle_distance not in PAIRWISE_DISTANCES:
            raise ValueError(f"sle_distance={self.sle_distance!r} is not one of {PAIRWISE_DISTANCES}.")
        if self.objective == "sle" and self.num_samples_per_image < 2:
            raise ValueError(
                f"objective='sle' compares the samples of each image with each other: it needs "
                f"num_samples_per_image >= 2, got {self.num_samples_per_image} (the paper uses 5)."
            )
        if self.entropy_bonus_weight < 0:
            raise ValueError(f"entropy_bonus_weight must be >= 0 (0 disables it), got {self.entropy_bonus_weight}.")
        if self.entropy_bonus_weight > 0 and self.objective != "scst":
            raise ValueError(
                f"entropy_bonus_weight={self.entropy_bonus_weight} applies to objective='scst' only, got "
                f"objective={self.objective!r}; set it to 0 or train with scst."
            )
        if not self.reward_funcs:
            raise ValueError("reward_funcs is empty: name at least one reward, e.g. ['cider'].")
        if self.baseline_pretraining_steps < 0:
            raise ValueError(f"baseline_pretraining_steps must be >= 0, got {self.baseline_pretraining_steps}.")
        if self.baseline_hidden_size < 1:
            raise ValueError(f"baseline_hidden_size must be >= 1, got {self.baseline_hidden_size}.")
        if self.baseline_learning_rate is not None and self.baseline_learning_rate <= 0:
            raise ValueError(f"baseline_learning_rate must be > 0 or None, got {self.baseline_learning_rate}.")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1.0 disables it), got {self.top_p}.")
        if self.max_caption_length < 1:
            raise ValueError(f"max_caption_length must be >= 1, got {self.max_caption_length}.")
        if self.eval_num_beams < 1:
            raise ValueError(f"eval_num_beams must be >= 1, got {self.eval_num_beams}.")
        if isinstance(self.eval_metrics, str):
            self.eval_metrics = [self.eval_metrics]
        _, diversity_metrics = split_eval_metrics(self.eval_metrics)
        for name in diversity_metrics:
            if name in SET_DIVERSITY_METRICS and self.eval_num_beams < 2:
                raise ValueError(
                    f"eval_metrics names {name!r}, which compares the beams of each image: it needs eval_num_beams "
                    f">= 2, got eval_num_beams={self.eval_num_beams}."
                )
        if isinstance(self.eval_caption_sets, str):
            self.eval_caption_sets = [self.eval_caption_sets]
        unknown_sets = [name for name in self.eval_caption_sets if name not in ("sample", "beam")]
        if unknown_sets:
            raise ValueError(f"eval_caption_sets: unknown decoding {unknown_sets[0]!r}; choose among sample, beam.")
        if self.eval_caption_sets and self.eval_caption_set_size < 2:
            raise ValueError(
                f"eval_caption_set_size must be >= 2 to measure the diversity of a set, got "
                f"{self.eval_caption_set_size}."
            )
        if self.eval_clip is not None and not self.eval_clip:
            raise ValueError("eval_clip='' names no CLIP: give a folder or Hub id, or None for no CLIP metrics.")
        if self.num_completions_to_print < 1:
            raise ValueError(f"num_completions_to_print must be >= 1, got {self.num_completions_to_print}.")
        from ..word_passing import WORD_PASSING_MODES

        if not 0.0 <= self.psst_lambda <= 1.0:
            raise ValueError(f"psst_lambda weighs two losses and must be in [0, 1], got {self.psst_lambda}.")
        if self.psst_mode not in WORD_PASSING_MODES:
            raise ValueError(f"psst_mode={self.psst_mode!r} is not one of {WORD_PASSING_MODES}.")
        if not 0.0 <= self.psst_rho <= 1.0:
            raise ValueError(f"psst_rho is a probability and must be in [0, 1], got {self.psst_rho}.")
        if self.gumbel_temperature <= 0:
            raise ValueError(f"gumbel_temperature must be > 0, got {self.gumbel_temperature}.")
        if self.listener_learning_rate <= 0:
            raise ValueError(f"listener_learning_rate must be > 0, got {self.listener_learning_rate}.")
        if self.listener_pretraining_steps < 0:
            raise ValueError(f"listener_pretraining_steps must be >= 0, got {self.listener_pretraining_steps}.")
        from ..objectives.wtf import WTF_VARIANTS

        if self.wtf_variant not in WTF_VARIANTS:
            raise ValueError(f"wtf_variant={self.wtf_variant!r} is not one of {WTF_VARIANTS}.")
        if not 0.0 <= self.wtf_alpha <= 1.0:
            raise ValueError(f"wtf_alpha weighs two rewards and must be in [0, 1], got {self.wtf_alpha}.")
        if self.wtf_num_beams < 1:
            raise ValueError(f"wtf_num_beams must be >= 1, got {self.wtf_num_beams}.")
        if self.reward_clip is not None and not self.reward_clip:
            raise ValueError("reward_clip='' names no CLIP: give a folder or Hub id (checkpoints/shapes-clip-reward).")
        if self.objective == "wtf" and self.reward_clip is None:
            raise ValueError(
                "objective='wtf' rewards captions with a CLIP: set reward_clip to a folder or Hub id (e.g. "
                "checkpoints/shapes-clip-reward)."
            )
        if self.contrastive_temperature is not None and self.contrastive_temperature <= 0:
            raise ValueError(
                f"contrastive_temperature must be > 0, or None for the CLIP's own; got {self.contrastive_temperature}."
            )
        if self.num_mined_neighbours < 0:
            raise ValueError(f"num_mined_neighbours must be >= 0, got {self.num_mined_neighbours}.")
        if self.discriminator_learning_rate <= 0:
            raise ValueError(f"discriminator_learning_rate must be > 0, got {self.discriminator_learning_rate}.")
        if self.discriminator_pretraining_steps < 0:
            raise ValueError(
                f"discriminator_pretraining_steps must be >= 0, got {self.discriminator_pretraining_steps}."
            )
        if self.discriminator_hidden_size < 1:
            raise ValueError(f"discriminator_hidden_size must be >= 1, got {self.discriminator_hidden_size}.")
        if self.value_learning_rate is not None and self.value_learning_rate <= 0:
            raise ValueError(f"value_learning_rate must be > 0 or None, got {self.value_learning_rate}.")
        if self.value_pretraining_steps < 0:
            raise ValueError(f"value_pretraining_steps must be >= 0, got {self.value_pretraining_steps}.")
        if self.value_loss_weight < 0:
            raise ValueError(f"value_loss_weight must be >= 0, got {self.value_loss_weight}.")
