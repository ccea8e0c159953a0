"""
The tiny image-text-to-text captioners of `tiny_vlms` do what the captioning code relies on: their own processor turns
an image and the family's caption prompt into inputs, their own `generate()` continues the prompt greedily as a
step-by-step argmax of their forward pass would, a teacher-forced loss is the cross-entropy of the caption tokens and
back-propagates into the vision tower and the language model, and a left-padded batch captions as each image alone.
"""

import pytest
import torch
import torch.nn.functional as F

from rlcaption.shapes import SceneObject, render_scene
from tiny_vlms import TINY_VLM_FAMILIES, make_tiny_vlm

ENCODER_DECODER_FAMILIES = ("florence2",)
DECODER_ONLY_FAMILIES = tuple(family for family in TINY_VLM_FAMILIES if family not in ENCODER_DECODER_FAMILIES)
CAPTION = "a small red circle left of a large blue square"
# The modules holding each family's image encoder and language model.
VISION_TOWERS = {
    "florence2": "model.vision_tower",
    "blip2": "vision_model",
    "paligemma": "model.vision_tower",
    "smolvlm": "model.vision_model",
    "qwen2_vl": "model.visual",
}
LANGUAGE_MODELS = {
    "florence2": "model.language_model",
    "blip2": "language_model",
    "paligemma": "model.language_model",
    "smolvlm": "model.text_model",
    "qwen2_vl": "model.language_model",
}


def shapes_images() -> list:
    """Two 48-pixel shapes scenes, the benchmark's image size, larger than the captioners' 32 pixels."""
    return [
        render_scene((SceneObject("circle", "red", "small", 0, 0), SceneObject("square", "blue", "large", 0, 2)), 48),
        render_scene((SceneObject("star", "green", "large", 1, 1),), 48),
    ]


def caption_prompt(family: str, processor, request: str = "Describe the image.") -> str:
    """The family's caption prompt, as its model cards write it; `request` is the user's words in a chat turn."""
    if family == "florence2":
        return "<CAPTION>"
    if family == "paligemma":
        return "<image>caption en"
    if family == "blip2":
        return ""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": request}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True)


def caption_inputs(family: str, processor, images: list, prompts: list[str] | None = None):
    prompts = prompts or [caption_prompt(family, processor)] * len(images)
    if family == "smolvlm":  # Idefics3's processor takes a list of images per prompt
        images = [[image] for image in images]
    return processor(images=images, text=prompts, padding=True, return_tensors="pt")


def end_of_caption(family: str, processor) -> str:
    """The text that ends a caption in the family's training data: the eos, or the chat turn's end."""
    if family == "smolvlm":
        return "<end_of_utterance>"
    if family == "qwen2_vl":
        return "<|im_end|>"
    if family == "blip2":  # BLIP-2 OPT's captions end with a newline
        return "\n"
    return processor.tokenizer.eos_token


def teacher_forced_inputs(family: str, processor, image, caption: str):
    """Inputs and labels for a teacher-forced pass on `caption`, with -100 over the prompt and image tokens."""
    if family == "florence2":
        inputs = caption_inputs(family, processor, [image])
        inputs["labels"] = processor.tokenizer([caption], return_tensors="pt").input_ids
        return inputs
    prompt = caption_prompt(family, processor)
    if family == "paligemma":
        return processor(images=[image], text=[prompt], suffix=[caption], return_tensors="pt")
    inputs = caption_inputs(family, processor, [image], [prompt + caption + end_of_caption(family, processor)])
    prompt_ids = caption_inputs(family, processor, [image]).input_ids
    prompt_length = prompt_ids.shape[1]
    assert torch.equal(inputs.input_ids[:, :prompt_length], prompt_ids)  # the caption leaves the prompt's tokens as is
    labels = inputs.input_ids.clone()
    labels[:, :prompt_length] = -100
    inputs["labels"] = labels
    return inputs


def greedy_by_forward(family: str, model, inputs, max_new_tokens: int) -> torch.Tensor:
    """Greedy decoding as a loop of full forward passes, no cache: the reference for `generate()`."""
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    inputs = dict(inputs)
    inputs.pop("labels", None)  # PaliGemma's processor returns them, all -100 without a `suffix`
    if family in ENCODER_DECODER_FAMILIES:
        tokens = torch.tensor([[model.generation_config.decoder_start_token_id]])
        for _ in range(max_new_tokens):
            logits = model(**inputs, decoder_input_ids=tokens).logits
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            if tokens[0, -1].item() in eos:
                break
        return tokens
    tokens = inputs.pop("input_ids")
    for _ in range(max_new_tokens):
        inputs["attention_mask"] = torch.ones_like(tokens)
        # Token types grow with the text: PaliGemma's caption is its suffix (1), Qwen2-VL's new tokens are text (0).
        for key, new_token_type in (("token_type_ids", 1), ("mm_token_type_ids", 0)):
            if key in inputs:
                missing = tokens.shape[1] - inputs[key].shape[1]
                inputs[key] = F.pad(inputs[key], (0, missing), value=new_token_type)
        logits = model(**inputs, input_ids=tokens).logits
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        if tokens[0, -1].item() in eos:
            break
    return tokens


@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_tiny_vlm_is_tiny_and_seeded(family):
    model, _ = make_tiny_vlm(family, seed=0)
    same, _ = make_tiny_vlm(family, seed=0)
    other, _ = make_tiny_vlm(family, seed=1)
    assert sum(parameter.numel() for parameter in model.parameters()) < 100_000
    weights = list(model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(weights, same.parameters(), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(weights, other.parameters(), strict=True))


@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_processor_places_one_image_token_per_image_feature(family):
    model, processor = make_tiny_vlm(family)
    inputs = caption_inputs(family, processor, shapes_images()[:1])
    image_token_id = model.config.image_token_id
    text_inputs = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids", "labels")
    image_inputs = {key: value for key, value in inputs.items() if key not in text_inputs}
    with torch.no_grad():
        features = model.get_image_features(**image_inputs).pooler_output
    features = torch.cat(list(features)) if isinstance(features, (list, tuple)) else features.flatten(0, -2)
    assert (inputs.input_ids == image_token_id).sum().item() == features.shape[0]


@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_generate_is_greedy_forward(family):
    model, processor = make_tiny_vlm(family)
    model.eval()
    inputs = caption_inputs(family, processor, shapes_images()[:1])
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=8, do_sample=False)
        expected = greedy_by_forward(family, model, inputs, max_new_tokens=8)
    torch.testing.assert_close(generated, expected, rtol=0, atol=0)
    if family in DECODER_ONLY_FAMILIES:  # prompt, then the new tokens
        assert torch.equal(generated[:, : inputs.input_ids.shape[1]], inputs.input_ids)
    else:  # the decoder start, then the new tokens
        assert generated[0, 0].item() == model.generation_config.decoder_start_token_id
    assert generated.shape[1] > (inputs.input_ids.shape[1] if family in DECODER_ONLY_FAMILIES else 1)


@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_greedy_captions_depend_on_the_image(family):
    model, processor = make_tiny_vlm(family)
    model.eval()
    inputs = caption_inputs(family, processor, shapes_images())
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    start = inputs.input_ids.shape[1] if family in DECODER_ONLY_FAMILIES else 1
    assert generated[0, start:].tolist() != generated[1, start:].tolist()


@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_generate_stops_at_the_end_of_a_caption(family):
    model, processor = make_tiny_vlm(family)
    model.eval()
    inputs = caption_inputs(family, processor, shapes_images()[:1])
    (end,) = processor.tokenizer(end_of_caption(family, processor), add_special_tokens=False).input_ids
    eos = model.generation_config.eos_token_id
    assert end in (eos if isinstance(eos, list) else [eos])
    with torch.no_grad():  # a bias that makes the end of a caption the first token
        generated = model.generate(**inputs, max_new_tokens=8, do_sample=False, sequence_bias={(end,): 1e4})
    start = inputs.input_ids.shape[1] if family in DECODER_ONLY_FAMILIES else 1
    assert generated[0, start:].tolist() == [end]


@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_teacher_forced_loss_is_caption_cross_entropy_and_reaches_both_towers(family):
    model, processor = make_tiny_vlm(family)
    inputs = teacher_forced_inputs(family, processor, shapes_images()[0], CAPTION)
    labels = inputs["labels"]
    outputs = model(**inputs)
    logits = outputs.logits
    if family in DECODER_ONLY_FAMILIES:  # the logits at position t predict token t + 1
        logits, labels = logits[:, :-1], labels[:, 1:]
    expected = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert (labels != -100).sum().item() >= len(CAPTION.split())
    assert torch.isfinite(outputs.loss)
    torch.testing.assert_close(outputs.loss, expected)
    outputs.loss.backward()
    for tower in (VISION_TOWERS[family], LANGUAGE_MODELS[family]):
        gradients = [parameter.grad for parameter in model.get_submodule(tower).parameters()]
        assert gradients[0] is not None and gradients[0].abs().sum() > 0, tower


@pytest.mark.parametrize("family", DECODER_ONLY_FAMILIES)
def test_left_padded_batch_captions_as_each_image_alone(family):
    model, processor = make_tiny_vlm(family)
    model.eval()
    images = shapes_images()
    # Prompts of different lengths, so that the first row is padded.
    prompts = [
        caption_prompt(family, processor, "Describe."),
        caption_prompt(family, processor, "Describe the image in a few words."),
    ]
    if family == "paligemma":
        prompts = ["<image>caption en", "<image>caption en in a few words"]
    elif family == "blip2":
        prompts = ["a", "a picture of"]
    if family == "qwen2_vl":  # dynamic resolution: a wide image has fewer patches than a square one
        images[1] = images[1].crop((0, 12, 48, 36))
    processor.tokenizer.padding_side = "left"
    batch = caption_inputs(family, processor, images, prompts)
    # Padded on the left of the text: BLIP-2's processor writes its image tokens before the padding.
    assert not batch.attention_mask[0].all() and batch.attention_mask[:, -1].all()
    if family == "qwen2_vl":
        assert batch.image_grid_thw[0].tolist() != batch.image_grid_thw[1].tolist()
    with torch.no_grad():
        generated = model.generate(**batch, max_new_tokens=6, do_sample=False)
        for row, (image, prompt) in enumerate(zip(images, prompts, strict=True)):
            alone = caption_inputs(family, processor, [image], [prompt])
            expected = model.generate(**alone, max_new_tokens=6, do_sample=False)
            new_tokens = generated[row, batch.input_ids.shape[1] :]
            assert new_tokens[: expected.shape[1] - alone.input_ids.shape[1]].tolist() == (
                expected[0, alone.input_ids.shape[1] :].tolist()
            ), row


def test_unknown_family_names_the_known_ones():
    with pytest.raises(ValueError, match="florence2"):
        make_tiny_vlm("llava")
