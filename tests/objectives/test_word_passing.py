"""Differentiable word passing (Vered et al. 2019): straight-through, Gumbel-softmax and PSST words from ShowTellRL."""

import pytest
import torch
from torch import nn

from rlcaption.models import SpeakerListener
from rlcaption.models.captions import soft_word_embeddings
from rlcaption.models.show_tell_rl import ShowTellRL, ShowTellRLConfig
from rlcaption.objectives import word_passing
from rlcaption.objectives.word_passing import WORD_PASSING_MODES, PassedWords, decode_with_word_passing

PAD, BOS, EOS = 0, 1, 2
VOCAB_SIZE = 30
DIFFERENTIABLE_MODES = [mode for mode in WORD_PASSING_MODES if mode != "reinforce"]
WITH_AND_WITHOUT_ATTENTION = pytest.mark.parametrize("image_attention", [False, True], ids=["show-tell", "attention"])


def tiny_speaker(seed: int = 0, eos_bias: float = 0.0, **overrides) -> ShowTellRL:
    torch.manual_seed(seed)
    fields = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        word_embedding_size=16,
        image_size=16,
        cnn_channels=[4, 8],
        max_caption_length=8,
        dropout=0.0,
    )
    fields.update(overrides)
    model = ShowTellRL(ShowTellRLConfig(**fields)).eval()
    with torch.no_grad():
        model.lm_head.bias[EOS] += eos_bias  # a random model rarely ends a caption: make some captions end early
    return model


def pixels(batch_size: int = 4, seed: int = 2) -> torch.FloatTensor:
    return torch.randn(batch_size, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def decode(model: ShowTellRL, mode: str, seed: int = 5, **kwargs) -> PassedWords:
    return decode_with_word_passing(
        model, pixel_values=pixels(), mode=mode, generator=torch.Generator().manual_seed(seed), **kwargs
    )


def assert_same_passed_words(first: PassedWords, second: PassedWords) -> None:
    for name in ("words", "probabilities", "token_ids", "step_mask", "log_probs", "soft_steps"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name


# ------------------------------------------------------------------ gradients


@pytest.mark.parametrize("mode", DIFFERENTIABLE_MODES)
def test_a_loss_on_the_passed_words_reaches_every_part_of_the_speaker(mode):
    model = tiny_speaker()
    passed = decode(model, mode, max_length=6, rho=0.5)
    assert passed.words.requires_grad
    weights = torch.randn(passed.words.shape, generator=torch.Generator().manual_seed(9))
    (passed.words * weights).sum().backward()
    parts = {
        "lm_head": model.lm_head.weight,
        "lstm": model.lstm.weight_ih_l0,
        "word_embeddings": model.word_embeddings.weight,
        "image_encoder": next(model.image_encoder.parameters()),
    }
    for name, parameter in parts.items():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_the_speaker_reads_the_passed_vector_through_its_embedding_matrix():
    # with rho = 1 the second step's input is p_1 @ E: a loss on the second words reaches every row of E that p_1
    # gives weight to, not only the rows of the sampled tokens as an embedding lookup would
    model = tiny_speaker()
    passed = decode(model, "psst", rho=1.0, max_length=3)
    assert passed.step_mask[:, 1].all()
    weights = torch.randn(passed.words[:, 1].shape, generator=torch.Generator().manual_seed(9))
    (passed.words[:, 1] * weights).sum().backward()
    row_gradients = model.word_embeddings.weight.grad.abs().sum(-1)
    assert (row_gradients[EOS:] > 0).all()
    assert row_gradients[PAD] == 0  # p(<pad>) = 0


def test_a_listener_loss_backpropagates_through_soft_embeddings():
    model = tiny_speaker()
    passed = decode(model, "psst", max_length=6)
    listener_embeddings = nn.Embedding(VOCAB_SIZE, 8)
    listener = nn.GRU(8, 8, batch_first=True)
    embedded = soft_word_embeddings(passed.words, listener_embeddings)  # (B, T, 8)
    _, final = listener(embedded)
    final.sum().backward()
    assert model.lm_head.weight.grad.abs().sum() > 0
    assert listener_embeddings.weight.grad.abs().sum() > 0


def test_reinforce_passes_no_gradient_through_words_but_through_log_probs():
    model = tiny_speaker()
    passed = decode(model, "reinforce", max_length=6)
    assert not passed.words.requires_grad
    assert torch.equal(passed.words, passed.one_hots)
    assert passed.log_probs.requires_grad
    passed.log_probs.sum().backward()
    assert model.lm_head.weight.grad.abs().sum() > 0
    assert next(model.image_encoder.parameters()).grad.abs().sum() > 0


def test_straight_through_gradient_is_that_of_the_probabilities():
    # one step, so no path through time: d sum(w * c) / d theta must equal d sum(p * c) / d theta exactly
    model = tiny_speaker()
    weights = torch.randn(4, 1, VOCAB_SIZE, generator=torch.Generator().manual_seed(3))
    gradients = []
    for field in ("words", "probabilities"):
        model.zero_grad()
        passed = decode(model, "st", max_length=2)
        (getattr(passed, field) * weights).sum().backward()
        gradients.append(model.lm_head.weight.grad.clone())
    assert gradients[0].abs().sum() > 0
    torch.testing.assert_close(gradients[0], gradients[1], rtol=0, atol=0)


# ------------------------------------------------------------------ forward values


def test_straight_through_words_are_exact_one_hots_of_the_sampled_tokens():
    passed = decode(tiny_speaker(eos_bias=3.0), "st")
    assert torch.equal(passed.words, passed.one_hots)
    alive = passed.step_mask.bool()
    assert torch.equal(passed.words[alive].argmax(-1), passed.token_ids[alive])
    assert not passed.soft_steps.any()


def test_psst_with_rho_zero_is_straight_through_bitwise():
    model = tiny_speaker(eos_bias=2.0)
    assert_same_passed_words(decode(model, "psst", rho=0.0), decode(model, "st"))
    assert_same_passed_words(decode(model, "psst_gumbel", rho=0.0), decode(model, "st_gumbel"))


def test_psst_with_rho_one_passes_exactly_the_probabilities():
    model = tiny_speaker(eos_bias=2.0)
    passed = decode(model, "psst", rho=1.0)
    assert torch.equal(passed.words, passed.probabilities)
    assert torch.equal(passed.soft_steps, passed.step_mask.bool())
    assert_same_passed_words(decode(model, "psst_gumbel", rho=1.0), decode(model, "gumbel"))


def test_psst_passes_the_full_distribution_at_about_a_fraction_rho_of_the_steps():
    model = tiny_speaker()
    passed = decode_with_word_passing(
        model,
        pixel_values=pixels(64),
        mode="psst",
        rho=0.25,
        max_length=12,
        generator=torch.Generator().manual_seed(0),
    )
    alive = passed.step_mask.bool()
    fraction = passed.soft_steps[alive].float().mean().item()
    assert 0.18 < fraction < 0.32, fraction
    soft, hard = passed.soft_steps, alive & ~passed.soft_steps
    assert torch.equal(passed.words[soft], passed.probabilities[soft])
    assert torch.equal(passed.words[hard], passed.one_hots[hard])


def test_gumbel_words_are_soft_distributions_whose_argmax_is_the_token():
    passed = decode(tiny_speaker(), "gumbel", gumbel_temperature=0.5)
    alive = passed.step_mask.bool()
    words = passed.words[alive]
    torch.testing.assert_close(words.sum(-1), torch.ones(words.shape[0]))
    assert (words.max(-1).values < 1).any()  # soft, not one-hot
    assert torch.equal(words.argmax(-1), passed.token_ids[alive])
    hard = decode(tiny_speaker(), "st_gumbel", gumbel_temperature=0.5)
    assert torch.equal(hard.words, hard.one_hots)
    assert torch.equal(hard.token_ids, passed.token_ids)  # the same noise gives the same samples


@pytest.mark.parametrize("mode", ["st", "reinforce"])
@WITH_AND_WITHOUT_ATTENTION
def test_probabilities_match_teacher_forcing_of_the_sampled_caption(mode, image_attention):
    # the forward value of a straight-through input is the token's embedding, so the speaker saw the plain caption
    model = tiny_speaker(eos_bias=2.0, image_attention=image_attention)
    with torch.no_grad():
        passed = decode(model, mode)
        bos = torch.full((passed.token_ids.shape[0], 1), BOS)
        input_ids = torch.cat([bos, passed.token_ids], dim=1)
        attention_mask = torch.cat([torch.ones_like(bos), passed.step_mask], dim=1)
        logits = model(input_ids=input_ids, pixel_values=pixels(), attention_mask=attention_mask).logits
    alive = passed.step_mask.bool()
    expected = torch.softmax(logits[:, :-1].float(), dim=-1)
    torch.testing.assert_close(passed.probabilities[alive], expected[alive])
    expected_log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, passed.token_ids[..., None])
    torch.testing.assert_close(passed.log_probs[alive], expected_log_probs[..., 0][alive])


def test_temperature_scales_the_distribution():
    model = tiny_speaker()
    with torch.no_grad():
        plain = decode(model, "st", max_length=2)
        hot = decode(model, "st", max_length=2, temperature=0.5)
    expected = torch.softmax(torch.log(plain.probabilities.clamp_min(1e-30)) / 0.5, dim=-1)
    torch.testing.assert_close(hot.probabilities[:, :, 3:], expected[:, :, 3:], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("mode", WORD_PASSING_MODES)
def test_probabilities_are_finite_and_never_pick_pad_or_bos(mode):
    # a low temperature turns the lowest finite score of <pad>/<bos> into -inf before it is reset
    passed = decode(tiny_speaker(), mode, temperature=0.3, gumbel_temperature=0.1)
    assert torch.isfinite(passed.probabilities).all() and torch.isfinite(passed.words).all()
    assert torch.isfinite(passed.log_probs).all()
    assert (passed.probabilities[..., [PAD, BOS]] == 0).all()
    alive = passed.step_mask.bool()
    assert not torch.isin(passed.token_ids[alive], torch.tensor([PAD, BOS])).any()


# ------------------------------------------------------------------ end of captions


@pytest.mark.parametrize("mode", WORD_PASSING_MODES)
def test_steps_after_the_end_token_are_masked_and_zero(mode):
    max_length = 8
    passed = decode(tiny_speaker(eos_bias=2.5), mode, max_length=max_length)
    dead = ~passed.step_mask.bool()
    assert dead.any(), "the test needs captions that end early"
    assert (passed.words[dead] == 0).all()
    assert (passed.probabilities[dead] == 0).all()
    assert (passed.log_probs[dead] == 0).all()
    assert (passed.token_ids[dead] == PAD).all()
    for tokens, mask in zip(passed.token_ids.tolist(), passed.step_mask.tolist(), strict=True):
        length = sum(mask)
        assert mask == [1] * length + [0] * (len(mask) - length)
        assert tokens[length - 1] == EOS or length == max_length - 1
        assert EOS not in tokens[: length - 1]


def test_decoding_stops_once_every_caption_has_ended():
    passed = decode(tiny_speaker(eos_bias=20.0), "psst", max_length=8)
    assert passed.token_ids.shape == (4, 1)
    assert (passed.token_ids == EOS).all()


@pytest.mark.parametrize("mode", WORD_PASSING_MODES)
def test_asking_every_few_steps_whether_all_captions_ended_gives_the_words_of_asking_every_step(mode, monkeypatch):
    model = tiny_speaker(eos_bias=2.5)  # captions that end at different steps, all before the budget
    every_few_steps = decode(model, mode, max_length=16)
    lengths = every_few_steps.step_mask.sum(dim=1)
    assert lengths.max() < 15 and lengths.min() < lengths.max()
    monkeypatch.setattr(word_passing, "STEPS_BETWEEN_END_CHECKS", 1)
    assert_same_passed_words(decode(model, mode, max_length=16), every_few_steps)


# ------------------------------------------------------------------ randomness and dropout


@pytest.mark.parametrize("mode", WORD_PASSING_MODES)
def test_the_generator_makes_decoding_reproducible(mode):
    model = tiny_speaker()
    assert_same_passed_words(decode(model, mode, seed=7), decode(model, mode, seed=7))
    assert not torch.equal(decode(model, mode, seed=7).words, decode(model, mode, seed=8).words)


def test_dropout_follows_the_models_mode():
    model = tiny_speaker(dropout=0.5)
    eval_words = decode(model, "psst", rho=1.0, max_length=3)
    assert not model.training
    model.train()
    torch.manual_seed(0)
    train_words = decode(model, "psst", rho=1.0, max_length=3)
    assert model.training
    # the first step's distribution differs only by the dropout on the LSTM output
    assert not torch.allclose(train_words.probabilities[:, 0], eval_words.probabilities[:, 0])
    model.eval()
    assert_same_passed_words(decode(model, "psst", rho=1.0, max_length=3), eval_words)


def test_generate_stays_discrete_and_unchanged():
    model = tiny_speaker()
    with torch.no_grad():
        first = model.generate(pixel_values=pixels(), do_sample=False, max_length=6)
        decode(model, "psst")
        second = model.generate(pixel_values=pixels(), do_sample=False, max_length=6)
    assert first.dtype == torch.long and torch.equal(first, second)


# ------------------------------------------------------------------ the functions themselves


def test_a_speaker_listener_decodes_with_its_speaker():
    model = tiny_speaker()
    speaker_listener = SpeakerListener.from_speaker(model, listener_hidden_size=8, joint_embedding_size=8)
    assert_same_passed_words(decode(speaker_listener, "psst_gumbel"), decode(model, "psst_gumbel"))


def test_soft_word_embeddings_embed_one_hots_as_tokens_and_distributions_as_expectations():
    embeddings = nn.Embedding(VOCAB_SIZE, 6)
    token_ids = torch.tensor([[3, 4], [5, 2]])
    one_hots = torch.nn.functional.one_hot(token_ids, VOCAB_SIZE).float()
    assert torch.equal(soft_word_embeddings(one_hots, embeddings), embeddings(token_ids))
    distribution = torch.softmax(torch.randn(2, 2, VOCAB_SIZE), dim=-1)
    torch.testing.assert_close(
        soft_word_embeddings(distribution, embeddings.weight),
        (distribution[..., None] * embeddings.weight).sum(-2),
    )
    with pytest.raises(ValueError, match=r"\(31, 6\)"):
        soft_word_embeddings(one_hots, torch.zeros(31, 6))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mode="straight"), r"'straight'.*'st', 'gumbel'"),
        (dict(rho=1.5), "1.5"),
        (dict(rho=-0.1), "-0.1"),
        (dict(gumbel_temperature=0.0), "gumbel_temperature.*0.0"),
        (dict(temperature=-1.0), "temperature.*-1.0"),
        (dict(max_length=1), "max_length.*1"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        decode_with_word_passing(tiny_speaker(), pixel_values=pixels(), **kwargs)
