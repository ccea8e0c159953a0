"""The decoding loop of rlcaption's recurrent captioners against transformers' `generate()`, its reference: the same
sequences for the same seed, token for token and of the same length, for every model and decoding setting RL uses."""

import functools
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig

from rlcaption import CaptionProcessor, PolicyValueCaptioner, ShowTellRL, SpeakerListener
from rlcaption.data import load_shapes
from rlcaption.generation import recurrent_decoding, step_decoding
from rlcaption.generation.captioners import captioner_for
from rlcaption.generation.decoding import evaluation_mode, generate_caption_sets, generate_captions
from rlcaption.generation.recurrent_decoding import decode_recurrent
from rlcaption.generation.step_decoding import decodes_plainly, draw_tokens
from tiny_captioners import DECODING_SETTINGS, regions_show_tell

REPOSITORY = Path(__file__).resolve().parents[2]
WARM_START = REPOSITORY / "checkpoints" / "show-tell-rl-shapes-xe"
SETTINGS = DECODING_SETTINGS


@pytest.fixture(scope="module")
def warm_start_inputs(tmp_path_factory):
    processor = CaptionProcessor.from_pretrained(WARM_START)
    images = load_shapes(
        num_train=4, num_validation=4, num_test=12, image_size=48, cache_dir=tmp_path_factory.mktemp("shapes")
    )["test"]["image"]
    return processor(images=images, return_tensors="pt")


def generate_both_ways(model, image_inputs, config, seed=0):
    """(the loop's sequences, generate()'s sequences), each drawn from the same seed, through the model's Captioner."""
    results = []
    for decoding_loop in (True, False):
        torch.manual_seed(seed)
        with evaluation_mode(model):
            results.append(captioner_for(model).generate(image_inputs, config, decoding_loop=decoding_loop))
    return results


@pytest.mark.parametrize("setting", SETTINGS, ids=list(SETTINGS))
def test_the_published_warm_start_decodes_as_generate_does(setting, warm_start_inputs):
    model = ShowTellRL.from_pretrained(WARM_START)
    fast, reference = generate_both_ways(model, {"pixel_values": warm_start_inputs["pixel_values"]}, SETTINGS[setting])
    assert fast.shape == reference.shape
    assert torch.equal(fast, reference)
    ended = (reference == model.config.eos_token_id).any(dim=1)
    if setting != "short budget":  # a trained captioner ends its captions: the returned length is the longest one's
        assert ended.all() and reference.shape[1] <= 21
        assert (reference[:, -1] == model.config.eos_token_id).any()
    else:
        assert reference.shape[1] == 4


@pytest.mark.parametrize("image_attention", [False, True], ids=["mean", "attention"])
@pytest.mark.parametrize("wrapper", ["show_tell", "policy_value", "speaker_listener"])
@pytest.mark.parametrize("setting", ["greedy", "temperature, top-k, top-p"])
def test_every_recurrent_captioner_decodes_regions_as_generate_does(wrapper, image_attention, setting):
    show_tell = regions_show_tell(image_attention)
    model = {
        "show_tell": lambda: show_tell,
        "policy_value": lambda: PolicyValueCaptioner.from_policy(
            show_tell, value_word_embedding_size=4, value_hidden_size=4, value_mlp_hidden_size=4
        ),
        "speaker_listener": lambda: SpeakerListener.from_speaker(
            show_tell, listener_hidden_size=4, joint_embedding_size=4
        ),
    }[wrapper]()
    features = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(1))
    image_inputs = {
        "image_features": features,
        "image_feature_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]),
    }
    fast, reference = generate_both_ways(model, image_inputs, SETTINGS[setting])
    assert torch.equal(fast, reference)


def test_only_plain_decoding_takes_the_loop():
    assert all(decodes_plainly(config) for config in SETTINGS.values())
    assert not decodes_plainly(GenerationConfig(do_sample=False, num_beams=3, max_new_tokens=20))
    assert not decodes_plainly(GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=20, repetition_penalty=2))
    assert not decodes_plainly(GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=20, min_new_tokens=3))
    assert not decodes_plainly(GenerationConfig(do_sample=False, num_beams=1, max_length=20))
    # generate() fills unset sampling settings from its own defaults (top_k=50): not the loop's to guess
    assert not decodes_plainly(GenerationConfig(do_sample=True, num_beams=1, max_new_tokens=20))
    with pytest.raises(ValueError, match="greedily or samples"):
        decode_recurrent(regions_show_tell(False), {}, GenerationConfig(num_beams=2, max_new_tokens=3))


def test_beam_search_still_goes_through_generate(warm_start_inputs):
    model = ShowTellRL.from_pretrained(WARM_START).eval()
    captioner = captioner_for(model)
    config = GenerationConfig(do_sample=False, num_beams=3, max_new_tokens=20)
    pixels = warm_start_inputs["pixel_values"][:4]
    expected = model.generate(pixel_values=pixels, generation_config=captioner.complete_generation_config(config))
    assert torch.equal(captioner.generate({"pixel_values": pixels}, config), expected)


def test_tokens_are_drawn_as_torch_multinomial_draws_them():
    probs = torch.softmax(3 * torch.randn(64, 37, generator=torch.Generator().manual_seed(0)), dim=-1)
    probs[:, 5] = 0.0  # a token that can never be drawn
    for seed in range(20):
        torch.manual_seed(seed)
        expected = torch.multinomial(probs, num_samples=1).squeeze(1)
        torch.manual_seed(seed)
        drawn = draw_tokens(probs)
        assert torch.equal(drawn, expected)
        assert not (drawn == 5).any()


@pytest.mark.parametrize("model_kind", ["warm start", "regions", "regions with attention"])
@pytest.mark.parametrize("setting", list(SETTINGS), ids=list(SETTINGS))
def test_decoding_every_step_as_a_cuda_graph_does_gives_the_same_captions(model_kind, setting, warm_start_inputs):
    """A CUDA graph cannot stop when every caption has ended: it decodes all `max_new_tokens` steps. What it captures
    is checked here on the CPU against the decoding that stops early (on a GPU, tests/trainer/test_cuda.py)."""
    if model_kind == "warm start":  # its captions end well before the budget, so the decoding stops early
        model, image_inputs = (
            ShowTellRL.from_pretrained(WARM_START),
            {"pixel_values": warm_start_inputs["pixel_values"]},
        )
    else:
        model = regions_show_tell(image_attention=model_kind == "regions with attention")
        image_inputs = {
            "image_features": torch.randn(6, 4, 6, generator=torch.Generator().manual_seed(1)),
            "image_feature_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]] * 2),
        }
    model.eval()
    config = captioner_for(model).complete_generation_config(SETTINGS[setting])
    torch.manual_seed(0)
    expected = decode_recurrent(model, image_inputs, config)
    torch.manual_seed(0)
    state = model.initial_state(**image_inputs).repeat_interleave(config.num_return_sequences or 1)
    every_step = torch.empty(state.hidden.shape[1], config.max_new_tokens + 1, dtype=torch.long)
    step = functools.partial(recurrent_decoding._step_logits, model)
    with torch.no_grad():
        step_decoding._decode_steps(step, state, every_step, config, stops_early=False)
    assert torch.equal(step_decoding._trim_after_last_end(every_step, config.eos_token_id), expected)
    assert step_decoding.graph_key(model, step_decoding._state_tensors(state), ()) is None  # on the CPU: never a graph


@pytest.mark.parametrize("wrapper", ["show_tell", "policy_value"])
def test_samples_and_greedy_captions_of_the_same_images_share_their_encoding(wrapper, warm_start_inputs, monkeypatch):
    show_tell = ShowTellRL.from_pretrained(WARM_START)
    model = show_tell if wrapper == "show_tell" else PolicyValueCaptioner.from_policy(show_tell, value_hidden_size=4)
    processor = CaptionProcessor.from_pretrained(WARM_START)
    image_inputs = {"pixel_values": warm_start_inputs["pixel_values"]}
    configs = [SETTINGS["pure sampling"], SETTINGS["greedy"]]
    torch.manual_seed(0)
    expected = [generate_captions(model, processor, image_inputs, config) for config in configs]
    encodings = []
    encode = ShowTellRL.initial_state
    monkeypatch.setattr(
        ShowTellRL, "initial_state", lambda *args, **kwargs: encodings.append(1) or encode(*args, **kwargs)
    )
    torch.manual_seed(0)
    together = generate_caption_sets(model, processor, image_inputs, configs)
    assert len(encodings) == 1
    for caption_set, reference in zip(together, expected, strict=True):
        assert torch.equal(caption_set.sequences, reference.sequences) and caption_set.texts == reference.texts
