"""ShowTellRL: the Show-and-Tell captioner of Liu et al. 2017 as a `transformers` model.

image -> encoder -> linear -> first LSTM input (the image is fed once, before `<bos>`); then the LSTM reads the words;
dropout; linear to the vocabulary. With `config.image_attention`, each LSTM output also attends over the encoder's
feature grid (or the regions of precomputed features, skipping their padding) and the word is predicted from both
(Show, Attend and Tell). Generation (`model.generate`) runs on a
recurrent state object ([`ShowTellRLState`]) instead of a key/value cache. The methods used by the RL objectives
(log-probabilities of given captions, stepping the LSTM, the state after every prefix for Monte-Carlo rollouts, the
the hidden states Liu et al.'s baseline reads) are plain methods with documented shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import GenerationMixin, PreTrainedModel
from transformers.utils import ModelOutput

# Everything this file imports from rlcaption sits in its own folder and is imported relatively: `save_pretrained`
# (transformers' `custom_object_save`) copies such files beside it, so a model saved for `trust_remote_code` loads
# where rlcaption is not installed.
from .configuration_show_tell_rl import ShowTellRLConfig
from .encoders import ConvImageEncoder, MixedPrecisionLSTM, build_image_encoder, image_encoder_arguments
from .hub_errors import HubUploadErrorsMixin
from .state_show_tell_rl import CACHE_NAME, ShowTellRLPrefixStates, ShowTellRLState

__all__ = ["ShowTellRL", "ShowTellRLOutput", "ShowTellRLPreTrainedModel"]


@dataclass
class ShowTellRLOutput(ModelOutput):
    """Output of [`ShowTellRL.forward`].

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*, returned when `labels` is given):
            Mean cross-entropy of the next-token predictions over the non-ignored labels.
        logits (`torch.FloatTensor` of shape `(batch_size, sequence_length, vocab_size)`):
            Next-token scores: `logits[:, t]` predicts the token at position `t + 1`.
        cache ([`ShowTellRLState`], *optional*, returned when `use_cache=True`):
            LSTM state after the last input token, to continue decoding from (`past_key_values` with transformers
            older than 5.24, whose `generate` reads that name: see `CACHE_NAME`).
        hidden_states (`torch.FloatTensor` of shape `(batch_size, sequence_length, hidden_size)`, *optional*,
        returned when `output_hidden_states=True`):
            Top-layer LSTM output for each input token, combined with its attention read-out of the image grid when
            `config.image_attention` (the input of the vocabulary projection, and of Liu et al.'s baseline).
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    if CACHE_NAME == "cache":
        cache: ShowTellRLState | None = None
    else:
        past_key_values: ShowTellRLState | None = None
    hidden_states: torch.FloatTensor | None = None


class ShowTellRLPreTrainedModel(HubUploadErrorsMixin, PreTrainedModel):
    config_class = ShowTellRLConfig
    config: ShowTellRLConfig
    base_model_prefix = "show_tell_rl"
    main_input_name = "input_ids"
    # The CNN encoder stays on one device; a transformers backbone contributes its own blocks (its layers), so a
    # large one can be spread over devices. The decoder's layers are direct children, placed one by one; the
    # recurrence moves the tensors it combines onto one device.
    _no_split_modules = ["ConvImageEncoder"]
    # a recurrent state cannot be rolled back, so assisted generation must refuse this model
    _is_stateful = True
    # checkpoints written before Liu et al.'s baseline became an auxiliary network of the `spider_pg` objective
    _keys_to_ignore_on_load_unexpected = [r"^baseline_head\."]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, ConvImageEncoder):
            module.init_weights()
        elif not isinstance(module, nn.Conv2d) or not _is_inside_conv_encoder(self, module):
            super()._init_weights(module)


def _is_inside_conv_encoder(model: nn.Module, module: nn.Module) -> bool:
    encoder = getattr(model, "image_encoder", None)
    return isinstance(encoder, ConvImageEncoder) and any(module is layer for layer in encoder.blocks)


def _is_right_padded(step_mask: torch.Tensor) -> bool:
    """Whether every row of `step_mask` `(B, T)` is its tokens, then only padding."""
    positions = torch.arange(step_mask.shape[1], device=step_mask.device)
    return bool((step_mask == (positions[None, :] < step_mask.sum(dim=1)[:, None])).all())


class ShowTellRL(ShowTellRLPreTrainedModel, GenerationMixin):
    """Show-and-Tell LSTM captioner (Liu et al. 2017), with attention over the image grid as an option.

    Decode with `model.generate(pixel_values=...)` (or `image_features=...`, with `image_feature_mask=...` for padded
    regions, for the `"features"` encoder, which turns `pixel_values` into features with the backbone its config
    records in `image_feature_extractor`): greedy,
    sampling (`do_sample`, `temperature`, `top_k`, `top_p`), beam search (`num_beams`) and `num_return_sequences`
    all work; the returned sequences start with `<bos>`. A text prompt (`input_ids`, e.g. `processor(images=...,
    text="a red")`) is continued; the `image-text-to-text` pipeline captions with `text=""`.
    """

    def __init__(self, config: ShowTellRLConfig):
        super().__init__(config)
        self.image_encoder = build_image_encoder(config)
        self.image_projection = nn.Linear(self.image_encoder.output_size, config.word_embedding_size)
        # A bounded-scale image input: without it, XE training inflates the embedding's image-independent part until
        # the LSTM gates saturate and every image yields the same state (the captioner then ignores the image).
        self.image_norm = nn.LayerNorm(config.word_embedding_size)
        if config.image_attention:
            # Show, Attend and Tell: the grid cells are keys and values, the LSTM output is the query
            self.grid_projection = nn.Linear(self.image_encoder.grid_feature_size, config.hidden_size)
            self.grid_norm = nn.LayerNorm(config.hidden_size)  # bounded scale, as for the image embedding
            num_positions = self.image_encoder.num_grid_positions
            # a CNN's cells carry no position of their own; "left of" and "above" need it
            self.grid_position_embeddings = (
                nn.Embedding(num_positions, config.hidden_size) if num_positions is not None else None
            )
            self.attention_query = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
            self.attention_output = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.word_embedding_size)
        # with attention, the previous step's attentional output is read with each word ("input feeding"), so the
        # LSTM knows which object it has just described and can move on to another one
        lstm_input_size = config.word_embedding_size + (config.hidden_size if config.image_attention else 0)
        self.lstm = MixedPrecisionLSTM(
            lstm_input_size,
            config.hidden_size,
            num_layers=config.num_layers,
            dropout=config.dropout if config.num_layers > 1 else 0.0,
            batch_first=True,
        )
        self.dropout = nn.Dropout(config.dropout)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self._never_predicted_ids: dict[tuple, torch.Tensor] = {}  # see never_predicted_ids
        self.post_init()
        if config.encoder_type == "backbone" and config.use_pretrained_backbone:
            # after post_init, which would otherwise re-initialise the pretrained weights
            self.image_encoder.load_pretrained_backbone(config.backbone)
            # the weights are now part of this model: a saved copy must not download them again
            config.use_pretrained_backbone = False
        if config.encoder_type == "cnn" and config.freeze_image_encoder:
            self.image_encoder.requires_grad_(False)
        self.generation_config.bos_token_id = config.bos_token_id
        self.generation_config.eos_token_id = config.eos_token_id
        self.generation_config.pad_token_id = config.pad_token_id
        self.generation_config.max_length = config.max_caption_length + 1  # + <bos>

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading_info) when asked for
        # loading materialises fresh, trainable parameters: apply the saved freezing again
        if model.config.encoder_type == "cnn" and model.config.freeze_image_encoder:
            model.image_encoder.requires_grad_(False)
        return loaded

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate must not create a DynamicCache: the first forward returns a ShowTellRLState instead
        return False

    def generate(self, inputs: torch.LongTensor | None = None, *args, **kwargs):
        """[`~GenerationMixin.generate`], continuing text prompts.

        The processor ends every text with `<eos>`, after which a caption cannot go on: the prompts' end tokens become
        padding (as BLIP's `generate` drops its prompt's `[SEP]`), and padding moves to the left, so that the scores
        `generate` reads at the last position follow each prompt's last word (the LSTM state is carried unchanged
        through padding; its output there is not a prediction). The returned sequences start with the prompts so
        padded; `processor.batch_decode` drops the padding.
        """
        prompts = kwargs.pop("input_ids", inputs)
        if prompts is not None:
            attention_mask = kwargs.get("attention_mask")
            words = prompts != self.config.eos_token_id
            words &= (prompts != self.config.pad_token_id) if attention_mask is None else attention_mask.bool()
            left_padded = torch.sort(words.long(), dim=1, stable=True).indices  # padding first, words in order
            prompts = prompts.masked_fill(~words, self.config.pad_token_id).gather(1, left_padded)
            kwargs["attention_mask"] = words.long().gather(1, left_padded)
        return super().generate(prompts, *args, **kwargs)

    def _expand_inputs_for_generation(
        self, expand_size: int = 1, is_encoder_decoder: bool = False, input_ids=None, **model_kwargs
    ):
        # Several captions per image (`num_return_sequences`, `num_beams`): each image is encoded once and its state
        # shared by its captions through `image_index`, instead of encoding `expand_size` copies of the pixels. The
        # images are read at the first step only; afterwards the recurrent state carries them.
        image_inputs = {
            name: model_kwargs.pop(name)
            for name in ("pixel_values", "image_features", "image_feature_mask")
            if model_kwargs.get(name) is not None
        }
        input_ids, model_kwargs = super()._expand_inputs_for_generation(
            expand_size, is_encoder_decoder, input_ids, **model_kwargs
        )
        if expand_size > 1 and image_inputs:
            images = next(iter(image_inputs.values()))
            model_kwargs["image_index"] = torch.arange(images.shape[0], device=images.device).repeat_interleave(
                expand_size
            )
        return input_ids, {**model_kwargs, **image_inputs}

    def get_input_embeddings(self) -> nn.Embedding:
        return self.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.word_embeddings = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    # ---------------------------------------------------------------- image side
    def freeze_image_encoder(self, frozen: bool = True) -> None:
        """Keep the CNN encoder's weights fixed (or train them again), now and in every saved copy of the model."""
        if self.config.encoder_type != "cnn":
            raise ValueError(
                f"freeze_image_encoder is for the 'cnn' encoder; this model's {self.config.encoder_type!r} encoder "
                "follows config.freeze_backbone (or has no weights, for 'features')."
            )
        self.config.freeze_image_encoder = frozen
        self.image_encoder.requires_grad_(not frozen)

    def encode_images(
        self,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_feature_mask: torch.Tensor | None = None,
    ) -> torch.FloatTensor | tuple[torch.FloatTensor, torch.FloatTensor, torch.BoolTensor | None]:
        """Image embedding fed to the LSTM before `<bos>` (and, with `config.image_attention`, the grid it attends to).

        Args:
            pixel_values (`torch.FloatTensor` of shape `(batch_size, num_channels, height, width)`): for the `"cnn"`
                and `"backbone"` encoders.
            image_features (`torch.FloatTensor` of shape `(batch_size, image_feature_size)`, or `(batch_size,
                num_regions, image_feature_size)` with `config.image_feature_layout="grid"`): for `"features"`.
            image_feature_mask (`torch.LongTensor` of shape `(batch_size, num_regions)`, *optional*): 1 for a real
                region, 0 for padding (`"grid"` features); all regions are real when it is None.

        Returns:
            `torch.FloatTensor` of shape `(batch_size, word_embedding_size)`; with `config.image_attention`, also the
            projected grid `(batch_size, num_positions, hidden_size)` and its mask `(batch_size, num_positions)`
            (True at real regions; None when every position is real).
        """
        encoder_inputs = image_encoder_arguments(
            self.image_encoder, pixel_values, image_features, image_feature_mask, self.dtype
        )
        if not self.config.image_attention:
            return self.image_norm(self.image_projection(self.image_encoder(*encoder_inputs)))
        encoded, grid = self.image_encoder.forward_with_grid(*encoder_inputs)
        grid = self.grid_projection(grid)  # (B, N, H)
        if self.grid_position_embeddings is not None:
            grid = grid + self.grid_position_embeddings.weight.to(grid.device)
        grid_mask = None if image_feature_mask is None else image_feature_mask.to(grid.device) != 0
        return self.image_norm(self.image_projection(encoded)), self.grid_norm(grid), grid_mask

    def initial_state(
        self,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_feature_mask: torch.Tensor | None = None,
    ) -> ShowTellRLState:
        """LSTM state after reading the image embedding (before `<bos>`), from a zero state; the image inputs as in
        [`encode_images`]."""
        image_grid = image_grid_mask = None
        image_embeddings = self.encode_images(pixel_values, image_features, image_feature_mask)  # (B, W)
        if self.config.image_attention:
            image_embeddings, image_grid, image_grid_mask = image_embeddings
        batch_size = image_embeddings.shape[0]
        zeros = image_embeddings.new_zeros(self.config.num_layers, batch_size, self.config.hidden_size)
        attention_output = None
        if image_grid is not None:
            attention_output = image_embeddings.new_zeros(batch_size, self.config.hidden_size)
            image_embeddings = torch.cat([image_embeddings, attention_output], dim=-1)
        _, (hidden, cell) = self.lstm(image_embeddings[:, None, :], (zeros, zeros))
        return ShowTellRLState(hidden, cell, 0, image_grid, attention_output, image_grid_mask)

    # ---------------------------------------------------------------- LSTM over words
    def _step_state(
        self, word_embeddings: torch.FloatTensor, state: ShowTellRLState
    ) -> tuple[torch.FloatTensor, ShowTellRLState]:
        """Read one word embedding `(B, W)` per caption: the top-layer output `(B, H)` (attentional with
        `config.image_attention`) and the new state."""
        if self.config.image_attention:
            if state.image_grid is None or state.attention_output is None:
                raise ValueError(
                    "This model attends over the image grid: the state it continues from must carry the grid and the "
                    "last attentional output (start from `initial_state` or a `forward` with `use_cache=True`)."
                )
            attention_output = state.attention_output.to(word_embeddings.device)
            word_embeddings = torch.cat([word_embeddings, attention_output], dim=-1)  # input feeding
        top, (hidden, cell) = self.lstm.step(word_embeddings, (state.hidden, state.cell))  # (B, H)
        if self.config.image_attention:
            top = self._attend(top, state.image_grid, state.image_grid_mask)
            return top, ShowTellRLState(
                hidden, cell, state.seq_length + 1, state.image_grid, top, state.image_grid_mask
            )
        return top, ShowTellRLState(hidden, cell, state.seq_length + 1)

    def _decode_stepwise(
        self, word_embeddings: torch.FloatTensor, state: ShowTellRLState, step_mask: torch.Tensor | None
    ) -> tuple[torch.FloatTensor, ShowTellRLPrefixStates, ShowTellRLState]:
        """One step per position of `word_embeddings` `(B, T, W)`; where `step_mask` is False the state is carried
        through unchanged.

        Returns the top-layer outputs `(B, T, H)`, the states after every position, and the final state.
        """
        outputs, hiddens, cells, attention_outputs = [], [], [], []
        for position in range(word_embeddings.shape[1]):
            output, next_state = self._step_state(word_embeddings[:, position], state)
            if step_mask is not None:
                keep = step_mask[:, position].to(next_state.hidden.device)
                next_state.hidden = torch.where(keep.view(1, -1, 1), next_state.hidden, state.hidden)
                next_state.cell = torch.where(keep.view(1, -1, 1), next_state.cell, state.cell)
                if next_state.attention_output is not None:
                    device = next_state.attention_output.device
                    next_state.attention_output = torch.where(
                        keep[:, None].to(device), next_state.attention_output, state.attention_output.to(device)
                    )
            state = next_state
            outputs.append(output)
            hiddens.append(state.hidden)
            cells.append(state.cell)
            attention_outputs.append(state.attention_output)
        prefix_states = ShowTellRLPrefixStates(
            torch.stack(hiddens, dim=2),  # (L, B, T, H)
            torch.stack(cells, dim=2),
            state.image_grid,
            torch.stack(attention_outputs, dim=1) if state.image_grid is not None else None,  # (B, T, H)
            state.image_grid_mask,
        )
        return torch.stack(outputs, dim=1), prefix_states, state

    def _run_lstm(
        self,
        inputs: torch.FloatTensor,
        state: tuple[torch.Tensor, torch.Tensor],
        step_mask: torch.Tensor | None,
        need_final_state: bool,
    ) -> tuple[torch.FloatTensor, tuple[torch.Tensor, torch.Tensor]]:
        """LSTM over `inputs` `(B, T, W)` from `state`; padding (`step_mask` False) leaves the state unchanged.

        Returns the top-layer output `(B, T, H)` and the final `(hidden, cell)`. Outputs at padding positions are
        meaningless (they are never scored); every other output is exact.
        """
        if inputs.shape[1] == 1:  # a decoding step: the fused cell, as the step-by-step decoders run it
            top, (hidden, cell) = self.lstm.step(inputs[:, 0], state)
            if step_mask is not None:
                keep = step_mask[:, 0].view(1, -1, 1).to(hidden.device)
                hidden, cell = torch.where(keep, hidden, state[0]), torch.where(keep, cell, state[1])
            return top[:, None], (hidden, cell)
        if step_mask is None or bool(step_mask.all()):
            outputs, final_state = self.lstm(inputs, state)
            return outputs, final_state
        lengths = step_mask.sum(dim=1)
        is_right_padded = _is_right_padded(step_mask)
        if is_right_padded and not need_final_state:
            # teacher forcing: right padding comes after every scored position, so one plain call is exact there
            outputs, final_state = self.lstm(inputs, state)
            return outputs, final_state
        if is_right_padded and bool((lengths > 0).all()):
            # the usual teacher-forcing batch: one packed LSTM call instead of a Python loop
            packed = pack_padded_sequence(inputs, lengths.cpu(), batch_first=True, enforce_sorted=False)
            packed_outputs, (hidden, cell) = self.lstm(packed, state)
            outputs, _ = pad_packed_sequence(packed_outputs, batch_first=True, total_length=inputs.shape[1])
            return outputs, (hidden, cell)
        outputs, _, final = self._decode_stepwise(inputs, ShowTellRLState(*state), step_mask)  # left padding, holes
        return outputs, (final.hidden, final.cell)

    def _attend(
        self,
        lstm_output: torch.FloatTensor,
        image_grid: torch.FloatTensor | None,
        image_grid_mask: torch.BoolTensor | None = None,
    ) -> torch.FloatTensor:
        """The attentional output `(B, H)`: the LSTM output `(B, H)` combined with its read-out of the caption's image
        grid `(B, N, H)` by scaled dot-product attention (Luong et al. 2015, with input feeding); positions where
        `image_grid_mask` `(B, N)` is False (padded regions) get no weight."""
        if image_grid is None:
            raise ValueError("This model attends over the image grid: the state it continues from must carry it.")
        query = self.attention_query(lstm_output)  # (B, H)
        image_grid = image_grid.to(query.device)  # with a `device_map`, the image encoder may sit elsewhere
        scores = (query[:, None, :] @ image_grid.transpose(1, 2))[:, 0] / self.config.hidden_size**0.5  # (B, N)
        if image_grid_mask is not None:
            # the lowest finite score: exp() gives padding exactly 0 weight; every row has a real region (the encoder
            # refuses a row without one), so no row is all padding
            scores = scores.masked_fill(~image_grid_mask.to(scores.device), torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        context = (weights[:, None, :] @ image_grid)[:, 0]  # (B, H)
        return torch.tanh(self.attention_output(torch.cat([lstm_output.to(context.device), context], dim=-1)))

    def _vocabulary_scores(self, lstm_outputs: torch.FloatTensor) -> torch.FloatTensor:
        """Logits over the vocabulary; `<pad>` and `<bos>` get the lowest finite score.

        A caption never continues with `<pad>` or `<bos>`, so the model gives them (numerically) zero probability:
        sampling, beam search and `caption_log_probs` then all use the same distribution, and entropies stay
        finite (0 * log 0 = 0 with a finite minimum, NaN with -inf).
        """
        logits = self.lm_head(self.dropout(lstm_outputs))
        return logits.index_fill(-1, self.never_predicted_ids(logits.device), torch.finfo(logits.dtype).min)

    def never_predicted_ids(self, device: torch.device) -> torch.LongTensor:
        """`<pad>` and `<bos>`, the ids the model never predicts, on `device`: made once per device, since a tensor
        made from Python ints is a host-to-device copy that waits for the device, and decoders need it at every
        token."""
        key = (device, self.config.pad_token_id, self.config.bos_token_id)
        never_predicted = self._never_predicted_ids.get(key)
        if never_predicted is None:
            never_predicted = self._never_predicted_ids[key] = torch.tensor(key[1:], device=device)
        return never_predicted

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
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
                Caption tokens, `<bos> w_1 ... <eos> <pad> ...` (with a cache: only the new tokens).
            pixel_values (`torch.FloatTensor` of shape `(batch_size, num_channels, height, width)`, *optional*):
                Images (`"cnn"`/`"backbone"` encoders; `"features"` with a recorded `image_feature_extractor`, whose
                backbone computes the features, when `image_features` is None). Read only when `cache` is None.
            image_features (`torch.FloatTensor` of shape `(batch_size, image_feature_size)`, *optional*):
                Precomputed features (`"features"` encoder), `(batch_size, num_regions, image_feature_size)` with
                `config.image_feature_layout="grid"`. Read only when `cache` is None.
            image_feature_mask (`torch.LongTensor` of shape `(batch_size, num_regions)`, *optional*):
                1 for a real region of `image_features`, 0 for padding (`"grid"` features of varying region counts);
                every region is real when it is None. Read only when `cache` is None.
            attention_mask (`torch.LongTensor` of shape `(batch_size, sequence_length)` or
            `(batch_size, past_length + sequence_length)`, *optional*):
                1 for tokens, 0 for padding; the LSTM state is carried unchanged through padding (left or right).
                Only its last `sequence_length` columns are read.
            cache ([`ShowTellRLState`], *optional*):
                State to continue from; the image inputs are then ignored.
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
                Causal-LM targets: `logits[:, t]` is scored against `labels[:, t + 1]`; -100 and `pad_token_id`
                are ignored. Usually `labels = input_ids`.
            image_index (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
                For several captions per image: the row of each caption's image in `pixel_values`/`image_features`
                and `image_feature_mask` (which then hold each image once). Images are encoded once and their
                state shared by their captions, instead of encoding repeated copies.
            use_cache (`bool`, *optional*):
                Return the final state as `cache`. Defaults to True in eval mode and False in training
                mode, where the state is not needed and right-padded batches take a faster path.
            output_hidden_states (`bool`, *optional*):
                Return the top-layer LSTM outputs `(batch_size, sequence_length, hidden_size)`.
            return_dict (`bool`, *optional*):
                Return a [`ShowTellRLOutput`] (default) or a tuple.
            past_key_values ([`ShowTellRLState`], *optional*):
                The name of `cache` before transformers 5.24 (whose `generate` passes it so).
        """
        if input_ids is None:
            raise ValueError("ShowTellRL.forward needs input_ids (start captions with the <bos> token id).")
        use_cache = not self.training if use_cache is None else use_cache
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict

        # 1. starting state: after the image, or the given cache
        if cache is None:
            cache = past_key_values
        if cache is not None:
            state = cache
        else:
            state = self.initial_state(pixel_values, image_features, image_feature_mask)
            if image_index is not None:
                state = state.select(image_index)
        # 2. LSTM over the words
        step_mask = None if attention_mask is None else attention_mask[:, -input_ids.shape[1] :].bool()
        word_embeddings = self.word_embeddings(input_ids)  # (B, T, W)
        if self.config.image_attention:
            if step_mask is not None and not use_cache and _is_right_padded(step_mask):
                # teacher forcing: right padding comes after every scored position, so carrying the state through it
                # unchanged changes no scored output; what it would cost is three selections per token
                step_mask = None
            # each step's input depends on the previous step's attention: one step at a time
            outputs, _, final_state = self._decode_stepwise(word_embeddings, state, step_mask)
        else:
            outputs, (hidden, cell) = self._run_lstm(
                word_embeddings, (state.hidden, state.cell), step_mask, need_final_state=use_cache
            )
            final_state = ShowTellRLState(hidden, cell, state.seq_length + input_ids.shape[1])
        # 3. vocabulary scores
        logits = self._vocabulary_scores(outputs)  # (B, T, V)

        loss = None
        if labels is not None:
            targets = labels[:, 1:].masked_fill(labels[:, 1:] == self.config.pad_token_id, -100).to(logits.device)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

        output = ShowTellRLOutput(
            loss=loss,
            logits=logits,
            **{CACHE_NAME: final_state if use_cache else None},
            hidden_states=outputs if output_hidden_states else None,
        )
        return output if return_dict else output.to_tuple()

    # ---------------------------------------------------------------- RL interface
    def step(
        self, token_ids: torch.LongTensor, state: ShowTellRLState
    ) -> tuple[torch.FloatTensor, torch.FloatTensor, ShowTellRLState]:
        """Read one token per caption.

        Args:
            token_ids (`torch.LongTensor` of shape `(batch_size,)`): the current token of each caption.
            state ([`ShowTellRLState`]): state before the token (not modified).

        Returns:
            logits `(batch_size, vocab_size)` for the next token, the top-layer hidden state `(batch_size,
            hidden_size)` (with its attention read-out when `config.image_attention`), and the new state.
        """
        top_hidden, next_state = self._step_state(self.word_embeddings(token_ids), state)  # (B, H)
        logits = self._vocabulary_scores(top_hidden)  # (B, V)
        return logits, top_hidden, next_state

    def caption_log_probs(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.LongTensor | None = None,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_feature_mask: torch.LongTensor | None = None,
    ) -> torch.FloatTensor:
        """Log-probability of each next token of given captions under the model (teacher forcing).

        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, T)`): captions starting with `<bos>`.
            attention_mask (`torch.LongTensor` of shape `(batch_size, T)`, *optional*): 0 at padding; defaults
                to `input_ids != pad_token_id`.
            pixel_values, image_features, image_feature_mask: the image inputs, as in [`forward`].

        Returns:
            `torch.FloatTensor` of shape `(batch_size, T - 1)`: `log p(input_ids[:, t + 1] | input_ids[:, :t + 1],
            image)`, 0 where `input_ids[:, t + 1]` is padding.
        """
        if attention_mask is None:
            attention_mask = (input_ids != self.config.pad_token_id).long()
        logits = self(
            input_ids=input_ids, pixel_values=pixel_values, image_features=image_features,
            image_feature_mask=image_feature_mask, attention_mask=attention_mask, use_cache=False,
        ).logits[:, :-1]  # fmt: skip
        # in float32: half-precision log-softmax loses the small differences policy gradients weigh
        log_probs = F.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[:, 1:, None].to(logits.device))[..., 0]
        return log_probs.masked_fill(~attention_mask[:, 1:].bool().to(log_probs.device), 0.0)  # (B, T-1)

    def prefix_states(
        self,
        input_ids: torch.LongTensor,
        pixel_values: torch.FloatTensor | None = None,
        image_features: torch.FloatTensor | None = None,
        image_feature_mask: torch.LongTensor | None = None,
        attention_mask: torch.LongTensor | None = None,
    ) -> ShowTellRLPrefixStates:
        """LSTM state after every prefix of given captions: where Monte-Carlo rollouts continue from (Liu et al. 2017).

        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, T)`): captions starting with `<bos>`.
            pixel_values, image_features, image_feature_mask: the image inputs, one row per caption, as in
                [`forward`].
            attention_mask (`torch.LongTensor` of shape `(batch_size, T)`, *optional*): the state is carried
                unchanged through padding.

        Returns:
            [`ShowTellRLPrefixStates`]: `hidden[:, :, t]` and `cell[:, :, t]` are the state after reading
            `input_ids[:, : t + 1]`; `state_after(rows, t + 1)` gives it as a [`ShowTellRLState`] to continue from
            with [`step`].
        """
        state = self.initial_state(pixel_values, image_features, image_feature_mask)
        step_mask = None if attention_mask is None else attention_mask.bool()
        _, prefix_states, _ = self._decode_stepwise(self.word_embeddings(input_ids), state, step_mask)
        return prefix_states
