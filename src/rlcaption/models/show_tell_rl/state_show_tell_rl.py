"""The recurrent state of ShowTellRL: what `generate` keeps between steps (its cache) and the states after every prefix
of given captions, where Monte-Carlo rollouts continue from."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

__all__ = ["CACHE_NAME", "ShowTellRLPrefixStates", "ShowTellRLState"]

# transformers 5.24 renamed the decoding cache of model inputs and outputs from `past_key_values` to `cache`, and
# `generate` passes and reads it under the new name: ShowTellRL's outputs speak the installed version's name.
CACHE_NAME = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class ShowTellRLState:
    """Recurrent state of a batch of partial captions: what `generate` keeps between steps as its cache.

    Args:
        hidden (`torch.FloatTensor` of shape `(num_layers, batch_size, hidden_size)`): LSTM hidden state.
        cell (`torch.FloatTensor` of shape `(num_layers, batch_size, hidden_size)`): LSTM cell state.
        seq_length (`int`): number of word tokens read so far (the image step is not counted).
        image_grid (`torch.FloatTensor` of shape `(batch_size, num_positions, hidden_size)`, *optional*): the
            projected feature grid each caption attends over (`config.image_attention`), one copy per caption row.
        attention_output (`torch.FloatTensor` of shape `(batch_size, hidden_size)`, *optional*): the last step's
            attentional output, fed back into the LSTM with the next word (`config.image_attention`).
        image_grid_mask (`torch.BoolTensor` of shape `(batch_size, num_positions)`, *optional*): True at the grid's
            real regions, False at padding, which attention skips (regions of precomputed features); None when every
            position is real.
    """

    # `generate` asks these of any cache; a recurrent state has a fixed size and nothing to compile or crop
    is_compileable = False
    is_croppable = False

    def __init__(
        self,
        hidden: torch.FloatTensor,
        cell: torch.FloatTensor,
        seq_length: int = 0,
        image_grid: torch.FloatTensor | None = None,
        attention_output: torch.FloatTensor | None = None,
        image_grid_mask: torch.BoolTensor | None = None,
    ):
        self.hidden = hidden
        self.cell = cell
        self.seq_length = seq_length
        self.image_grid = image_grid
        self.attention_output = attention_output
        self.image_grid_mask = image_grid_mask

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of word tokens read so far."""
        return self.seq_length

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select, in place, the states of the beams that survive a beam-search step: `beam_idx` `(batch_size,)`."""
        # with a `device_map`, the grid (from the image encoder) and the LSTM state may live on different devices
        self.hidden = self.hidden.index_select(1, beam_idx.to(self.hidden.device))
        self.cell = self.cell.index_select(1, beam_idx.to(self.cell.device))
        if self.image_grid is not None:
            self.image_grid = self.image_grid.index_select(0, beam_idx.to(self.image_grid.device))
            self.attention_output = self.attention_output.index_select(0, beam_idx.to(self.attention_output.device))
        if self.image_grid_mask is not None:
            self.image_grid_mask = self.image_grid_mask.index_select(0, beam_idx.to(self.image_grid_mask.device))

    def select(self, rows: torch.Tensor) -> ShowTellRLState:
        """A new state holding the captions `rows` (a boolean mask or indices over the batch), in that order."""
        state_rows = rows.to(self.hidden.device)  # the grid may live on another device (see `reorder_cache`)
        if self.image_grid is None:
            return ShowTellRLState(self.hidden[:, state_rows], self.cell[:, state_rows], self.seq_length)
        return ShowTellRLState(
            self.hidden[:, state_rows],
            self.cell[:, state_rows],
            self.seq_length,
            self.image_grid[rows.to(self.image_grid.device)],
            self.attention_output[rows.to(self.attention_output.device)],
            None if self.image_grid_mask is None else self.image_grid_mask[rows.to(self.image_grid_mask.device)],
        )

    def repeat_interleave(self, repeats: int) -> ShowTellRLState:
        """A new state with every caption's state repeated `repeats` times (e.g. K rollouts from each prefix)."""
        index = torch.arange(self.hidden.shape[1], device=self.hidden.device).repeat_interleave(repeats)
        return self.select(index)


@dataclass
class ShowTellRLPrefixStates:
    """The recurrent state after every prefix of a batch of captions (see [`ShowTellRL.prefix_states`]).

    Args:
        hidden (`torch.FloatTensor` of shape `(num_layers, batch_size, T, hidden_size)`): index `[:, :, t]` is the
            hidden state after reading the first `t + 1` tokens.
        cell (`torch.FloatTensor` of shape `(num_layers, batch_size, T, hidden_size)`): the cell states, alike.
        image_grid (`torch.FloatTensor` of shape `(batch_size, num_positions, hidden_size)`, *optional*): each
            caption's projected feature grid (`config.image_attention`).
        attention_outputs (`torch.FloatTensor` of shape `(batch_size, T, hidden_size)`, *optional*): the attentional
            output after every prefix (`config.image_attention`).
        image_grid_mask (`torch.BoolTensor` of shape `(batch_size, num_positions)`, *optional*): the grid's real
            regions (see [`ShowTellRLState`]).
    """

    hidden: torch.FloatTensor
    cell: torch.FloatTensor
    image_grid: torch.FloatTensor | None = None
    attention_outputs: torch.FloatTensor | None = None
    image_grid_mask: torch.BoolTensor | None = None

    def state_after(self, captions: torch.LongTensor, num_tokens: torch.LongTensor) -> ShowTellRLState:
        """The states of caption rows `captions` `(R,)` after their first `num_tokens` `(R,)` tokens, as one batch."""
        position = num_tokens - 1
        state = ShowTellRLState(
            self.hidden[:, captions, position].contiguous(),  # (L, R, H)
            self.cell[:, captions, position].contiguous(),
        )
        if self.image_grid is not None:
            state.image_grid = self.image_grid[captions]
            state.attention_output = self.attention_outputs[captions, position]
        if self.image_grid_mask is not None:
            state.image_grid_mask = self.image_grid_mask[captions]
        return state
