"""[`RLCaptionTrainer`]: one `transformers.Trainer` for teacher forcing and every RL objective of the library."""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import GenerationConfig, Trainer, TrainerCallback, TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput
from transformers.utils import logging

from .. import objectives as _objectives  # noqa: F401  (registers the built-in objectives)
from ..data.collator import CaptionCollator
from ..generation.captioners import captioner_for, gather_parameters_in_methods
from ..generation.decoding import GeneratedCaptions, generate_caption_sets, generate_captions
from ..hub import HUB_CONNECTION_ERRORS
from ..objectives.base import AuxiliaryNetwork, get_objective_class
from ..rl_config import RLCaptionConfig
from .caption_evaluation import CaptionEvaluationMixin
from .learning_rate_schedule import captioner_step_schedule
from .lora import (
    FrozenEmbeddingsUnderCheckpointing,
    ReferencePolicy,
    is_peft_model,
    merged_model_folder,
    save_merged_model,
    with_lora,
)
from .reward_scoring import RewardLike, RewardScoringMixin

__all__ = [
    "AUXILIARY_NETWORKS_NAME",
    "RLCaptionTrainer",
    "check_data_parallel",
    "last_complete_checkpoint",
]

logger = logging.get_logger(__name__)

# Files a checkpoint folder must hold to be resumable; the trainer state is written last.
_CHECKPOINT_COMPLETE_MARKER = "trainer_state.json"
# The objective's auxiliary networks, beside the model's weights in every checkpoint.
AUXILIARY_NETWORKS_NAME = "auxiliary_networks.safetensors"
# under FSDP, the auxiliary networks' own optimizer (elsewhere their groups are in the captioner's optimizer)
AUXILIARY_OPTIMIZER_NAME = "auxiliary_optimizer.pt"

# Trainer arguments that RLCaptionTrainer would ignore: the objective computes the loss, and evaluation scores decoded
# captions with `eval_metrics`, never logits.
_UNUSED_TRAINER_ARGUMENTS = {
    "compute_loss_func": "the objective named by `args.objective` computes the loss",
    "compute_metrics": "evaluation scores the decoded captions with `args.eval_metrics`",
    "preprocess_logits_for_metrics": "evaluation scores the decoded captions with `args.eval_metrics`",
}


def last_complete_checkpoint(output_dir: str) -> str | None:
    """
    The newest `checkpoint-<step>` folder of `output_dir` that was written to the end (its trainer state exists).
    A folder left half-written by an interrupted save is skipped with a warning, never trusted.
    """
    if not os.path.isdir(output_dir):
        return None
    pattern = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
    steps = sorted((int(match.group(1)), name) for name in os.listdir(output_dir) if (match := pattern.match(name)))
    for _, name in reversed(steps):
        folder = os.path.join(output_dir, name)
        if os.path.isfile(os.path.join(folder, _CHECKPOINT_COMPLETE_MARKER)):
            return folder
        logger.warning(
            f"Skipping incomplete checkpoint {folder} (no {_CHECKPOINT_COMPLETE_MARKER}; interrupted save)."
        )
    return None


def check_data_parallel(accelerator_state: Any) -> None:
    """
    Refuses the ways of sharding a run that objectives cannot train under, however they were set up (`accelerate
    launch --use_deepspeed` or `--use_fsdp` included; `RLCaptionConfig` refuses its own `deepspeed` and `fsdp` fields):
    DeepSpeed, FSDP1, and `--use_fsdp` on CPU processes. DDP and accelerate's FSDP2 (`fsdp_version: 2`, full sharding)
    pass.
    """
    if getattr(accelerator_state, "deepspeed_plugin", None) is not None:
        raise ValueError(
            "DeepSpeed is not supported by RLCaptionTrainer: objectives decode with the whole model and train "
            "auxiliary networks in the same optimizer. Use DDP (`accelerate launch --multi_gpu`), or FSDP2 for a "
            "captioner that does not fit one device (`accelerate launch --config_file examples/accelerate/fsdp.yaml`)."
        )
    fsdp_plugin = getattr(accelerator_state, "fsdp_plugin", None)
    if fsdp_plugin is not None and getattr(fsdp_plugin, "fsdp_version", 1) != 2:
        raise ValueError(
            f"FSDP version {fsdp_plugin.fsdp_version} is not supported by RLCaptionTrainer: generate() runs on the "
            "sharded captioner through FSDP2's hooks (`fully_shard`), which FSDP1's flat parameters do not have. Set "
            "`fsdp_version: 2` in the accelerate config (`--fsdp_version 2`), as examples/accelerate/fsdp.yaml does."
        )
    if fsdp_plugin is None and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        # accelerate applies its FSDP plugin to accelerator devices only: CPU processes would train replicated
        raise ValueError(
            "`accelerate launch --use_fsdp` was given, but accelerate does not shard CPU processes (it runs them as "
            "DDP replicas). Train on GPUs without --use_cpu, or launch CPU processes with --multi_gpu (DDP)."
        )


def _unit_classes_present_only(model: nn.Module) -> None:
    """
    FSDP2 makes a unit of every module whose class the model lists in `_no_split_modules`, and fails on a listed class
    it cannot find. An objective takes its auxiliary network out of the model it trains (a PolicyValueCaptioner's value
    network, a SpeakerListener's listener): the model then lists only the classes it still holds.
    """
    declared = getattr(model, "_no_split_modules", None)
    if declared:
        present = {type(module).__name__ for module in model.modules()}
        model._no_split_modules = [name for name in declared if name in present]


class _AuxiliaryNetworksStep(TrainerCallback):
    """At every optimizer step: under FSDP, steps the auxiliary networks' own optimizer; then zeroes their gradients,
    as the Trainer zeroes the model's (without it they would add up over the whole run)."""

    def __init__(self, trainer: RLCaptionTrainer):
        self.trainer = trainer

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.trainer._auxiliary_optimizer is not None:
            self.trainer._step_auxiliary_optimizer()
        for network in self.trainer._auxiliary_networks.values():
            network.module.zero_grad(set_to_none=True)


# optimizers that update the weights during the backward pass (fused LOMO, layer-wise GaLore and APOLLO): the loss is
# checked before it
_OPTIMIZERS_STEPPING_IN_BACKWARD = {
    "lomo", "adalomo", "galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise",
    "apollo_adamw_layerwise",
}  # fmt: skip


def _on_the_host(recorded: Mapping[str, list[float | torch.Tensor]]) -> list[tuple[str, list[float]]]:
    """The recorded metrics as floats, the tensors among them copied to the host together, one copy per device."""
    tensors = [value for values in recorded.values() for value in values if isinstance(value, torch.Tensor)]
    host_values: dict[int, float] = {}
    for device in {tensor.device for tensor in tensors}:
        on_device = [tensor for tensor in tensors if tensor.device == device]
        floats = torch.stack([tensor.float().reshape(()) for tensor in on_device]).tolist()
        host_values.update(zip(map(id, on_device), floats, strict=True))
    return [
        (name, [host_values[id(value)] if isinstance(value, torch.Tensor) else float(value) for value in values])
        for name, values in recorded.items()
    ]


class RLCaptionTrainer(RewardScoringMixin, CaptionEvaluationMixin, Trainer):
    """
    Trains a captioning model with the objective named by `args.objective` (`xe`, `scst`, ...).

    The objective computes the loss of a batch; this class provides what objectives share: sampling and greedy
    decoding, reward computation with per-reward logging, metric recording (averaged over processes), logging of
    sampled captions, generation-based evaluation and prediction, and the resumable-checkpoint logic. Backward,
    gradient accumulation, mixed precision and DDP stay the Trainer's.

    The arguments come in the order of `transformers.Trainer`'s; `reward_funcs` and the Trainer's later arguments
    (`callbacks`, `optimizers`, ...) are keyword-only.

    Args:
        model: a captioning model with `generate()` (ours, or a transformers encoder-decoder captioner).
        args ([`RLCaptionConfig`]): the training configuration.
        data_collator: defaults to [`CaptionCollator`].
        train_dataset / eval_dataset: datasets with `image` (or `pixel_values`/`image_features`), `captions`,
            `image_id` columns.
        processing_class: the processor (tokenizer + image processor) used to tokenize references and decode.
        reward_funcs: reward names and/or callables `f(completions=..., references=..., **columns) -> list[float]`;
            `args.reward_funcs` when `None`.
    """

    def __init__(
        self,
        model: nn.Module,
        args: RLCaptionConfig,
        data_collator: Callable | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class: Any = None,
        *,
        reward_funcs: RewardLike | Sequence[RewardLike] | None = None,
        **kwargs: Any,
    ):
        if not isinstance(args, RLCaptionConfig):
            raise TypeError(f"args must be an RLCaptionConfig, got {type(args).__name__}.")
        if processing_class is None:
            raise ValueError(
                "RLCaptionTrainer needs the processor (processing_class) to tokenize and decode captions."
            )
        for name, reason in _UNUSED_TRAINER_ARGUMENTS.items():
            if kwargs.get(name) is not None:
                raise ValueError(f"RLCaptionTrainer does not take {name}: {reason}.")
        objective_class = get_objective_class(args.objective)  # fails early on an unknown name
        if args.use_peft:
            model = with_lora(model, args)
        # The model's start and end tokens, not the tokenizer's (a BERT tokenizer has neither; BLIP starts with its
        # own bos); refuses a model it cannot caption with, naming what is missing.
        captioner = captioner_for(model)
        caption_tokens = captioner.tokens
        # a prompted family's default prompt, or args.prompt; refused for a family that takes none
        prompt = captioner.prompt_text(processing_class, args.prompt)
        if data_collator is None:
            data_collator = CaptionCollator(
                processing_class,
                captions_per_image=args.xe_captions_per_image,
                # the start token, then at most as many tokens as decoding generates (the end token included)
                max_length=args.max_caption_length + 1,
                caption_tokens=caption_tokens,
                prompt=prompt,
            )
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            **kwargs,
        )
        check_data_parallel(self.accelerator.state)
        self._prepare_evaluation(eval_dataset)
        # Objectives return a per-batch mean: the Trainer divides it by the accumulation steps.
        self.loss_is_scaled_for_ga = False
        self._recorded_metrics: dict[str, list[float]] = defaultdict(list)
        # a few captions of the latest sampling, with their rewards, for the next training log
        self._completions_to_log: list[dict[str, Any]] = []
        self.eos_token_id = caption_tokens.end_token_id
        self.reward_mix = None
        if objective_class.uses_rewards:
            self.reward_mix = self._build_reward_mix(reward_funcs, train_dataset)
        self.objective = objective_class(self)
        # the starting policy, for the KL penalty: taken now, before a resumed run loads its checkpoint
        self.reference_policy = ReferencePolicy(self.unwrap_model(self.model)) if args.beta > 0 else None
        self._auxiliary_networks = self._checked_auxiliary_networks(self.objective.auxiliary_networks())
        self._wrapped_auxiliary_networks: dict[str, nn.Module] = {}
        # under FSDP the auxiliary networks are replicated beside the sharded captioner, with their own optimizer
        self._auxiliary_optimizer: torch.optim.Optimizer | None = None
        if self.is_fsdp_enabled:
            _unit_classes_present_only(self.model)
            if self._auxiliary_networks and args.fp16:
                raise ValueError(
                    f"Under FSDP the {args.objective!r} objective's auxiliary networks have an optimizer of their "
                    "own, which float16's loss scaling does not reach: train with --bf16 (or in float32)."
                )
        if self._auxiliary_networks:
            self.add_callback(_AuxiliaryNetworksStep(self))
        if is_peft_model(self.unwrap_model(self.model)):
            self.add_callback(FrozenEmbeddingsUnderCheckpointing())

    # ------------------------------------------------------------------ auxiliary networks
    def _checked_auxiliary_networks(self, networks: Mapping[str, AuxiliaryNetwork]) -> dict[str, AuxiliaryNetwork]:
        model_parameters = {id(parameter) for parameter in self.model.parameters()}
        for name, network in networks.items():
            where = f"Auxiliary network {name!r} of the {self.args.objective!r} objective"
            if not isinstance(network, AuxiliaryNetwork):
                raise TypeError(f"{where} must be an AuxiliaryNetwork, got {type(network).__name__}.")
            if not name.isidentifier():
                raise ValueError(f"{where}: names must be Python identifiers (they prefix its checkpoint keys).")
            if not any(parameter.requires_grad for parameter in network.module.parameters()):
                raise ValueError(
                    f"{where} has no trainable parameter. A network that is only read (a reward model) belongs in "
                    "the reward, frozen; it is then never optimised nor saved in checkpoints."
                )
            if any(id(parameter) in model_parameters for parameter in network.module.parameters()):
                raise ValueError(f"{where} shares parameters with the model; they would be optimised twice.")
            if any(parameter.is_meta for parameter in network.module.parameters()):
                # loaded empty on this process (FSDP's memory-efficient loading): filled from the main process's
                # weights when first used, see auxiliary_network
                network.module.to_empty(device=self.args.device)
            else:
                network.module.to(self.args.device)
        return dict(networks)

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        """The network inside a DDP or mixed-precision wrapper (itself without one)."""
        return self.accelerator.unwrap_model(model)

    def auxiliary_network(self, name: str) -> nn.Module:
        """
        The objective's auxiliary network `name`, prepared by accelerate for this run (DDP across processes, mixed
        precision): call it, or [`forward_through`] it, inside `compute_loss` so its gradients are synchronised. The
        first call wraps it, on every process at the same step, since phases are a function of the step.
        """
        if name not in self._auxiliary_networks:
            raise ValueError(
                f"The {self.args.objective!r} objective declared no auxiliary network {name!r}; it has "
                f"{sorted(self._auxiliary_networks)}."
            )
        if name not in self._wrapped_auxiliary_networks:
            module = self._auxiliary_networks[name].module
            if not self.is_fsdp_enabled:
                module = self.accelerator.prepare_model(module)
            elif self.accelerator.num_processes > 1:
                # as DDP does when it wraps a network: every process starts from the main process's weights (FSDP's
                # memory-efficient loading leaves them empty on the others)
                for tensor in [*module.parameters(), *module.buffers()]:
                    torch.distributed.broadcast(tensor.data, src=0)
            self._wrapped_auxiliary_networks[name] = module
        return self._wrapped_auxiliary_networks[name]

    def auxiliary_state_dict(self) -> dict[str, torch.Tensor]:
        """Every auxiliary network's weights, keyed `<network>.<parameter>`, as checkpoints store them."""
        return {
            f"{name}.{key}": tensor.detach().contiguous().cpu()
            for name, network in self._auxiliary_networks.items()
            for key, tensor in network.module.state_dict().items()
        }

    def _save_auxiliary_networks(self, output_dir: str) -> None:
        # written to a temporary name and renamed: a kill during the save never leaves a truncated file under the
        # real name (and the checkpoint counts as complete only once the trainer state is written, after this)
        path = os.path.join(output_dir, AUXILIARY_NETWORKS_NAME)
        save_file(self.auxiliary_state_dict(), path + ".tmp", metadata={"format": "pt"})
        os.replace(path + ".tmp", path)

    def _load_auxiliary_networks(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, AUXILIARY_NETWORKS_NAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{checkpoint} has no {AUXILIARY_NETWORKS_NAME}, but the {self.args.objective!r} objective trains "
                f"{sorted(self._auxiliary_networks)}: resume from a checkpoint written by this objective."
            )
        saved = load_file(path)
        for name, network in self._auxiliary_networks.items():
            prefix = f"{name}."
            weights = {key[len(prefix) :]: tensor for key, tensor in saved.items() if key.startswith(prefix)}
            network.module.load_state_dict(weights, strict=True)

    # ------------------------------------------------------------------ decoding
    def _generation_model(self) -> nn.Module:
        return self.unwrap_model(self.model)

    def sample_captions(
        self, image_inputs: Mapping[str, torch.Tensor], num_return_sequences: int, trim: bool = True
    ) -> GeneratedCaptions:
        """
        `num_return_sequences` captions per image, sampled at `args.temperature` with `args.top_k` and `args.top_p`
        (pure sampling by default), of at most `args.max_caption_length` tokens, in evaluation mode.

        These settings are the whole decoding configuration: the model's own generation config (a Hub checkpoint's
        repetition penalty, n-gram blocking, length limits, forced or banned tokens, ...) is ignored except for its
        special token ids, so that RL samples from the policy it scores, and its `cuda_graphs`, which changes how the
        decoding runs on a GPU, not what it draws (`model.generation_config.cuda_graphs = False` decodes step by
        step; [`rlcaption.generation.step_decoding.uses_cuda_graphs`]).

        With `trim=False`, the sequences may come `max_caption_length + 1` wide, from a decoding the device is still
        running (see [`rlcaption.generation.decoding.generate_caption_sets`]).
        """
        sampling = [self._sampling_config(num_return_sequences)]
        model, processor = self._generation_model(), self.processing_class
        return generate_caption_sets(model, processor, image_inputs, sampling, trim)[0]

    def greedy_captions(self, image_inputs: Mapping[str, torch.Tensor]) -> GeneratedCaptions:
        """
        The greedy caption of every image (the self-critical baseline), of at most `args.max_caption_length` tokens;
        the model's own generation settings are ignored, as in [`sample_captions`].
        """
        greedy = self._greedy_config()
        return generate_captions(self._generation_model(), self.processing_class, image_inputs, greedy)

    def sample_and_greedy_captions(
        self, image_inputs: Mapping[str, torch.Tensor], num_return_sequences: int, trim: bool = True
    ) -> tuple[GeneratedCaptions, GeneratedCaptions]:
        """[`sample_captions`] then [`greedy_captions`] of the same images, the same captions and random draws, with
        each image encoded once for both where the captioner can; `trim` as in [`sample_captions`]."""
        configs = [self._sampling_config(num_return_sequences), self._greedy_config()]
        model, processor = self._generation_model(), self.processing_class
        samples, greedy = generate_caption_sets(model, processor, image_inputs, configs, trim)
        return samples, greedy

    def _sampling_config(self, num_return_sequences: int) -> GenerationConfig:
        return GenerationConfig(
            do_sample=True,
            num_beams=1,
            temperature=self.args.temperature,
            top_k=self.args.top_k,
            top_p=self.args.top_p,
            num_return_sequences=num_return_sequences,
            max_new_tokens=self.args.max_caption_length,
        )

    def _greedy_config(self) -> GenerationConfig:
        return GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=self.args.max_caption_length)

    def beam_search_captions(self, image_inputs: Mapping[str, torch.Tensor], num_beams: int) -> GeneratedCaptions:
        """
        The best caption of a beam search of width `num_beams` for every image (the trajectory Chaffin et al. 2024
        trains on), of at most `args.max_caption_length` tokens; the model's own generation settings are ignored, as in
        [`sample_captions`].
        """
        beam_search = GenerationConfig(
            do_sample=False, num_beams=num_beams, max_new_tokens=self.args.max_caption_length
        )
        return generate_captions(self._generation_model(), self.processing_class, image_inputs, beam_search)

    def reference_token_log_probs(
        self, image_inputs: Mapping[str, torch.Tensor], sequences: torch.LongTensor, image_index=None
    ) -> torch.FloatTensor:
        """The starting policy's log-probabilities of the tokens of `sequences`, without gradient, for the KL penalty
        (`args.beta` > 0); arguments and shape as in [`rlcaption.generation.decoding.sample_token_log_probs`]."""
        if self.reference_policy is None:
            raise RuntimeError("The reference policy is kept for the KL penalty only; this run has beta=0.")
        model = self.unwrap_model(self.model)
        return self.reference_policy.token_log_probs(model, image_inputs, sequences, image_index=image_index)

    # ------------------------------------------------------------------ optimizer
    def create_optimizer(self, model=None):
        # One parameter group per auxiliary network, with its own learning rate and weight decay, in the one
        # optimizer: it is created before the scheduler, which then schedules every group alike, and its state is
        # saved and restored with the model's. Under FSDP the groups go to an optimizer of their own instead:
        # accelerate maps every parameter of the captioner's optimizer to a shard of the captioner, and its
        # checkpoints name optimizer states by the captioner's parameters.
        optimizer = super().create_optimizer(model)
        groups = [group for group in self._auxiliary_parameter_groups() if not self._in_optimizer(optimizer, group)]
        if self.is_fsdp_enabled:
            if groups and self._auxiliary_optimizer is None:
                optimizer_class, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, self.model)
                self._auxiliary_optimizer = optimizer_class(groups, **optimizer_kwargs)
        else:
            for group in groups:
                optimizer.add_param_group(group)
        return optimizer

    def _auxiliary_parameter_groups(self) -> list[dict[str, Any]]:
        groups = []
        for name, network in self._auxiliary_networks.items():
            learning_rate = self.args.learning_rate if network.learning_rate is None else network.learning_rate
            parameters = [parameter for parameter in network.module.parameters() if parameter.requires_grad]
            groups.append(
                {"params": parameters, "lr": learning_rate, "weight_decay": network.weight_decay,
                 "name": f"auxiliary/{name}"}
            )  # fmt: skip
        return groups

    @staticmethod
    def _in_optimizer(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
        return any(group["name"] == existing.get("name") for existing in optimizer.param_groups)

    def _step_auxiliary_optimizer(self) -> None:
        """Under FSDP: averages the auxiliary networks' gradients over the processes (a parameter without a gradient
        on every process keeps none, as DDP leaves it) and steps their optimizer at the captioner's schedule."""
        parameters = [parameter for group in self._auxiliary_optimizer.param_groups for parameter in group["params"]]
        if self.accelerator.num_processes > 1:
            gradients = [torch.zeros_like(p) if p.grad is None else p.grad for p in parameters]
            flat = torch.cat([gradient.reshape(-1) for gradient in gradients] + [
                torch.tensor([float(p.grad is not None) for p in parameters], device=gradients[0].device)
            ])  # fmt: skip
            torch.distributed.all_reduce(flat)
            has_gradient = flat[-len(parameters) :] > 0
            offset = 0
            for parameter, present in zip(parameters, has_gradient.tolist(), strict=True):
                size = parameter.numel()
                gradient = flat[offset : offset + size].view_as(parameter) / self.accelerator.num_processes
                parameter.grad = gradient.to(parameter.dtype) if present else None
                offset += size
        # the schedule of the one optimizer: the factor the captioner's rate has at this step (any scheduler), applied
        # to every group
        captioner_group = self.optimizer.param_groups[0]
        base = captioner_group.get("initial_lr", self.args.learning_rate)
        factor = captioner_group["lr"] / base if base else 1.0
        for group in self._auxiliary_optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = group["initial_lr"] * factor
        self._auxiliary_optimizer.step()

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        # The schedule counts the steps that train the captioner (see learning_rate_schedule): a pretraining phase
        # of the objective leaves it at its start, so that the captioner gets the schedule of a run without one
        if self.lr_scheduler is None:
            fixed_steps = self.objective.captioner_fixed_steps(num_training_steps)
            schedule = super().create_scheduler(num_training_steps - fixed_steps, optimizer)
            decay_interval = None
            if self.args.lr_decay_factor != 1.0:
                decay_interval = max(round(self.args.lr_decay_epochs * self.steps_per_epoch()), 1)
            self.lr_scheduler = captioner_step_schedule(
                schedule, fixed_steps, self.args.lr_decay_factor, decay_interval
            )
        return self.lr_scheduler

    # ------------------------------------------------------------------ loss and logging
    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        """The mixed precision of `--bf16`/`--fp16` around the whole loss computation.

        accelerate casts inside the model's `forward` only. An RL step also samples (`generate` calls a foreign
        captioner's vision model and text decoder directly), computes rewards, runs auxiliary networks and calls
        methods through [`forward_through`]: without this, all of that ran in float32.
        """
        return self.accelerator.autocast()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        failure = loss = None
        gather_parameters_in_methods(self.unwrap_model(model))  # under FSDP2: rollouts step the sharded captioner
        try:
            loss = self.objective.compute_loss(model, inputs)
        except Exception as error:  # every process must hear of it: see _stop_every_process_on
            failure = error
        if self.accelerator.num_processes > 1:
            self._stop_every_process_on(failure, loss)
        elif failure is not None:
            raise failure
        elif self._checks_loss_before_backward and not torch.isfinite(loss):
            raise self._non_finite_loss_error(loss)
        self.record_metric("loss_" + self.args.objective, loss)
        phases = self.objective.phases()
        if len(phases) > 1:
            self.record_metric("objective_phase", float(phases.index(self.objective.current_phase())))
        return (loss, None) if return_outputs else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        # Checked here, with the backward pass queued: reading the loss waits for the device, once a step, and still
        # before the optimizer step that a non-finite loss must not reach.
        if not self._checks_loss_before_backward and not torch.isfinite(loss):
            # the bad gradients must not reach a later step: a resume in this process adds to what is left here
            model.zero_grad(set_to_none=True)
            for network in self._auxiliary_networks.values():
                network.module.zero_grad(set_to_none=True)
            raise self._non_finite_loss_error(loss)
        return loss

    @property
    def _checks_loss_before_backward(self) -> bool:
        """Whether `compute_loss` checks the loss, before the backward pass, rather than `training_step` after it:
        several processes agree on failures before the backward pass's all-reduce, and an optimizer stepping in the
        backward pass would apply a non-finite loss's gradients at once."""
        return self.accelerator.num_processes > 1 or self.args.optim in _OPTIMIZERS_STEPPING_IN_BACKWARD

    def _non_finite_loss_error(self, loss: torch.Tensor) -> RuntimeError:
        return RuntimeError(
            f"The {self.args.objective!r} loss is {loss.item()} at step {self.state.global_step}. Checkpoints already "
            "written are intact: lower the learning rate or check the rewards, then resume with "
            "`trainer.train(resume_from_checkpoint=True)`."
        )

    def _stop_every_process_on(self, failure: Exception | None, loss: torch.Tensor | None) -> None:
        """
        Raises `failure`, or the error of a non-finite `loss`, here and one error naming it on every other process.

        A process that raised alone would leave the others waiting in the next all-reduce until the collective
        timeout (30 minutes with NCCL); so every step, the processes agree on whether one of them failed (one
        all-reduced flag, which also says whether the loss is finite: one wait for the device), and all stop with
        the failing process's message (its reward, image and caption, or its loss).
        """
        failed = torch.tensor([float(failure is not None)], device=self.accelerator.device)
        if failure is None:
            failed += (~torch.isfinite(loss.detach())).float().to(failed.device)
        if self.accelerator.reduce(failed, reduction="sum").item() == 0:
            return
        if failure is None and not torch.isfinite(loss):
            failure = self._non_finite_loss_error(loss)
        messages = gather_object([None if failure is None else f"{type(failure).__name__}: {failure}"])
        process, message = next((rank, text) for rank, text in enumerate(messages) if text is not None)
        raise RuntimeError(
            f"Training stopped on every process at step {self.state.global_step}: process {process} failed with "
            f"{message}"
        ) from failure

    def record_metric(self, name: str, value: float | torch.Tensor) -> None:
        """
        Adds a scalar to be averaged into the next training log, over its values on every process. A 0-dim tensor is
        kept as it is and read at the log, all of them in one transfer: reading each in the step would wait for the
        device every time. A NaN says the metric is undefined in this step (a ratio of variances where nothing
        varied): it is left out of the average, and a metric with no other value is left out of the log.
        """
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"Metric {name!r} must be a scalar, got a tensor of shape {tuple(value.shape)}.")
            value = value.detach()
        self._recorded_metrics[name].append(value)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # Training logs (the only ones with "loss") carry the means of what objectives recorded since the previous
        # one. Every process logs at the same step, so all of them take part in the gathering there; evaluation logs
        # do not gather.
        if "loss" in logs:
            logs = {**logs, **self._gathered_recorded_metrics()}
            if self._completions_to_log and self.is_world_process_zero():
                self._log_completions()
            self._completions_to_log = []
        super().log(logs, start_time)

    def _gathered_recorded_metrics(self) -> dict[str, float]:
        """The mean of every recorded metric over all its values on all processes; collective: every process calls
        it at the same log. A metric some processes did not record is averaged over the values of the others."""
        # NaN: undefined in its step (a variance ratio of constant values): left out, as is a metric never defined
        local = {
            name: (float(np.nansum(values)), int(np.count_nonzero(~np.isnan(values))))
            for name, values in _on_the_host(self._recorded_metrics)
        }
        self._recorded_metrics.clear()
        parts = gather_object([local]) if self.accelerator.num_processes > 1 else [local]
        totals: dict[str, list[float]] = {}
        for part in parts:
            for name, (value_sum, count) in part.items():
                total = totals.setdefault(name, [0.0, 0])
                total[0] += value_sum
                total[1] += count
        return {name: value_sum / count for name, (value_sum, count) in totals.items() if count}

    def _log_completions(self) -> None:
        """Prints the kept sampled captions with their rewards as a table, and logs it to Weights & Biases when it
        is an integration of this run."""
        columns = list(self._completions_to_log[0])
        rows = [[completion[column] for column in columns] for completion in self._completions_to_log]
        step = self.state.global_step
        lines = [f"Sampled captions at step {step}:", "| " + " | ".join(columns) + " |"]
        for row in rows:
            cells = [f"{cell:.3f}" if isinstance(cell, float) else str(cell) for cell in row]
            lines.append("| " + " | ".join(cells) + " |")
        # printed, as the Trainer prints its logs without a progress bar: a library logger is silent by default
        print("\n".join(lines))
        if "wandb" in (self.args.report_to or []):
            import wandb  # imported by the Trainer's integration already when it reports there

            if wandb.run is not None:
                table = wandb.Table(columns=["step", *columns], data=[[step, *row] for row in rows])
                wandb.log({"completions": table})

    # ------------------------------------------------------------------ checkpoints
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        # With FSDP's sharded state dict the Trainer writes the weights of a checkpoint only as shards, to resume
        # from, and the final model not at all; the captioner is written whole as well (gathered on every process,
        # written by the main one), so that every saved folder loads with `from_pretrained` and is evaluated alike.
        if self.is_fsdp_enabled and "FULL_STATE_DICT" not in str(self.accelerator.state.fsdp_plugin.state_dict_type):
            self._save(output_dir, state_dict=self.accelerator.get_state_dict(self.model))
        super().save_model(output_dir, _internal_call)
        model = self.unwrap_model(self.model)
        if self.args.save_merged_model and not _internal_call and self.args.should_save and is_peft_model(model):
            save_merged_model(model, merged_model_folder(output_dir or self.args.output_dir), self.processing_class)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # Under FSDP the state dict is gathered from the shards (full or sharded checkpoints alike) and lacks a network
        # an objective took out of the model to train beside it: it is saved with the model, as `save_pretrained`
        # saves it elsewhere. None on the processes that do not write.
        if self.is_fsdp_enabled and state_dict is not None:
            detached = getattr(self.unwrap_model(self.model), "detached_network_state_dict", dict)()
            state_dict = {**state_dict, **{key: value.detach().cpu() for key, value in detached.items()}}
        super()._save(output_dir, state_dict)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        # Training checkpoints only (a final `save_model` writes the captioner alone), with the optimizer state that
        # covers them, and before the trainer state that marks a checkpoint complete. This runs on every process;
        # the replicas are equal, so the main process writes them.
        if self._auxiliary_networks and self.args.should_save:
            self._save_auxiliary_networks(output_dir)
            if self._auxiliary_optimizer is not None:
                path = os.path.join(output_dir, AUXILIARY_OPTIMIZER_NAME)
                torch.save(self._auxiliary_optimizer.state_dict(), path + ".tmp")
                os.replace(path + ".tmp", path)
        super()._save_optimizer_and_scheduler(output_dir)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or self._auxiliary_optimizer is None:
            return
        path = os.path.join(checkpoint, AUXILIARY_OPTIMIZER_NAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{checkpoint} has no {AUXILIARY_OPTIMIZER_NAME}, the optimizer state of the auxiliary networks under "
                "FSDP: resume from a checkpoint written by this objective under FSDP."
            )
        # on the CPU first: the optimizer moves each state to its parameter's device
        self._auxiliary_optimizer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        if self._auxiliary_networks:
            self._load_auxiliary_networks(resume_from_checkpoint)

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        # `True` resumes from the newest checkpoint written to the end, never from a half-written one.
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"No complete checkpoint found in {self.args.output_dir!r} to resume from; train without "
                    "`resume_from_checkpoint` or point it at a checkpoint folder."
                )
        if resume_from_checkpoint and self._reached_max_steps(resume_from_checkpoint):
            # the Trainer would take one more step past `max_steps`: a run restarted after it ended must not change
            logger.warning(f"{resume_from_checkpoint} is at max_steps={self.args.max_steps}: nothing left to train.")
            self._load_from_checkpoint(resume_from_checkpoint)
            self.state = TrainerState.load_from_json(os.path.join(resume_from_checkpoint, _CHECKPOINT_COMPLETE_MARKER))
            train_losses = [entry["train_loss"] for entry in self.state.log_history if "train_loss" in entry]
            return TrainOutput(self.state.global_step, train_losses[-1] if train_losses else float("nan"), {})
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def planned_steps(self) -> int:
        """The optimizer steps of the whole run: `max_steps`, or the epochs' steps as the Trainer counts them."""
        if self.args.max_steps > 0:
            return self.args.max_steps
        return math.ceil(self.args.num_train_epochs * self.steps_per_epoch())

    def steps_per_epoch(self) -> int:
        """The optimizer steps of one epoch, as the Trainer counts them."""
        return max(len(self.get_train_dataloader()) // self.args.gradient_accumulation_steps, 1)

    def _reached_max_steps(self, checkpoint: str) -> bool:
        state_file = os.path.join(checkpoint, _CHECKPOINT_COMPLETE_MARKER)
        if self.args.max_steps <= 0 or not os.path.isfile(state_file):
            return False
        return TrainerState.load_from_json(state_file).global_step >= self.args.max_steps

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        # `push_to_hub=True` creates the repo when the trainer is built: a Hub that cannot be reached fails here,
        # before any training time is spent, saying so
        try:
            super().init_hf_repo(token=token, private=private)
        except HUB_CONNECTION_ERRORS as error:
            raise RuntimeError(
                f"push_to_hub: cannot create the Hub repo for {self.args.hub_model_id or self.args.output_dir}: "
                f"{error}. Nothing was trained yet. Log in (`hf auth login`) and check the network, or train without "
                "--push_to_hub and publish the saved folder later with `rlcaption.hub.publish_folder`."
            ) from error

    def push_to_hub(self, *args: Any, **kwargs: Any):
        try:
            return super().push_to_hub(*args, **kwargs)
        except HUB_CONNECTION_ERRORS as error:
            raise RuntimeError(
                f"push_to_hub failed: {error}. The model saved in {self.args.output_dir} is intact; publish it later "
                "with `trainer.push_to_hub()` or `rlcaption.hub.publish_folder`."
            ) from error
