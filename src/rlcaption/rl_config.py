"""
Training arguments of [`RLCaptionTrainer`]: the usual `TrainingArguments` plus the fields every method shares
(objective, rewards, sampling, evaluation, logging). Each RL method adds its own fields in its own config class, the
TRL way, beside its objective: `SCSTConfig`, `SLEConfig`, `SpiderPGConfig`, `WTFConfig`, `PSSTConfig`,
`ActorCriticConfig` (`rlcaption.objectives`), so that a config holds its method's options only.

A config is built as `RLCaptionConfig(objective=name, ...)`: the call returns an instance of that objective's class,
as `AutoConfig` builds a model's, so that one call configures any method; an option of another method is refused with
the class that has it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainingArguments

from .metrics.corpus import AVAILABLE_METRICS, resolve_metric_names
from .rewards.registry import available_rewards

__all__ = ["DIVERSITY_METRICS", "RLCaptionConfig", "register_objective_config", "split_eval_metrics"]

LOSS_NORMALIZATIONS = ("token", "sequence")
# `eval_metrics` names of the diversity metrics (`rlcaption.evaluation.diversity_scores`).
DIVERSITY_METRICS = ("div_1", "div_2", "mbleu_4", "self_bleu", "distinct_captions")
# The diversity metrics that compare the `eval_num_beams` best beams of each image with each other.
SET_DIVERSITY_METRICS = ("div_1", "div_2", "mbleu_4")
# The objectives whose loss gets `beta` · KL(π‖π_ref) on the captions they sample (or decode) from the policy.
KL_PENALTY_OBJECTIVES = ("scst", "sle", "wtf")
# Why the others refuse `beta > 0`.
_WITHOUT_KL_PENALTY = {
    "xe": "teacher forcing trains on the references, not on captions the policy sampled, and already keeps to the "
    "language of the references",
    "spider_pg": "its advantages come from Monte-Carlo rollouts at every token of a recurrent captioner, a loss the "
    "per-caption penalty is not defined for",
    "psst": "its word-passing listener trains through the speaker's soft words, a loss the per-caption penalty is not "
    "defined for (its naturalness term is SCST's loss without the penalty)",
    "actor_critic": "its value network learns the rewards the policy collects; a penalty in the policy loss alone "
    "would make the critic's targets wrong",
}


# objective name -> the config class that holds its options; filled by `register_objective`
_OBJECTIVE_CONFIGS: dict[str, type[RLCaptionConfig]] = {}


def register_objective_config(objective: str, config_class: type[RLCaptionConfig]) -> None:
    """Records which config class configures `objective` (called by `rlcaption.objectives.register_objective`)."""
    _OBJECTIVE_CONFIGS[objective] = config_class


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

    Label smoothing for the `xe` objective is the inherited `label_smoothing_factor`. Without an
    `accelerator_config`, batches are copied to the GPU without blocking (`{"non_blocking": True}`, from the pinned
    memory of `dataloader_pin_memory`): a blocking copy waits for the previous step's work on the device. On the CPU
    neither applies: memory is not pinned and copies block.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        # RLCaptionConfig(objective="wtf", ...) is a WTFConfig; Python then runs that class's __init__ on the kwargs
        objective = kwargs.get("objective")
        if cls is RLCaptionConfig and objective in _OBJECTIVE_CONFIGS:
            cls = _OBJECTIVE_CONFIGS[objective]
        known = {option.name for option in dataclasses.fields(cls)}
        for name in kwargs:
            if name not in known:
                raise TypeError(f"{cls.__name__} has no option {name!r}{_where_the_option_is(name)}.")
        return super().__new__(cls)

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

    reward_processes: int = field(
        default=0,
        metadata={
            "help": "Worker processes that compute the rewards which score each caption on its own (CIDEr-D, BLEU, "
            "ROUGE-L; see `RewardMix.use_processes`), each on a share of a step's captions: on a GPU these Python "
            "rewards can cost a step more than the model's forward and backward. 0: in the training process. "
            'Each training process starts its own; a training script then needs the `if __name__ == "__main__":` '
            "guard."
        },
    )

    # > Sampling
    num_samples_per_image: int = field(
        default=5,
        metadata={
            "help": "Captions sampled per image and step by `scst`, `sle` and `actor_critic` (k, s in Chen & Jin "
            "2020; 5 as in self-critical.pytorch and the paper). `spider_pg` "
            "has its own count, `num_paths_per_image`: each of its samples also costs `num_rollouts` rollouts per "
            "token and the paper samples 1, so one setting for both would change one method's cost and recipe "
            "whenever a configuration is switched to the other objective."
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
    prompt: str | None = field(
        default=None,
        metadata={
            "help": "The caption prompt of a prompted captioner (Florence-2's task token, PaliGemma's prefix, the "
            "instruction of a chat model's user turn); the family's default when unset (`<CAPTION>`, `caption en`, "
            "'Describe this image in one sentence.', none for BLIP-2). Refused for models that take no prompt."
        },
    )

    # > KL penalty to the starting policy
    beta: float = field(
        default=0.0,
        metadata={
            "help": "Weight β of a KL penalty to the starting policy (TRL's name): the loss of `scst`, `sle` and "
            "`wtf` gets β · KL(π‖π_ref), estimated on every token of the policy's sampled captions with k3 = "
            "exp(r) - r - 1, r = log π_ref - log π (Schulman 2020), averaged over tokens as the policy loss is "
            "(`loss_normalization`) and logged as `kl`, so that a reward cannot drag the language model away from "
            "its language. The reference is the model as the trainer received it: with `use_peft`, the same model "
            "with its adapters disabled; otherwise a frozen copy, made once. 0 disables it (no reference, no extra "
            "forward pass)."
        },
    )

    # > LoRA adapters through peft (the names of TRL's `ModelConfig`)
    use_peft: bool = field(
        default=False,
        metadata={
            "help": "Train LoRA adapters (peft) instead of the whole captioner: the trainer wraps the model with "
            "`peft.get_peft_model`, only the adapters train and are saved in checkpoints and in the final folder "
            "(which loads with `PeftModel.from_pretrained(base_model, folder)`). A `PeftModel` given to the trainer "
            "trains as it is, without this flag."
        },
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank r of the adapters."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling α: the adapters' update is scaled by α / r."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA adapters' input."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "Names (or name suffixes) of the modules that get adapters, e.g. `query value`; unset, every "
            "linear layer except the output layer (peft's `all-linear`), since captioner families name their "
            "attention projections differently."
        },
    )
    save_merged_model: bool = field(
        default=False,
        metadata={
            "help": "With `use_peft`, `save_model()` also writes the model with its adapters merged into the base "
            "weights to `<folder>/merged`, a plain transformers folder (with the processor) that loads with "
            "`from_pretrained` and needs no peft."
        },
    )

    # > Learning-rate schedule, besides the Trainer's `lr_scheduler_type` and warmup
    lr_decay_factor: float = field(
        default=1.0,
        metadata={
            "help": "Step decay on top of `lr_scheduler_type`: every `lr_decay_epochs` epochs of captioner training "
            "the learning rates are multiplied by this factor. Ren et al. 2017 decay by 0.9 every 2 epochs with an "
            "otherwise constant rate (`--lr_scheduler_type constant --lr_decay_factor 0.9 --lr_decay_epochs 2`). "
            "1.0: no step decay."
        },
    )
    lr_decay_epochs: float = field(
        default=2.0,
        metadata={"help": "Epochs of captioner training between two `lr_decay_factor` decays."},
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
            "and/or as the top of a beam search of that width (`beam`), and score each set as Chen & Jin's Table 4 "
            "does: mean CIDEr-D, Div-1, Div-2, mBLEU-4 and, with scenes, object F1, logged as `eval_sample5_CIDEr`, "
            "`eval_beam5_Div-2`, ... Sampling is seeded with `seed`, so every evaluation draws alike."
        },
    )
    eval_caption_set_size: int = field(
        default=5, metadata={"help": "Captions per image of each `eval_caption_sets` set (5 in Chen & Jin 2020)."}
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
    # RLCaptionTrainer stops at a non-finite loss with an error, so there is none to leave out of the logged loss; the
    # Trainer's filter would wait for the device at every step to look for one
    logging_nan_inf_filter: bool = field(
        default=False, metadata={"help": "Kept False: a non-finite loss stops training with an error."}
    )
    # same annotation order as TrainingArguments: HfArgumentParser reads the type after NoneType in the union
    report_to: None | str | list[str] = field(
        default="none", metadata={"help": "Integrations to report to; none by default (runs offline)."}
    )

    def __post_init__(self):
        # before the parent, which would import deepspeed or set FSDP up first
        if self.deepspeed:
            raise ValueError(
                f"deepspeed={self.deepspeed!r} is not supported by RLCaptionTrainer: objectives decode with the whole "
                "model and train auxiliary networks in the same optimizer. Use DDP (`accelerate launch --multi_gpu`), "
                "or FSDP2 (`accelerate launch --config_file examples/accelerate/fsdp.yaml`)."
            )
        if self.fsdp:
            raise ValueError(
                f"fsdp={self.fsdp!r} is not supported by RLCaptionTrainer: the Trainer's own FSDP setup is FSDP1, "
                "whose flat parameters generate() cannot run on. Shard with accelerate's FSDP2 instead (`accelerate "
                "launch --config_file examples/accelerate/fsdp.yaml`), or use DDP (`accelerate launch --multi_gpu`)."
            )
        # Pinned memory and copies that do not block serve a GPU. On the CPU (`use_cpu`, or no GPU at all) pinning
        # finds no accelerator, and `non_blocking` without pinned memory draws a Trainer warning at every run.
        copies_to_a_gpu = _batches_go_to_a_gpu(self.use_cpu)
        if not copies_to_a_gpu:
            self.dataloader_pin_memory = False
        if self.accelerator_config is None:
            self.accelerator_config = {"non_blocking": copies_to_a_gpu}
        super().__post_init__()
        config_class = _OBJECTIVE_CONFIGS.get(self.objective)
        if config_class is None:
            raise ValueError(
                f"objective={self.objective!r} is unknown; valid objectives: {sorted(_OBJECTIVE_CONFIGS)}."
            )
        built_as = _registered_class_of(type(self))
        if built_as is not config_class:
            raise ValueError(
                f"objective={self.objective!r} takes its options from {config_class.__name__}, not "
                f"{built_as.__name__}: build it as RLCaptionConfig(objective={self.objective!r}, ...)."
            )
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}.")
        functions = [func for func in self.reward_funcs if not isinstance(func, str)]
        if functions:
            raise ValueError(
                f"reward_funcs holds {functions[0]!r}, which is not a reward name: a config names built-in rewards "
                "only (it is parsed from the command line and saved as JSON). Pass reward functions to the trainer "
                "instead, with the names: `RLCaptionTrainer(..., reward_funcs=['cider', my_function])`."
            )
        unknown_rewards = [name for name in self.reward_funcs if name not in available_rewards()]
        if unknown_rewards:
            raise ValueError(
                f"reward_funcs names an unknown reward {unknown_rewards[0]!r}; built-in rewards: "
                f"{available_rewards()} (pass your own as callables to the trainer's `reward_funcs`)."
            )
        if self.loss_normalization not in LOSS_NORMALIZATIONS:
            raise ValueError(f"loss_normalization={self.loss_normalization!r} is not one of {LOSS_NORMALIZATIONS}.")
        if self.num_samples_per_image < 1:
            raise ValueError(f"num_samples_per_image must be >= 1, got {self.num_samples_per_image}.")
        self._check_kl_penalty_and_lora()
        if not self.reward_funcs:
            raise ValueError("reward_funcs is empty: name at least one reward, e.g. ['cider'].")
        if self.reward_processes < 0:
            raise ValueError(
                f"reward_processes must be >= 0 (0: rewards in the training process), got {self.reward_processes}."
            )
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}.")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1.0 disables it), got {self.top_p}.")
        if self.max_caption_length < 1:
            raise ValueError(f"max_caption_length must be >= 1, got {self.max_caption_length}.")
        if not 0.0 < self.lr_decay_factor <= 1.0:
            raise ValueError(f"lr_decay_factor must be in (0, 1] (1.0: no step decay), got {self.lr_decay_factor}.")
        if self.lr_decay_epochs <= 0:
            raise ValueError(f"lr_decay_epochs must be > 0, got {self.lr_decay_epochs}.")
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

    def _check_kl_penalty_and_lora(self) -> None:
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0 (0 disables the KL penalty), got {self.beta}.")
        if self.beta > 0 and self.objective not in KL_PENALTY_OBJECTIVES:
            reason = _WITHOUT_KL_PENALTY.get(self.objective, "it adds no KL penalty to its loss")
            raise ValueError(
                f"beta={self.beta} asks for a KL penalty, which objective={self.objective!r} does not apply: "
                f"{reason}. The objectives {KL_PENALTY_OBJECTIVES} apply it; or set beta=0."
            )
        if self.lora_r < 1:
            raise ValueError(f"lora_r must be >= 1, got {self.lora_r}.")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}.")
        if isinstance(self.lora_target_modules, str):
            self.lora_target_modules = [self.lora_target_modules]
        if self.save_merged_model and not self.use_peft:
            raise ValueError(
                "save_merged_model=True merges LoRA adapters into the base weights, but use_peft is False: set "
                "--use_peft, or leave save_merged_model unset (a model trained whole is saved whole)."
            )


def _batches_go_to_a_gpu(use_cpu: bool) -> bool:
    """Whether training batches will be copied to a GPU: one is present and `use_cpu` does not keep them off it."""
    return not use_cpu and torch.cuda.is_available()


def _registered_class_of(config_class: type[RLCaptionConfig]) -> type[RLCaptionConfig]:
    """The most derived config class of an objective that `config_class` is, or extends (a user's subclass of
    `SCSTConfig` is one of SCST), so that a config of one method never runs another."""
    registered = set(_OBJECTIVE_CONFIGS.values())
    return next(base for base in config_class.__mro__ if base in registered or base is RLCaptionConfig)


def _where_the_option_is(name: str) -> str:
    """`"; it is an option of WTFConfig (objective='wtf')"` for an option of other methods' configs, else ``."""
    owners = [
        f"{config_class.__name__} (objective={objective!r})"
        for objective, config_class in sorted(_OBJECTIVE_CONFIGS.items())
        if name in {option.name for option in dataclasses.fields(config_class)}
    ]
    return f"; it is an option of {' and '.join(owners)}" if owners else ""
