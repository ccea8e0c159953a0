"""
LoRA adapters through peft for [`RLCaptionTrainer`] (`use_peft`): wrapping a captioner, the reference policy of the KL
penalty (the same model with its adapters disabled), and saving the adapters merged into the base weights.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback

from ..generation.captioners import is_peft_model
from ..generation.decoding import sample_token_log_probs

__all__ = [
    "MERGED_MODEL_FOLDER",
    "FrozenEmbeddingsUnderCheckpointing",
    "ReferencePolicy",
    "is_peft_model",
    "lora_config_of",
    "merged_model_folder",
    "save_merged_model",
    "vocabulary_projections",
    "with_lora",
]

# The subfolder of a saved model where `save_merged_model` writes the merged weights.
MERGED_MODEL_FOLDER = "merged"


def lora_config_of(args: Any, model: nn.Module):
    """
    The `peft.LoraConfig` of the `lora_*` fields of an [`RLCaptionConfig`]. Unset `lora_target_modules` adapt every
    linear layer (`all-linear`: captioner families name their projections differently) but the output layers over
    the vocabulary ([`vocabulary_projections`]).
    """
    from peft import LoraConfig

    if args.lora_target_modules:
        return LoraConfig(
            r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
            target_modules=args.lora_target_modules,
        )  # fmt: skip
    return LoraConfig(
        r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout, target_modules="all-linear",
        exclude_modules=vocabulary_projections(model) or None,
    )  # fmt: skip


def vocabulary_projections(model: nn.Module) -> list[str]:
    """
    The names of the linear layers that project onto a word embedding's vocabulary (the captioner's output layer):
    peft's `all-linear` leaves out the layer `get_output_embeddings()` names, which some families do not name (BLIP).
    An adapter there would be merged into the weight the layer shares with the word embeddings, changing the inputs
    too, so the merged model would not caption as the adapted one.
    """
    embeddings = [module for module in model.modules() if isinstance(module, nn.Embedding)]
    tied = {id(embedding.weight) for embedding in embeddings}
    # the word embeddings' vocabulary only: position embeddings' sizes are no vocabulary
    get_input_embeddings = getattr(model, "get_input_embeddings", None)
    word_embeddings = get_input_embeddings() if callable(get_input_embeddings) else None
    vocabulary_sizes = {word_embeddings.num_embeddings} if isinstance(word_embeddings, nn.Embedding) else set()
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and (id(module.weight) in tied or module.out_features in vocabulary_sizes)
    ]


def with_lora(model: nn.Module, args: Any) -> nn.Module:
    """
    `model` wrapped with LoRA adapters of `args`'s `lora_*` fields (`peft.get_peft_model`): the base weights frozen,
    only the adapters trainable.

    Raises:
        `ValueError`: for a model that has adapters already (train it without `use_peft`), or a `lora_target_modules`
            that names no module of the model.
    """
    if is_peft_model(model):
        raise ValueError(
            f"use_peft=True, but the model is a {type(model).__name__} already: it trains its own adapters as it is. "
            "Pass it without --use_peft, or pass the base model to get new adapters."
        )
    from peft import get_peft_model

    try:
        return get_peft_model(model, lora_config_of(args, model))
    except ValueError as error:
        raise ValueError(
            f"LoRA adapters cannot be added to {type(model).__name__} with lora_target_modules="
            f"{args.lora_target_modules}: {error} Name modules of the model (see `model.named_modules()`), or leave "
            "lora_target_modules unset to adapt every linear layer."
        ) from error


def save_merged_model(model: nn.Module, folder: str, processor: Any = None) -> None:
    """
    Writes `model` (a `PeftModel`) with its adapters merged into the base weights to `folder`, with the processor: a
    plain transformers folder that loads with `from_pretrained`. The model keeps its adapters (a copy is merged).
    """
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(folder)
    if processor is not None:
        processor.save_pretrained(folder)
    del merged


class FrozenEmbeddingsUnderCheckpointing(TrainerCallback):
    """
    Under LoRA with non-reentrant gradient checkpointing (transformers' default), removes the hook that
    `gradient_checkpointing_enable` puts on the word embeddings of a model whose main input is `input_ids` (GIT) to
    make their output require gradients. Reentrant checkpointing needs it (its inputs must require gradients for the
    adapters inside a checkpointed layer to get any); non-reentrant checkpointing does not, and with frozen embeddings
    the hook makes their output a leaf that GIT's embeddings then add position embeddings to in place, which autograd
    refuses.
    """

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        reentrant = (args.gradient_checkpointing_kwargs or {}).get("use_reentrant", False)
        base = model.get_base_model() if is_peft_model(model) else None
        if args.gradient_checkpointing and not reentrant and getattr(base, "_require_grads_hook", None) is not None:
            base.disable_input_require_grads()


class ReferencePolicy:
    """
    The policy the KL penalty (`beta`) is measured against: the captioner as the trainer received it. Under LoRA it is
    the trained model itself with its adapters disabled, no second copy in memory; otherwise a copy made once, frozen
    and in evaluation mode. A resumed run builds it from the model it is given, the starting one, so that the reference
    does not move with the checkpoints.

    Args:
        model (`nn.Module`): the captioner, unwrapped, before any training step.
    """

    def __init__(self, model: nn.Module):
        self.frozen_copy: nn.Module | None = None
        if not is_peft_model(model):
            self.frozen_copy = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def token_log_probs(
        self,
        model: nn.Module,
        image_inputs: Mapping[str, torch.Tensor],
        sequences: torch.LongTensor,
        image_index: torch.LongTensor | None = None,
    ) -> torch.FloatTensor:
        """
        The reference's log-probabilities of the tokens of `sequences`, as
        [`rlcaption.generation.decoding.sample_token_log_probs`] scores the policy's (evaluation mode), without
        gradient.

        Args:
            model: the trained model, unwrapped (under LoRA, the `PeftModel` whose adapters are disabled for the call).

        Returns:
            `torch.FloatTensor` of shape `(N, T - 1)`.
        """
        if self.frozen_copy is not None:
            return sample_token_log_probs(self.frozen_copy, image_inputs, sequences, image_index=image_index)
        with model.disable_adapter():
            return sample_token_log_probs(model, image_inputs, sequences, image_index=image_index)


def merged_model_folder(output_dir: str) -> str:
    """Where `save_merged_model` writes the merged weights of a model saved in `output_dir`."""
    return os.path.join(output_dir, MERGED_MODEL_FOLDER)
