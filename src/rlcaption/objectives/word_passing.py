"""
Differentiable word passing: decode captions so that a second network (a listener) can read the words and its loss
can backpropagate into the captioner (Vered et al. 2019, cooperative speaker-listener training with PSST).

At every step t the speaker computes `p_t = softmax(logits_t / temperature)`, samples a token from it and passes a
word vector `w_t` over the vocabulary; the listener embeds it as `w_t @ E` ([`soft_word_embeddings`]). The speaker
reads the same vector at step t + 1 (`w_t @ E_speaker`), so the listener's gradient also flows through time. Modes
(Vered et al. 2019, section 5 and the compared methods of section 6.2):

- `"st"` (ST Multinomial): forward the sampled one-hot, backward as if `p_t` had been passed (straight-through).
- `"gumbel"`: the Gumbel-softmax relaxation `softmax((log p_t + g) / tau)` itself (soft); the token is its argmax.
- `"st_gumbel"` (ST Gumbel-softmax): forward the one-hot of that argmax, backward through the Gumbel-softmax vector.
- `"psst"` (PSST Multinomial): at each step, independently per caption, pass the full distribution `p_t` with
  probability `rho`, else the `"st"` one-hot. `rho=0` is `"st"`; the paper finds `rho=0.25` best.
- `"psst_gumbel"` (PSST Gumbel-softmax): the same mix of the Gumbel-softmax vector and its `"st_gumbel"` one-hot.
- `"reinforce"`: the plain one-hot, with no gradient path through the words; train the speaker with the
  log-probabilities of its tokens (REINFORCE, and for the naturalness loss, whose CIDEr needs discrete words).

This is for training only: at test time the speaker emits discrete words (`model.generate`), as in Vered et al. 2019.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..generation.step_decoding import STEPS_BETWEEN_END_CHECKS
from ..models.captions import soft_word_embeddings

if TYPE_CHECKING:
    from ..models.show_tell_rl import ShowTellRL
    from ..models.speaker_listener import SpeakerListener

__all__ = ["WORD_PASSING_MODES", "PassedWords", "decode_with_word_passing", "soft_word_embeddings"]

WORD_PASSING_MODES = ("st", "gumbel", "st_gumbel", "psst", "psst_gumbel", "reinforce")
_GUMBEL_MODES = ("gumbel", "st_gumbel", "psst_gumbel")
_PARTIAL_SAMPLING_MODES = ("psst", "psst_gumbel")


@dataclass
class PassedWords:
    """
    Captions decoded by [`decode_with_word_passing`], with the word vectors a listener reads.

    Every tensor holds one column per decoding step (`<bos>` is not included); steps after a caption's end token are
    masked out by `step_mask` and hold zeros (`pad_token_id` in `token_ids`).

    Args:
        words (`torch.FloatTensor` of shape `(batch_size, num_steps, vocab_size)`):
            The passed word vectors `w_t`; differentiable with respect to the speaker's parameters except in
            `"reinforce"` mode. Embed them with [`soft_word_embeddings`].
        probabilities (`torch.FloatTensor` of shape `(batch_size, num_steps, vocab_size)`):
            The speaker's distributions `p_t = softmax(logits_t / temperature)`, with gradient. `<pad>` and `<bos>`
            have probability 0.
        token_ids (`torch.LongTensor` of shape `(batch_size, num_steps)`):
            The sampled tokens: from `p_t` (multinomial modes) or the argmax of the Gumbel-softmax vector (Gumbel
            modes, a sample from `p_t` by the Gumbel-max trick). Prepend `<bos>` for teacher forcing or `generate`-
            style sequences.
        step_mask (`torch.LongTensor` of shape `(batch_size, num_steps)`):
            1 up to and including each caption's first end token, 0 after; a caption without an end token ran to
            `max_length`.
        log_probs (`torch.FloatTensor` of shape `(batch_size, num_steps)`):
            `log p_t(token_ids[:, t])`, with gradient (REINFORCE); 0 where `step_mask` is 0.
        soft_steps (`torch.BoolTensor` of shape `(batch_size, num_steps)`):
            True where the full (multinomial or Gumbel-softmax) vector was passed instead of a one-hot: every step in
            `"gumbel"` mode, the coin draws in the PSST modes, never in the others.
    """

    words: torch.FloatTensor
    probabilities: torch.FloatTensor
    token_ids: torch.LongTensor
    step_mask: torch.LongTensor
    log_probs: torch.FloatTensor
    soft_steps: torch.BoolTensor

    @property
    def one_hots(self) -> torch.FloatTensor:
        """The one-hots of `token_ids`, `(batch_size, num_steps, vocab_size)`, without gradient; zero after the end."""
        one_hots = F.one_hot(self.token_ids, self.words.shape[-1]).to(self.words.dtype)
        return one_hots * self.step_mask[..., None].to(self.words.dtype)


def decode_with_word_passing(
    model: ShowTellRL | SpeakerListener,
    pixel_values: torch.FloatTensor | None = None,
    image_features: torch.FloatTensor | None = None,
    image_feature_mask: torch.LongTensor | None = None,
    mode: str = "psst",
    max_length: int | None = None,
    rho: float = 0.25,
    gumbel_temperature: float = 1.0,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> PassedWords:
    """
    Samples captions while passing differentiable word vectors (Vered et al. 2019); for training only.

    Gradients flow into every speaker parameter (image encoder, LSTM, word embeddings, vocabulary projection) through
    the passed words and through the speaker's own inputs (`w_t @ E` at step t + 1); in `"reinforce"` mode the
    speaker reads the token embeddings and only `log_probs` carries gradient. Dropout follows the model's mode, as in
    any forward pass: call it in training mode to train with dropout, in eval mode for deterministic distributions.

    Args:
        model ([`ShowTellRL`] or [`SpeakerListener`]): the speaker, or a speaker-listener whose speaker decodes.
        pixel_values (`torch.FloatTensor` of shape `(batch_size, num_channels, height, width)`, *optional*):
            Images (`"cnn"`/`"backbone"` encoders).
        image_features (`torch.FloatTensor` of shape `(batch_size, image_feature_size)`, *optional*):
            Precomputed features (`"features"` encoder); `(batch_size, num_regions, image_feature_size)` for a speaker
            with `image_feature_layout="grid"`.
        image_feature_mask (`torch.LongTensor` of shape `(batch_size, num_regions)`, *optional*):
            1 for a real region of `image_features`, 0 for padding; the speaker attends over the real regions only.
        mode (`str`, *optional*, defaults to `"psst"`):
            One of [`WORD_PASSING_MODES`] (see the module documentation).
        max_length (`int`, *optional*):
            Maximum caption length with `<bos>` included, as in `generate`: at most `max_length - 1` steps. Defaults
            to `config.max_caption_length + 1`. Decoding stops earlier once every caption has ended (asked every
            few steps; the steps decoded past the last end are left out, but they draw from `generator`).
        rho (`float`, *optional*, defaults to 0.25):
            Probability of passing the full vector at a step, in `[0, 1]` (PSST modes only).
        gumbel_temperature (`float`, *optional*, defaults to 1.0):
            Temperature `tau > 0` of the Gumbel-softmax (Gumbel modes only).
        temperature (`float`, *optional*, defaults to 1.0):
            Sampling temperature `> 0` of the speaker's distribution `p_t`.
        generator (`torch.Generator`, *optional*):
            Source of every random draw (token samples, Gumbel noise, PSST coins), on the model's device; the global
            generator when `None`. Dropout masks come from the global generator, like every dropout layer's.

    Returns:
        [`PassedWords`] with `num_steps <= max_length - 1`.
    """
    model = getattr(model, "speaker", model)
    if mode not in WORD_PASSING_MODES:
        raise ValueError(f"Unknown word passing mode {mode!r}; choose one of {WORD_PASSING_MODES}.")
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho is a probability and must lie in [0, 1], got {rho}.")
    if gumbel_temperature <= 0:
        raise ValueError(f"gumbel_temperature must be positive, got {gumbel_temperature}.")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}.")
    config = model.config
    max_length = config.max_caption_length + 1 if max_length is None else max_length
    if max_length < 2:
        raise ValueError(f"max_length counts <bos> and must be at least 2 to decode a word, got {max_length}.")

    state = model.initial_state(pixel_values, image_features, image_feature_mask)
    batch_size, device = state.hidden.shape[1], state.hidden.device
    never_predicted = model.never_predicted_ids(device)
    inputs = model.word_embeddings(torch.full((batch_size,), config.bos_token_id, device=device))  # (B, W)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    steps = []
    for step in range(max_length - 1):
        top_hidden, state = model._step_state(inputs, state)
        # dividing the lowest finite score of <pad>/<bos> by a temperature below 1 gives -inf: reset it, so that the
        # probabilities and the Gumbel scores stay finite and a gradient through the softmax never becomes NaN
        scores = _exclude(model._vocabulary_scores(top_hidden).float() / temperature, never_predicted)  # (B, V)
        probabilities = torch.softmax(scores, dim=-1)
        log_probs = torch.log_softmax(scores, dim=-1)
        words, token_ids, soft = _pass_words(
            probabilities, log_probs, mode, rho, gumbel_temperature, never_predicted, generator
        )
        alive = ~finished
        token_ids = token_ids.masked_fill(finished, config.pad_token_id)
        steps.append(
            (
                torch.where(alive[:, None], words, 0.0),
                torch.where(alive[:, None], probabilities, 0.0),
                token_ids,
                alive,
                torch.where(alive, log_probs.gather(-1, token_ids[:, None])[:, 0], 0.0),
                soft & alive,
            )
        )
        finished = finished | (token_ids == config.eos_token_id)
        # asked every few steps: each answer waits for the device; the steps run past the last end are cut below
        if step % STEPS_BETWEEN_END_CHECKS == 0 and bool(finished.all()):
            break
        # the speaker reads what it passed, so the listener's gradient reaches the earlier steps too
        if mode == "reinforce":
            inputs = model.word_embeddings(token_ids)
        else:
            inputs = soft_word_embeddings(words, model.word_embeddings)
    # up to the longest caption's end, as if every step had asked (one wait for the device)
    num_steps = int(torch.stack([alive for _, _, _, alive, _, _ in steps]).sum(dim=0).max())
    words, probabilities, token_ids, alive, log_probs, soft = (
        torch.stack(column[:num_steps], dim=1) for column in zip(*steps, strict=True)
    )
    return PassedWords(
        words=words,
        probabilities=probabilities,
        token_ids=token_ids,
        step_mask=alive.long(),
        log_probs=log_probs,
        soft_steps=soft,
    )


def _exclude(scores: torch.FloatTensor, token_ids: torch.LongTensor) -> torch.FloatTensor:
    """`scores` `(B, V)` with the lowest finite value at `token_ids`, so they are never sampled nor passed."""
    return scores.index_fill(-1, token_ids, torch.finfo(scores.dtype).min)


def _pass_words(
    probabilities: torch.FloatTensor,
    log_probs: torch.FloatTensor,
    mode: str,
    rho: float,
    gumbel_temperature: float,
    never_predicted: torch.LongTensor,
    generator: torch.Generator | None,
) -> tuple[torch.FloatTensor, torch.LongTensor, torch.BoolTensor]:
    """One step's passed words `(B, V)`, sampled tokens `(B,)` and soft-step flags `(B,)` from `p_t` `(B, V)`."""
    if mode in _GUMBEL_MODES:
        # Gumbel-max: argmax(log p + g) with g ~ Gumbel(0, 1) samples from p; clamping keeps g finite
        uniform = torch.rand(probabilities.shape, generator=generator, device=probabilities.device)
        tiny = torch.finfo(uniform.dtype).tiny
        gumbel_noise = -torch.log(-torch.log(uniform.clamp(tiny, 1.0 - torch.finfo(uniform.dtype).eps)))
        soft = torch.softmax(_exclude((log_probs + gumbel_noise) / gumbel_temperature, never_predicted), dim=-1)
        token_ids = soft.argmax(dim=-1)
    else:
        soft = probabilities
        token_ids = torch.multinomial(probabilities, 1, generator=generator)[:, 0]
    one_hot = F.one_hot(token_ids, probabilities.shape[-1]).to(soft.dtype)
    if mode == "reinforce":
        return one_hot, token_ids, torch.zeros_like(token_ids, dtype=torch.bool)
    if mode == "gumbel":
        return soft, token_ids, torch.ones_like(token_ids, dtype=torch.bool)
    # straight-through: `soft - soft.detach()` is exactly zero, so the forward value is the exact one-hot, while the
    # backward pass sees `soft` (adding `soft` and subtracting it again would leave rounding errors)
    straight_through = one_hot + (soft - soft.detach())
    if mode not in _PARTIAL_SAMPLING_MODES:
        return straight_through, token_ids, torch.zeros_like(token_ids, dtype=torch.bool)
    # PSST's coin, one per caption and step; rho = 0 or 1 needs no draw, so that rho = 0 consumes the generator
    # exactly like the straight-through mode it equals
    if 0.0 < rho < 1.0:
        passes_soft = torch.rand(token_ids.shape, generator=generator, device=token_ids.device) < rho
    else:
        passes_soft = torch.full_like(token_ids, rho == 1.0, dtype=torch.bool)
    return torch.where(passes_soft[:, None], soft, straight_through), token_ids, passes_soft
