"""
Models built around a `ShowTellRL` captioner and a second network (`SpeakerListener`: speaker and listener;
`PolicyValueCaptioner`: policy and value network): captioning, teacher forcing, the generation config and the word
embeddings are the wrapped captioner's, so the trainer, `generate`, pipelines and Auto classes treat the model as that
captioner.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationConfig

from .show_tell_rl import ShowTellRLOutput, ShowTellRLState

__all__ = ["WrappedCaptionerMixin"]


class WrappedCaptionerMixin:
    """For a `PreTrainedModel` + `GenerationMixin` whose attribute named `wrapped_captioner_name` is a `ShowTellRL`."""

    wrapped_captioner_name: str

    @property
    def _captioner(self) -> nn.Module:
        return self._modules[self.wrapped_captioner_name]

    # A `GenerationMixin`, so that transformers saves and loads the generation config and pipelines call `generate`;
    # `generate` itself, and the generation config, are the wrapped captioner's.
    @property
    def generation_config(self) -> GenerationConfig:
        """The wrapped captioner's generation config: saved with the model, read by `generate`."""
        return self._captioner.generation_config

    @generation_config.setter
    def generation_config(self, value: GenerationConfig) -> None:
        # `PreTrainedModel.__init__` assigns a default before the captioner exists, which then builds its own
        if self.wrapped_captioner_name in self._modules:
            self._captioner.generation_config = value

    def generate(self, *args, **kwargs) -> torch.LongTensor:
        """The wrapped [`ShowTellRL.generate`], with its generation hooks (recurrent state, text prompts, each image
        encoded once for its captions): discrete captions, starting with `<bos>`."""
        return self._captioner.generate(*args, **kwargs)

    def get_input_embeddings(self) -> nn.Embedding:
        return self._captioner.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self._captioner.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self._captioner.get_output_embeddings()

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self._captioner.set_output_embeddings(new_embeddings)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_feature_mask: torch.LongTensor | None = None,
        attention_mask: torch.LongTensor | None = None,
        cache: ShowTellRLState | None = None,
        labels: torch.LongTensor | None = None,
        image_index: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: ShowTellRLState | None = None,
    ) -> ShowTellRLOutput | tuple:
        """The wrapped [`ShowTellRL.forward`] (teacher forcing, cached steps); the second network takes no part."""
        return self._captioner(
            input_ids=input_ids,
            pixel_values=pixel_values,
            image_features=image_features,
            image_feature_mask=image_feature_mask,
            attention_mask=attention_mask,
            cache=cache if cache is not None else past_key_values,
            labels=labels,
            image_index=image_index,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            return_dict=return_dict,
        )

    def caption_log_probs(self, *args, **kwargs) -> torch.FloatTensor:
        """The wrapped [`ShowTellRL.caption_log_probs`]."""
        return self._captioner.caption_log_probs(*args, **kwargs)
