"""ShowTellRL on precomputed grids and regions (`image_feature_layout="grid"`): padding must change nothing, in the
forward pass, every decoding of `generate`, the recurrent state, Monte-Carlo rollouts and word passing."""

import pytest
import torch

from rlcaption.generation.decoding import caption_logits, image_inputs_of
from rlcaption.models.show_tell_rl import CACHE_NAME, ShowTellRL, ShowTellRLConfig
from rlcaption.objectives.spider_pg import sample_rollouts, sample_rollouts_per_prefix
from rlcaption.objectives.word_passing import decode_with_word_passing

PAD, BOS, EOS = 0, 1, 2
FEATURE_SIZE = 12
# regions per image: the batch pads them to 5, and the last image has a single region
REGION_COUNTS = (5, 3, 1)
WITH_AND_WITHOUT_ATTENTION = pytest.mark.parametrize("image_attention", [False, True], ids=["mean", "attention"])


def regions_model(seed: int = 0, image_attention: bool = True, **overrides) -> ShowTellRL:
    torch.manual_seed(seed)
    fields = dict(
        vocab_size=50, hidden_size=32, word_embedding_size=16, max_caption_length=8, dropout=0.1,
        encoder_type="features", image_feature_size=FEATURE_SIZE, image_feature_layout="grid",
        image_attention=image_attention,
    )  # fmt: skip
    return ShowTellRL(ShowTellRLConfig(**{**fields, **overrides})).eval()


def image_regions(counts: tuple[int, ...] = REGION_COUNTS, seed: int = 2) -> list[torch.FloatTensor]:
    """The regions of each image, `(count, FEATURE_SIZE)`, unpadded."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(count, FEATURE_SIZE, generator=generator) for count in counts]


def pad_regions(regions: list[torch.FloatTensor], padding_seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """`image_features` `(B, N_max, D)` and `image_feature_mask` `(B, N_max)`; the padding holds large noise, not
    zeros, so that only the mask tells it apart from the regions."""
    generator = torch.Generator().manual_seed(padding_seed)
    features = 100 * torch.randn(len(regions), max(len(r) for r in regions), FEATURE_SIZE, generator=generator)
    mask = torch.zeros(features.shape[:2], dtype=torch.long)
    for row, image in enumerate(regions):
        features[row, : len(image)] = image
        mask[row, : len(image)] = 1
    return features, mask


def random_captions(batch_size: int, length: int, seed: int = 1) -> torch.LongTensor:
    ids = torch.randint(3, 50, (batch_size, length), generator=torch.Generator().manual_seed(seed))
    ids[:, 0] = BOS
    return ids


def trim(sequences: torch.LongTensor) -> list[list[int]]:
    return [[token for token in row.tolist() if token != PAD] for row in sequences]


# ------------------------------------------------------------------ forward


@WITH_AND_WITHOUT_ATTENTION
def test_padded_regions_give_what_each_image_gives_alone(image_attention):
    model = regions_model(image_attention=image_attention)
    regions = image_regions()
    features, mask = pad_regions(regions)
    ids = random_captions(len(regions), 6)
    batch = model(ids, image_features=features, image_feature_mask=mask, output_hidden_states=True)
    log_probs = model.caption_log_probs(ids, image_features=features, image_feature_mask=mask)
    for row, image in enumerate(regions):
        alone = model(ids[row : row + 1], image_features=image[None], output_hidden_states=True)
        torch.testing.assert_close(batch.logits[row], alone.logits[0])
        torch.testing.assert_close(batch.hidden_states[row], alone.hidden_states[0])
        torch.testing.assert_close(getattr(batch, CACHE_NAME).hidden[:, row], getattr(alone, CACHE_NAME).hidden[:, 0])
        torch.testing.assert_close(
            log_probs[row], model.caption_log_probs(ids[row : row + 1], image_features=image[None])[0]
        )


def test_a_fixed_grid_with_an_all_ones_mask_equals_no_mask_and_has_no_position_embeddings():
    model = regions_model()
    assert model.grid_position_embeddings is None  # regions have no fixed positions
    features, ids = torch.randn(2, 4, FEATURE_SIZE), random_captions(2, 6)
    ones = torch.ones(2, 4, dtype=torch.long)
    expected = model(ids, image_features=features).logits
    torch.testing.assert_close(model(ids, image_features=features, image_feature_mask=ones).logits, expected)
    # the mask is read: hiding a region changes what the captions attend to
    hidden_last = ones.clone()
    hidden_last[:, -1] = 0
    assert not torch.allclose(model(ids, image_features=features, image_feature_mask=hidden_last).logits, expected)


def test_attention_reads_the_regions_at_every_step():
    model = regions_model()
    features, mask = pad_regions(image_regions())
    ids = random_captions(3, 6)
    state = model.initial_state(image_features=features, image_feature_mask=mask)
    changed = features.clone()
    changed[0, 1] += 1.0  # a real region of the first image
    other = model.initial_state(image_features=changed, image_feature_mask=mask)
    other.hidden, other.cell = state.hidden, state.cell  # the same first LSTM input: only the grid differs
    logits, _, _ = model.step(ids[:, 0], state)
    other_logits, _, _ = model.step(ids[:, 0], other)
    assert not torch.allclose(logits[0], other_logits[0])
    torch.testing.assert_close(logits[1:], other_logits[1:])


def test_several_captions_per_image_through_image_index_keep_each_images_mask():
    model = regions_model()
    regions = image_regions()
    features, mask = pad_regions(regions)
    image_index = torch.tensor([2, 0, 0, 1, 2])
    ids = random_captions(len(image_index), 6)
    shared = caption_logits(
        model, image_inputs_of({"image_features": features, "image_feature_mask": mask}), ids, image_index=image_index
    )
    for row, image in enumerate(image_index.tolist()):
        alone = model(ids[row : row + 1], image_features=regions[image][None]).logits[0, :-1]
        torch.testing.assert_close(shared[row], alone)


# ------------------------------------------------------------------ recurrent state


def test_selected_and_reordered_states_carry_the_mask():
    model = regions_model()
    features, mask = pad_regions(image_regions())
    tokens = torch.tensor([5, 6, 7])
    state = model.initial_state(image_features=features, image_feature_mask=mask)
    expected, _, _ = model.step(tokens, state)
    order = torch.tensor([2, 0, 1])
    selected = state.select(order)
    assert torch.equal(selected.image_grid_mask, mask[order].bool())
    logits, _, _ = model.step(tokens[order], selected)
    torch.testing.assert_close(logits, expected[order])
    state.reorder_cache(order)  # in place, as beam search does
    logits, _, _ = model.step(tokens[order], state)
    torch.testing.assert_close(logits, expected[order])
    repeated, _, _ = model.step(tokens[order].repeat_interleave(2), state.repeat_interleave(2))
    torch.testing.assert_close(repeated, expected[order].repeat_interleave(2, dim=0))


def test_rollouts_from_prefix_states_ignore_padding_and_equal_the_per_prefix_loop():
    model = regions_model(seed=3)
    features, mask = pad_regions(image_regions())
    num_paths = 2
    image_index = torch.arange(3).repeat_interleave(num_paths)
    sequences = model.generate(image_features=features, image_feature_mask=mask, num_beams=2, num_return_sequences=2)
    token_mask = (sequences[:, 1:] != PAD).float()
    num_rows = 3 * int((token_mask.sum(dim=1) - 1).sum())
    common = dict(
        num_rollouts=3, max_length=8, eos_token_id=EOS, pad_token_id=PAD, image_index=image_index,
        uniforms=torch.rand(num_rows, 8, generator=torch.Generator().manual_seed(7)),
    )  # fmt: skip
    image_inputs = image_inputs_of({"image_features": features, "image_feature_mask": mask})
    batched = sample_rollouts(model, image_inputs, sequences, token_mask, **common)
    looped = sample_rollouts_per_prefix(model, image_inputs, sequences, token_mask, **common)
    assert torch.equal(batched.sequences, looped.sequences)
    kept = sample_rollouts(model, image_inputs, sequences, token_mask, drop_finished_rows=False, **common)
    assert torch.equal(kept.sequences, batched.sequences)
    other_padding, _ = pad_regions(image_regions(), padding_seed=11)
    image_inputs["image_features"] = other_padding
    other_rollouts = sample_rollouts(model, image_inputs, sequences, token_mask, **common)
    assert torch.equal(other_rollouts.sequences, batched.sequences)


# ------------------------------------------------------------------ generate


def test_greedy_and_beam_search_give_each_image_what_it_gets_alone():
    model = regions_model(seed=4)
    regions = image_regions()
    features, mask = pad_regions(regions)
    greedy = model.generate(image_features=features, image_feature_mask=mask, max_length=8)
    beams = model.generate(
        image_features=features, image_feature_mask=mask, num_beams=3, num_return_sequences=2, max_length=8,
        length_penalty=0.0, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    assert beams.sequences.shape[0] == 6
    for row, image in enumerate(regions):
        alone = model.generate(image_features=image[None], max_length=8)
        assert trim(greedy[row : row + 1]) == trim(alone)
        alone_beams = model.generate(
            image_features=image[None], num_beams=3, num_return_sequences=2, max_length=8, length_penalty=0.0,
            return_dict_in_generate=True, output_scores=True,
        )  # fmt: skip
        assert trim(beams.sequences[2 * row : 2 * row + 2]) == trim(alone_beams.sequences)
        torch.testing.assert_close(beams.sequences_scores[2 * row : 2 * row + 2], alone_beams.sequences_scores)


def test_sampling_several_captions_per_image_equals_sampling_from_repeated_images():
    model = regions_model()
    features, mask = pad_regions(image_regions())
    kwargs = dict(do_sample=True, top_k=0, max_length=8)
    torch.manual_seed(0)
    shared = model.generate(image_features=features, image_feature_mask=mask, num_return_sequences=3, **kwargs)
    torch.manual_seed(0)
    repeated = model.generate(
        image_features=features.repeat_interleave(3, dim=0), image_feature_mask=mask.repeat_interleave(3, dim=0),
        **kwargs,
    )  # fmt: skip
    assert shared.shape[0] == 9 and torch.equal(shared, repeated)
    torch.manual_seed(0)
    other_padding, _ = pad_regions(image_regions(), padding_seed=11)
    assert torch.equal(
        model.generate(image_features=other_padding, image_feature_mask=mask, num_return_sequences=3, **kwargs),
        shared,
    )


# ------------------------------------------------------------------ word passing


def test_word_passing_on_regions_ignores_padding_and_trains_the_attention():
    model = regions_model()  # in eval mode: no dropout, so that the two decodings differ only by their padding
    regions = image_regions()
    features, mask = pad_regions(regions)
    other_padding, _ = pad_regions(regions, padding_seed=11)
    common = dict(image_feature_mask=mask, mode="st", max_length=6)
    passed = [
        decode_with_word_passing(model, image_features=padded, generator=torch.Generator().manual_seed(5), **common)
        for padded in (features, other_padding)
    ]
    assert torch.equal(passed[0].token_ids, passed[1].token_ids)
    torch.testing.assert_close(passed[0].probabilities, passed[1].probabilities)
    # the first step's distribution, before any draw, is each image's own: it attends over the real regions only
    for row, image in enumerate(regions):
        alone = decode_with_word_passing(model, image_features=image[None], mode="st", max_length=6)
        torch.testing.assert_close(passed[0].probabilities[row, 0], alone.probabilities[0, 0])
    passed[0].log_probs.sum().backward()
    assert model.grid_projection.weight.grad.abs().sum() > 0


# ------------------------------------------------------------------ saving, config, errors


def test_save_load_round_trip_keeps_the_layout_and_the_outputs(tmp_path):
    model = regions_model()
    model.save_pretrained(tmp_path)
    reloaded = ShowTellRL.from_pretrained(tmp_path).eval()
    assert reloaded.config.image_feature_layout == "grid" and reloaded.config.image_attention
    features, mask = pad_regions(image_regions())
    ids = random_captions(3, 6)
    expected = model(ids, image_features=features, image_feature_mask=mask).logits
    actual = reloaded(ids, image_features=features, image_feature_mask=mask).logits
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_a_config_saved_before_grids_reads_pooled_features():
    fields = regions_model(image_attention=False).config.to_dict()
    del fields["image_feature_layout"]
    config = ShowTellRLConfig.from_dict(fields)
    assert config.image_feature_layout == "pooled"
    assert ShowTellRL(config)(random_captions(2, 4), image_features=torch.randn(2, FEATURE_SIZE)).logits.shape[0] == 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(image_feature_layout="pooled"), "image_feature_layout='grid'"),
        (dict(image_feature_layout="regions"), "image_feature_layout='regions' is not supported"),
    ],
)
def test_config_rejects_attention_without_a_grid_and_unknown_layouts(overrides, message):
    with pytest.raises(ValueError, match=message):
        regions_model(**overrides)


def test_an_image_without_any_region_is_refused_with_its_row():
    model = regions_model()
    features, mask = pad_regions(image_regions())
    mask[1] = 0
    with pytest.raises(ValueError, match=r"no region at all in batch rows \[1\]"):
        model(random_captions(3, 4), image_features=features, image_feature_mask=mask)
    with pytest.raises(ValueError, match=r"no region at all in batch rows \[1\]"):
        model.generate(image_features=features, image_feature_mask=mask, num_beams=2)


def test_a_mask_is_refused_where_there_are_no_regions_to_mask():
    pooled = regions_model(image_attention=False, image_feature_layout="pooled")
    with pytest.raises(ValueError, match="pooled image features"):
        pooled(random_captions(2, 4), image_features=torch.randn(2, FEATURE_SIZE), image_feature_mask=torch.ones(2, 1))
    with pytest.raises(ValueError, match="image_feature_layout='grid'"):
        pooled(random_captions(2, 4), image_features=torch.randn(2, 3, FEATURE_SIZE))
    cnn = ShowTellRL(ShowTellRLConfig(vocab_size=50, hidden_size=8, word_embedding_size=8, image_size=16)).eval()
    with pytest.raises(ValueError, match="drop the mask"):
        cnn(random_captions(2, 4), pixel_values=torch.randn(2, 3, 16, 16), image_feature_mask=torch.ones(2, 1))
