import math

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForImageTextToText, AutoProcessor

import rlcaption.auto  # noqa: F401  (registers the Auto classes)
from rlcaption.generation.captioners import captioner_for
from rlcaption.models import PolicyValueCaptioner, PolicyValueConfig, ShowTellRL, ShowTellRLConfig
from rlcaption.models.policy_value import ValueLookaheadLogitsProcessor
from rlcaption.models.policy_value.configuration_policy_value import VALUE_RNN_TYPES
from rlcaption.models.policy_value.modeling_policy_value import DEFAULT_LOOKAHEAD_CANDIDATES
from rlcaption.models.show_tell_rl.encoders import MixedPrecisionLSTM
from rlcaption.processing import CaptionProcessor

PAD, BOS, EOS = 0, 1, 2
VOCAB_SIZE = 40


def tiny_policy_config(**overrides) -> ShowTellRLConfig:
    fields = dict(
        vocab_size=VOCAB_SIZE, hidden_size=24, word_embedding_size=16, image_size=16, cnn_channels=[4, 8],
        max_caption_length=7, dropout=0.1,
    )  # fmt: skip
    fields.update(overrides)
    return ShowTellRLConfig(**fields)


def tiny_config(value_rnn_type: str = "gru", **policy_overrides) -> PolicyValueConfig:
    return PolicyValueConfig(
        policy_config=tiny_policy_config(**policy_overrides),
        value_word_embedding_size=12,
        value_hidden_size=20,
        value_mlp_hidden_size=18,
        value_rnn_type=value_rnn_type,
    )


def tiny_model(seed: int = 0, value_rnn_type: str = "gru", **policy_overrides) -> PolicyValueCaptioner:
    torch.manual_seed(seed)
    model = PolicyValueCaptioner(tiny_config(value_rnn_type, **policy_overrides)).eval()
    with torch.no_grad():  # values of order 1 (a fresh head outputs about 0), so that lookahead changes the beams
        model.value_network.value_head[-1].weight.mul_(50.0)
    return model


def random_pixels(batch_size: int, seed: int = 2) -> torch.FloatTensor:
    return torch.randn(batch_size, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def random_captions(batch_size: int, length: int, seed: int = 1) -> torch.LongTensor:
    words = torch.randint(3, VOCAB_SIZE, (batch_size, length - 1), generator=torch.Generator().manual_seed(seed))
    return torch.cat([torch.full((batch_size, 1), BOS), words], dim=1)


def test_config_serialises_the_policy_and_rejects_a_value_network_it_cannot_build():
    config = tiny_config()
    assert config.value_cnn_channels == [4, 8]
    assert config.get_text_config() is config.policy_config
    reloaded = PolicyValueConfig.from_dict(config.to_dict())
    assert reloaded.policy_config.to_dict() == config.policy_config.to_dict()
    with pytest.raises(ValueError, match="divisible"):
        PolicyValueConfig(policy_config=tiny_policy_config(), value_cnn_channels=[4, 4, 4, 4, 4])
    assert config.value_rnn_type == "gru"  # the published checkpoints' value network
    with pytest.raises(ValueError, match="value_rnn_type='rnn' is not one of"):
        PolicyValueConfig(policy_config=tiny_policy_config(), value_rnn_type="rnn")
    with pytest.raises(ValueError, match="value_hidden_size"):
        PolicyValueConfig(policy_config=tiny_policy_config(), value_hidden_size=0)


def test_generate_forward_and_caption_tokens_are_the_policy_s():
    model = tiny_model()
    pixel_values = random_pixels(3)
    assert torch.equal(model.generate(pixel_values=pixel_values), model.policy.generate(pixel_values=pixel_values))
    beams = dict(pixel_values=pixel_values, num_beams=3, num_return_sequences=2)
    assert torch.equal(model.generate(**beams), model.policy.generate(**beams))
    captions = random_captions(3, 6)
    torch.testing.assert_close(
        model(input_ids=captions, pixel_values=pixel_values).logits,
        model.policy(input_ids=captions, pixel_values=pixel_values).logits,
        rtol=0,
        atol=0,
    )
    assert model.generation_config is model.policy.generation_config
    captioner = captioner_for(model)
    assert captioner.family == "PolicyValueCaptioner"
    assert (captioner.tokens.start_token_id, captioner.tokens.end_token_id) == (BOS, EOS)


@pytest.mark.parametrize("value_rnn_type", VALUE_RNN_TYPES)
def test_save_load_round_trip_and_auto_classes(tmp_path, value_rnn_type):
    processor = CaptionProcessor.from_captions(["a red circle", "a blue square left of a green star"], image_size=16)
    model = tiny_model(vocab_size=len(processor.tokenizer), value_rnn_type=value_rnn_type)
    model.generation_config.max_length = 6
    pixel_values = random_pixels(2)
    captions = model.generate(pixel_values=pixel_values, num_beams=2)
    lookahead = model.generate(pixel_values=pixel_values, num_beams=2, lookahead_lambda=0.4)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)

    loaded = PolicyValueCaptioner.from_pretrained(tmp_path).eval()
    assert type(loaded.value_network.caption_rnn) is {"gru": torch.nn.GRU, "lstm": MixedPrecisionLSTM}[value_rnn_type]
    assert loaded.generation_config.max_length == 6
    assert torch.equal(loaded.generate(pixel_values=pixel_values, num_beams=2), captions)
    assert torch.equal(loaded.generate(pixel_values=pixel_values, num_beams=2, lookahead_lambda=0.4), lookahead)
    torch.testing.assert_close(
        loaded.value(pixel_values, captions), model.value(pixel_values, captions), rtol=0, atol=0
    )

    assert type(AutoConfig.from_pretrained(tmp_path)) is PolicyValueConfig
    assert type(AutoModel.from_pretrained(tmp_path)) is PolicyValueCaptioner
    assert type(AutoModelForImageTextToText.from_pretrained(tmp_path)) is PolicyValueCaptioner
    assert type(AutoProcessor.from_pretrained(tmp_path)) is CaptionProcessor


@pytest.mark.parametrize("value_rnn_type", VALUE_RNN_TYPES)
def test_value_gives_v_of_every_prefix(value_rnn_type):
    model = tiny_model(value_rnn_type=value_rnn_type)
    pixel_values = random_pixels(2)
    captions = random_captions(4, 6)
    image_index = torch.tensor([0, 0, 1, 1])
    values = model.value(pixel_values, captions, image_index=image_index)
    assert values.shape == (4, 6)
    # one image row per caption, or each image once with image_index: the same values
    torch.testing.assert_close(model.value(pixel_values[image_index], captions), values)
    # v of the prefix ending at t depends on that prefix alone
    for length in (1, 3, 6):
        prefix_values = model.value(pixel_values, captions[:, :length], image_index=image_index)
        torch.testing.assert_close(prefix_values, values[:, :length], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(values[:, 1], values[:, 2])  # the partial caption matters
    assert not torch.allclose(values[0], values[2])  # and so does the image


@pytest.mark.parametrize("value_rnn_type", VALUE_RNN_TYPES)
def test_value_skips_padding_left_right_and_after_the_end(value_rnn_type):
    model = tiny_model(value_rnn_type=value_rnn_type)
    pixel_values = random_pixels(1)
    caption = torch.tensor([[BOS, 5, 9, EOS]])
    expected = model.value(pixel_values, caption)  # (1, 4)
    left = torch.tensor([[PAD, PAD, BOS, 5, 9, EOS]])
    right = torch.tensor([[BOS, 5, 9, EOS, PAD, PAD]])
    inside = torch.tensor([[BOS, 5, 30, 9, EOS, 17]])
    inside_mask = torch.tensor([[1, 1, 0, 1, 1, 0]])
    torch.testing.assert_close(model.value(pixel_values, left)[:, 2:], expected, rtol=1e-5, atol=1e-6)
    padded = model.value(pixel_values, right)
    torch.testing.assert_close(padded[:, :4], expected, rtol=1e-5, atol=1e-6)
    # after the end: the whole caption's value
    torch.testing.assert_close(padded[:, 4:], padded[:, 3:4].expand(-1, 2), rtol=1e-6, atol=1e-7)
    holes = model.value(pixel_values, inside, attention_mask=inside_mask)
    torch.testing.assert_close(holes[:, [0, 1, 3, 4]], expected, rtol=1e-5, atol=1e-6)


def test_the_value_loss_reaches_the_value_network_and_no_policy_parameter():
    model = tiny_model().train()
    pixel_values = random_pixels(3)
    captions = random_captions(3, 6)
    policy_ids = {id(parameter) for parameter in model.policy.parameters()}
    assert not policy_ids & {id(parameter) for parameter in model.value_network.parameters()}
    rewards = torch.tensor([0.2, 1.0, -0.5])
    loss = (model.value(pixel_values, captions) - rewards[:, None]).pow(2).mean()
    loss.backward()
    assert all(parameter.grad is None for parameter in model.policy.parameters())
    assert all(parameter.grad is not None for parameter in model.value_network.parameters())
    assert model.value_network.image_encoder.blocks[0].weight.grad.abs().sum() > 0
    assert model.value_network.caption_rnn.weight_hh_l0.grad.abs().sum() > 0


def test_a_detached_value_network_is_saved_loaded_and_moved_with_the_model(tmp_path):
    model = tiny_model()
    value_network = model.value_network
    value_ids = {id(parameter) for parameter in value_network.parameters()}
    assert model.detach_value_network() is value_network
    assert model.detach_value_network() is value_network  # idempotent
    assert model.value_network is value_network and model.value_network_is_detached
    assert not value_ids & {id(parameter) for parameter in model.parameters()}
    assert not any(key.startswith("value_network.") for key in model.state_dict())

    model.save_pretrained(tmp_path)
    assert model.value_network_is_detached
    loaded = PolicyValueCaptioner.from_pretrained(tmp_path)
    for name, tensor in loaded.value_network.state_dict().items():
        assert torch.equal(tensor, value_network.state_dict()[name]), name

    other = tiny_model(seed=1)  # what a resumed run does: load saved weights into a model with a detached network
    other.detach_value_network()
    other.load_state_dict(loaded.state_dict())
    for name, tensor in other.value_network.state_dict().items():
        assert torch.equal(tensor, value_network.state_dict()[name]), name

    model.to(torch.float64)
    assert all(parameter.dtype == torch.float64 for parameter in value_network.parameters())
    model.train()
    assert value_network.training
    model.attach_value_network()
    assert not model.value_network_is_detached


def test_from_policy_copies_the_policy_and_its_fixed_encoder():
    torch.manual_seed(3)
    policy = ShowTellRL(tiny_policy_config()).eval()
    policy.generation_config.num_beams = 2
    model = PolicyValueCaptioner.from_policy(policy, value_hidden_size=8)
    for name, tensor in policy.state_dict().items():
        assert torch.equal(model.policy.state_dict()[name], tensor), name
    assert model.generation_config.num_beams == 2
    assert not model.config.freeze_value_image_encoder  # a trainable policy encoder is not a feature extractor

    policy.freeze_image_encoder(True)
    frozen = PolicyValueCaptioner.from_policy(policy, value_hidden_size=8)
    assert frozen.config.freeze_value_image_encoder
    for name, tensor in policy.image_encoder.state_dict().items():
        assert torch.equal(frozen.value_network.image_encoder.state_dict()[name], tensor), name
    assert not any(parameter.requires_grad for parameter in frozen.value_network.image_encoder.parameters())
    assert all(parameter.requires_grad for parameter in frozen.value_network.caption_rnn.parameters())


# ---------------------------------------------------------------- lookahead decoding


@pytest.mark.parametrize("value_rnn_type", VALUE_RNN_TYPES)
def test_next_token_values_equal_the_values_of_the_extended_prefixes(value_rnn_type):
    model = tiny_model(value_rnn_type=value_rnn_type)
    pixel_values = random_pixels(2)
    prefixes = torch.tensor([[PAD, BOS, 7, 8], [BOS, 4, 5, 6]])  # a left-padded prompt, and a plain prefix
    candidates = torch.tensor([[EOS, 3, 11], [9, 9, 20]])
    network = model.value_network
    with torch.no_grad():
        current, extended = network.next_token_values(network.encode_images(pixel_values), prefixes, candidates)
    assert current.shape == (2,) and extended.shape == (2, 3)
    torch.testing.assert_close(current, model.value(pixel_values, prefixes)[:, -1], rtol=1e-5, atol=1e-6)
    for k in range(3):
        longer = torch.cat([prefixes, candidates[:, k : k + 1]], dim=1)
        torch.testing.assert_close(extended[:, k], model.value(pixel_values, longer)[:, -1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_return_sequences", [1, 3])
def test_lookahead_with_lambda_1_is_plain_beam_search(num_return_sequences):
    model = tiny_model(seed=4)
    pixel_values = random_pixels(3, seed=5)
    settings = dict(
        pixel_values=pixel_values, num_beams=4, num_return_sequences=num_return_sequences,
        return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    plain = model.generate(**settings)
    lookahead = model.generate(**settings, lookahead_lambda=1.0)
    assert torch.equal(lookahead.sequences, plain.sequences)
    assert torch.equal(lookahead.sequences_scores, plain.sequences_scores)
    # with the value network weighed in, the search ranks otherwise (the test above could not pass by accident)
    weighed = model.generate(**settings, lookahead_lambda=0.4)
    assert not torch.equal(weighed.sequences_scores, plain.sequences_scores)


def test_lookahead_beam_search_by_hand_on_a_two_step_toy():
    # tokens <pad> <bos> <eos> A B; the policy is the same at every step: p(A) = 0.5, p(B) = 0.35, p(<eos>) = 0.15
    A, B = 3, 4
    torch.manual_seed(0)
    config = PolicyValueConfig(
        policy_config=ShowTellRLConfig(
            vocab_size=5, hidden_size=8, word_embedding_size=8, image_size=16, cnn_channels=[4, 8],
            max_caption_length=2, dropout=0.0,
        ),
        value_word_embedding_size=4, value_hidden_size=4, value_mlp_hidden_size=4,
    )  # fmt: skip
    model = PolicyValueCaptioner(config).eval()
    with torch.no_grad():  # <pad> and <bos> get the lowest logit from the model itself
        model.policy.lm_head.weight.zero_()
        model.policy.lm_head.bias.copy_(torch.tensor([1.0, 1.0, 0.15, 0.5, 0.35]).log())
    # the value network's estimates, by the tokens after <bos>; extensions by <pad> or <bos> have probability 0
    table = {
        (): 0.0, (A,): 0.0, (B,): 1.0, (EOS,): -1.0,
        (A, A): 0.0, (A, B): 0.5, (A, EOS): 0.0, (B, A): 0.0, (B, B): 2.0, (B, EOS): 1.0,
    }  # fmt: skip

    def table_values(image_embeddings, input_ids, candidate_ids):
        prefixes = [tuple(row[1:].tolist()) for row in input_ids]
        current = torch.tensor([table.get(prefix, 0.0) for prefix in prefixes])
        extended = [
            [table.get((*prefix, token), 0.0) for token in tokens]
            for prefix, tokens in zip(prefixes, candidate_ids.tolist(), strict=True)
        ]
        return current, torch.tensor(extended)

    model.value_network.next_token_values = table_values
    settings = dict(
        pixel_values=random_pixels(1), num_beams=2, length_penalty=0.0, return_dict_in_generate=True,
        output_scores=True,
    )  # fmt: skip
    lam = 0.4

    def score(tokens: tuple[int, ...], probability: float) -> float:
        return lam * math.log(probability) + (1 - lam) * (table[tokens] - table[()])

    # step 1 from <bos>: B 0.4 log .35 + 0.6 = 0.180, A 0.4 log .5 = -0.277, <eos> -1.359: the beams are B and A.
    # step 2, the last: BB 0.4 log .1225 + 1.2 = 0.360, AB 0.4 log .175 + 0.3 = -0.397, AA -0.555, B<eos> -0.579
    output = model.generate(**settings, num_return_sequences=2, lookahead_lambda=lam)
    assert output.sequences.tolist() == [[BOS, B, B], [BOS, A, B]]
    expected = torch.tensor([score((B, B), 0.35 * 0.35), score((A, B), 0.5 * 0.35)])
    torch.testing.assert_close(output.sequences_scores, expected, rtol=1e-5, atol=1e-6)
    # the policy alone prefers A A
    plain = model.generate(**settings)
    assert plain.sequences.tolist() == [[BOS, A, A]]
    torch.testing.assert_close(plain.sequences_scores, torch.tensor([0.25]).log(), rtol=1e-5, atol=1e-6)


def test_lookahead_processor_keeps_impossible_tokens_out_and_restricts_to_candidates():
    scores = torch.tensor([[float("-inf"), math.log(0.6), math.log(0.3), math.log(0.1)]])

    def values(input_ids, candidate_ids):
        return torch.zeros(1), 10.0 * torch.ones_like(candidate_ids, dtype=torch.float32)

    processed = ValueLookaheadLogitsProcessor(values, lookahead_lambda=0.0)(torch.tensor([[BOS]]), scores)
    assert processed[0, 0] == float("-inf")  # ruled out by the policy, whatever its value
    torch.testing.assert_close(processed[0, 1:], torch.full((3,), 10.0))
    top_two = ValueLookaheadLogitsProcessor(values, lookahead_lambda=0.5, num_candidates=2)(
        torch.tensor([[BOS]]), scores
    )
    torch.testing.assert_close(top_two[0, 1:3], 0.5 * scores[0, 1:3] + 5.0)
    assert torch.isneginf(top_two[0, [0, 3]]).all()


def test_lookahead_refuses_settings_it_cannot_honour():
    model = tiny_model()
    pixel_values = random_pixels(2)
    with pytest.raises(ValueError, match="num_beams >= 2"):
        model.generate(pixel_values=pixel_values, lookahead_lambda=0.4)
    with pytest.raises(ValueError, match="num_beams >= 2"):
        model.generate(pixel_values=pixel_values, num_beams=3, do_sample=True, lookahead_lambda=0.4)
    with pytest.raises(ValueError, match="lookahead_lambda"):
        model.generate(pixel_values=pixel_values, num_beams=3, lookahead_lambda=1.5)
    with pytest.raises(ValueError, match="set lookahead_lambda too"):
        model.generate(pixel_values=pixel_values, num_beams=3, lookahead_candidates=5)


def _candidates_valued_per_beam(model: PolicyValueCaptioner, **generate_kwargs) -> set[int]:
    """The numbers of candidates the value network was handed per beam during one `generate` call."""
    counts = set()
    next_token_values = model.value_network.next_token_values

    def counting(image_embeddings, input_ids, candidate_ids, attention_mask=None):
        counts.add(candidate_ids.shape[1])
        return next_token_values(image_embeddings, input_ids, candidate_ids, attention_mask)

    model.value_network.next_token_values = counting
    try:
        model.generate(**generate_kwargs)
    finally:
        del model.value_network.next_token_values  # back to the method
    return counts


def test_lookahead_values_only_the_policy_s_top_candidates_by_default():
    vocab_size = 3 * DEFAULT_LOOKAHEAD_CANDIDATES
    model = tiny_model(vocab_size=vocab_size)
    settings = dict(pixel_values=random_pixels(2), num_beams=3, lookahead_lambda=0.4)
    assert _candidates_valued_per_beam(model, **settings) == {DEFAULT_LOOKAHEAD_CANDIDATES}
    assert _candidates_valued_per_beam(model, **settings, lookahead_candidates=7) == {7}
    assert _candidates_valued_per_beam(model, **settings, lookahead_candidates=vocab_size + 5) == {vocab_size}


def test_lookahead_over_the_top_candidates_equals_the_full_search_when_they_cover_its_choices():
    vocab_size, num_beams = 120, 3
    model = tiny_model(seed=1, vocab_size=vocab_size)
    with torch.no_grad():  # a peaked policy, as a trained one is: its best candidates are few
        model.policy.lm_head.weight.mul_(8.0)
    settings = dict(
        pixel_values=random_pixels(3, seed=1), num_beams=num_beams, num_return_sequences=2, lookahead_lambda=0.4,
        return_dict_in_generate=True, output_scores=True, output_logits=True,
    )  # fmt: skip
    full = model.generate(**settings, lookahead_candidates=vocab_size)
    # beam search keeps at most 2 · num_beams extensions of a beam: the full search's choices at a step lie among each
    # beam's 2 · num_beams best lookahead scores; their worst rank under the policy is how many candidates cover them
    covering = 0
    for lookahead_scores, policy_logits in zip(full.scores, full.logits, strict=True):
        policy_rank = policy_logits.argsort(dim=-1, descending=True).argsort(dim=-1)  # (beams, vocab)
        choices = lookahead_scores.topk(2 * num_beams, dim=-1).indices
        covering = max(covering, int(policy_rank.gather(1, choices).max()) + 1)
    assert covering < vocab_size // 4  # the restricted search is a real restriction
    restricted = model.generate(**settings, lookahead_candidates=covering)
    assert torch.equal(restricted.sequences, full.sequences)
    torch.testing.assert_close(restricted.sequences_scores, full.sequences_scores, rtol=0, atol=0)
    # with fewer candidates than that, the search is restricted where the full one chose
    narrower = model.generate(**settings, lookahead_candidates=1)
    assert not torch.equal(narrower.sequences_scores, full.sequences_scores)
