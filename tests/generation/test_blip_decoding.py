"""BLIP's decoding loop against transformers, its reference: the text decoder's own forward pass gives the logits of
every step, and `generate()` the same sequences for the same seed, token for token and of the same length, for every
setting RL decodes with."""

import functools

import pytest
import torch
from transformers import GenerationConfig

from rlcaption.generation import captioners as captioners_module
from rlcaption.generation import step_decoding
from rlcaption.generation.blip_decoding import BlipDecodingState, blip_caption_logits, blip_step, decode_blip
from rlcaption.generation.captioners import captioner_for
from rlcaption.generation.decoding import generate_caption_sets, generate_captions
from tiny_captioners import BLIP_END as END
from tiny_captioners import BLIP_IMAGE_SIZE as IMAGE_SIZE
from tiny_captioners import BLIP_START as START
from tiny_captioners import BLIP_VOCABULARY as VOCABULARY
from tiny_captioners import DECODING_SETTINGS, make_blip, make_foreign_captioner


def pixels(num_images: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(num_images, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("captions_per_image", [1, 3])
def test_every_step_gives_the_text_decoders_own_logits(captions_per_image):
    model = make_blip()
    image_embeds = model.vision_model(pixel_values=pixels(4)).last_hidden_state
    captions = torch.randint(4, VOCABULARY, (4 * captions_per_image, 7), generator=torch.Generator().manual_seed(2))
    captions[:, 0] = START
    with torch.no_grad():
        expected = model.text_decoder(
            input_ids=captions, encoder_hidden_states=image_embeds.repeat_interleave(captions_per_image, dim=0)
        ).logits
        state = BlipDecodingState(image_embeds, captions_per_image)
        for position in range(captions.shape[1]):
            logits, state = blip_step(model, captions[:, position], state)
            torch.testing.assert_close(logits, expected[:, position], rtol=1e-5, atol=1e-5)
    assert state.position == captions.shape[1]


def decode_both_ways(model, pixel_values, setting, seed=0):
    """(the loop's sequences, generate()'s sequences), each drawn from the same seed, through BLIP's Captioner."""
    results = []
    for decoding_loop in (True, False):
        torch.manual_seed(seed)
        results.append(
            captioner_for(model).generate({"pixel_values": pixel_values}, setting, decoding_loop=decoding_loop)
        )
    return results


@pytest.mark.parametrize("setting", DECODING_SETTINGS, ids=list(DECODING_SETTINGS))
@pytest.mark.parametrize("seed", [0, 1])
def test_blip_decodes_as_its_generate_does(setting, seed):
    model = make_blip(seed)
    loop, reference = decode_both_ways(model, pixels(5, seed), DECODING_SETTINGS[setting], seed)
    assert loop.shape == reference.shape
    assert torch.equal(loop, reference)
    if setting != "short budget":
        ended = (reference == END).any(dim=1)
        assert ended.float().mean() > 0.8
        if DECODING_SETTINGS[setting].do_sample:  # captions of different lengths, which the test is about
            assert len(set((reference[ended] == END).int().argmax(dim=1).tolist())) > 1


def test_captions_that_never_end_fill_the_budget_as_generate_does():
    model = make_blip(favoured_end=-20.0)
    loop, reference = decode_both_ways(model, pixels(3), DECODING_SETTINGS["pure sampling"])
    assert loop.shape == reference.shape == (15, 21)
    assert torch.equal(loop, reference)


@pytest.mark.parametrize("setting", DECODING_SETTINGS, ids=list(DECODING_SETTINGS))
def test_decoding_every_step_as_a_cuda_graph_does_gives_the_same_captions(setting):
    """A CUDA graph decodes all `max_new_tokens` steps; checked here on the CPU against the decoding that stops early
    (on a GPU, tests/trainer/test_cuda.py)."""
    model = make_blip()
    config = captioner_for(model).complete_generation_config(DECODING_SETTINGS[setting])
    torch.manual_seed(0)
    expected = decode_blip(model, {"pixel_values": pixels(4)}, config)
    torch.manual_seed(0)
    image_embeds = model.vision_model(pixel_values=pixels(4)).last_hidden_state
    state = BlipDecodingState(image_embeds, config.num_return_sequences or 1)
    every_step = torch.empty(state.num_captions, config.max_new_tokens + 1, dtype=torch.long)
    with torch.no_grad():
        step_decoding._decode_steps(functools.partial(blip_step, model), state, every_step, config, stops_early=False)
    assert torch.equal(step_decoding._trim_after_last_end(every_step, config.eos_token_id), expected)
    assert step_decoding.graph_key(model, step_decoding._state_tensors(state), ()) is None  # on the CPU: never a graph


def test_samples_and_greedy_captions_share_the_image_encoding():
    model, processor = make_foreign_captioner("blip", ["a red circle", "two blue squares", "a green triangle"], 16)
    image_inputs = {"pixel_values": pixels(4)}
    sampling, greedy = DECODING_SETTINGS["pure sampling"], DECODING_SETTINGS["greedy"]
    torch.manual_seed(0)
    expected = [generate_captions(model, processor, image_inputs, config) for config in (sampling, greedy)]
    vision_calls = []
    model.vision_model.register_forward_hook(lambda *args: vision_calls.append(1))
    torch.manual_seed(0)
    both = generate_caption_sets(model, processor, image_inputs, [sampling, greedy])
    assert len(vision_calls) == 1
    for decoded, reference in zip(both, expected, strict=True):
        assert torch.equal(decoded.sequences, reference.sequences)


def test_settings_beyond_the_loop_still_go_through_generate(monkeypatch):
    model = make_blip()
    captioner = captioner_for(model)
    beams = GenerationConfig(do_sample=False, num_beams=3, max_new_tokens=8)
    expected = captioner.generate({"pixel_values": pixels(2)}, beams, decoding_loop=False)
    monkeypatch.setattr(captioner, "_decode_in_loop", None)  # would fail if called
    assert torch.equal(captioner.generate({"pixel_values": pixels(2)}, beams), expected)
    assert expected.shape[1] > 1


def test_a_blip_dispatched_over_several_devices_decodes_with_generate():
    model = make_blip()
    captioner = captioner_for(model)
    config = captioner.complete_generation_config(DECODING_SETTINGS["greedy"])
    assert captioner._decodes_in_loop(config)
    model.hf_device_map = {"vision_model": "cpu", "text_decoder": "cpu"}
    assert captioner._decodes_in_loop(config)
    model.hf_device_map = {"vision_model": 0, "text_decoder": 1}
    assert not captioner._decodes_in_loop(config)


@pytest.mark.parametrize("captions_per_image", [1, 3])
def test_captions_scored_with_each_images_keys_projected_once_give_the_text_decoders_logits_and_gradients(
    captions_per_image,
):
    model = make_blip()
    pixel_values = pixels(2)
    num_captions = 2 * captions_per_image
    input_ids = torch.randint(4, VOCABULARY, (num_captions, 6), generator=torch.Generator().manual_seed(3))
    input_ids[:, 0] = START
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, 4:] = 0  # right padding, scored nowhere but present
    attention_mask[-1, 3:] = 0
    scored = attention_mask[:, :, None].float()

    def logits_and_gradients(score):
        model.zero_grad()
        image_embeds = model.vision_model(pixel_values=pixel_values).last_hidden_state
        logits = score(image_embeds)
        (logits.log_softmax(dim=-1) * scored).sum().backward()
        return logits.detach(), {name: parameter.grad.clone() for name, parameter in model.named_parameters()
                                 if parameter.grad is not None}  # fmt: skip

    shared, shared_gradients = logits_and_gradients(
        lambda image_embeds: blip_caption_logits(model, image_embeds, input_ids, attention_mask)
    )
    expected, expected_gradients = logits_and_gradients(
        lambda image_embeds: (
            model.text_decoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                encoder_hidden_states=image_embeds.repeat_interleave(captions_per_image, dim=0),
            ).logits
        )  # fmt: skip
    )
    torch.testing.assert_close(shared, expected, rtol=1e-5, atol=1e-5)
    assert shared_gradients.keys() == expected_gradients.keys()
    assert any(name.startswith("vision_model") for name in shared_gradients)
    for name, gradient in expected_gradients.items():
        torch.testing.assert_close(shared_gradients[name], gradient, rtol=1e-4, atol=1e-6, msg=name)


def test_the_captioner_shares_the_image_keys_only_for_consecutive_captions_of_each_image(monkeypatch):
    model = make_blip()
    captioner = captioner_for(model)
    input_ids = torch.randint(4, VOCABULARY, (4, 5), generator=torch.Generator().manual_seed(4))
    input_ids[:, 0] = START
    grouped_calls = []
    monkeypatch.setattr(
        captioners_module, "blip_caption_logits",
        lambda *args: grouped_calls.append(1) or blip_caption_logits(*args),
    )  # fmt: skip
    image_inputs = {"pixel_values": pixels(2)}
    for image_index, shares in [([0, 0, 1, 1], True), ([0, 1, 0, 1], False), ([1, 1, 0, 0], False)]:
        grouped_calls.clear()
        index = torch.tensor(image_index)
        logits = captioner.caption_logits(model, image_inputs, input_ids, image_index=index)
        repeated = captioner.caption_logits(model, {"pixel_values": pixels(2)[index]}, input_ids)
        torch.testing.assert_close(logits, repeated, rtol=1e-5, atol=1e-5)
        assert bool(grouped_calls) == shares


@pytest.mark.parametrize("why", ["activation checkpointing", "FSDP2"])
def test_a_text_decoder_whose_layers_must_run_whole_is_scored_by_its_own_forward(why, monkeypatch):
    model = make_blip()
    if why == "activation checkpointing":
        model.activation_checkpointing_enable()
    else:  # its layers' parameters are gathered in their forward only
        monkeypatch.setattr(captioners_module, "_is_fully_sharded", lambda module: module is model)
    model.train()
    captioner = captioner_for(model)
    monkeypatch.setattr(captioners_module, "blip_caption_logits", None)  # would fail if called
    input_ids = torch.full((4, 3), START)
    logits = captioner.caption_logits(
        model, {"pixel_values": pixels(2)}, input_ids, image_index=torch.tensor([0, 0, 1, 1])
    )
    assert logits.shape == (4, 2, VOCABULARY)
