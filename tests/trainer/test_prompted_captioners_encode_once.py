"""
The prompted captioners run their vision tower once per image for the k captions of that image (references in XE,
samples in the scoring pass of SCST and SLE), and give the logits and gradients of running it once per caption: each
family's encode-once path is compared with its per-caption path (the image inputs repeated with `_rows`) on tiny
models with their real processor classes.
"""

import pytest
import torch
from test_prompted_captioners import build, collate

from rlcaption.generation import captioner_for, image_inputs_of
from tiny_vlms import TINY_VLM_FAMILIES

# float32 forward passes of the same tokens, batched differently
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
# the module each family's `get_image_features` runs its images through
VISION_TOWERS = {
    "florence2": "model.vision_tower",
    "blip2": "vision_model",
    "paligemma": "model.vision_tower",
    "smolvlm": "model.vision_model",
    "qwen2_vl": "model.visual",
}


@pytest.fixture(scope="module")
def rows(tiny_shapes):
    return [tiny_shapes["train"][index] for index in range(3)]


def vision_tower(model, family):
    return model.get_submodule(VISION_TOWERS[family])


def logits_both_ways(model, processor, rows, captions_per_image):
    """The caption logits of the encode-once path and of the per-caption path, on the same batch."""
    batch = collate(model, processor, rows, captions_per_image=captions_per_image)
    conditioning = image_inputs_of(batch)
    captions, mask, image_index = (
        batch["caption_input_ids"],
        batch["caption_attention_mask"],
        batch["caption_image_index"],
    )
    assert image_index.numel() == captions_per_image * len(rows)
    captioner = captioner_for(model)
    assert captioner.encodes_images_once
    # the per-caption path: each caption's image inputs selected with `_rows`, the image encoded for every caption
    image_rows = captioner._rows(captioner._image_inputs(conditioning), image_index)
    return (
        captioner.caption_logits(model, conditioning, captions, mask, image_index),
        captioner._logits(model, image_rows, captions, mask)[:, :-1],
        mask[:, 1:].bool().unsqueeze(-1),  # (N, T-1, 1): the positions that score a caption token
    )


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("captions_per_image", [2, 3])
@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_encoding_images_once_gives_the_per_caption_logits(family, captions_per_image, training, rows):
    model, processor = build(family)
    model.train(training)  # the tiny models have dropout 0: training mode is deterministic
    with torch.no_grad():
        once, per_caption, real = logits_both_ways(model, processor, rows, captions_per_image)
    assert once.shape == per_caption.shape
    torch.testing.assert_close(once * real, per_caption * real, **TOLERANCE)


def vision_gradients(model, family, logits, weights):
    model.zero_grad()
    (logits * weights).sum().backward()
    return {
        name: parameter.grad.clone()
        for name, parameter in vision_tower(model, family).named_parameters()
        if parameter.grad is not None  # the vision heads some families do not use
    }


@pytest.mark.parametrize("gradient_checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_vision_tower_gradients_equal_those_of_the_per_caption_path(family, gradient_checkpointing, rows):
    model, processor = build(family)
    model.train()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    once, per_caption, real = logits_both_ways(model, processor, rows, captions_per_image=2)
    weights = torch.randn(once.shape, generator=torch.Generator().manual_seed(0)) * real  # a loss on real positions
    once_gradients = vision_gradients(model, family, once, weights)
    per_caption_gradients = vision_gradients(model, family, per_caption, weights)
    assert any(gradient.abs().sum() > 0 for gradient in once_gradients.values()), (
        "no gradient reached the vision tower"
    )
    assert once_gradients.keys() == per_caption_gradients.keys()
    # float32 rounding relative to the tower's gradients (in the thousands with the tiny models' large-std weights;
    # a key bias's, zero in exact arithmetic, is rounding alone)
    scale = max(gradient.abs().max() for gradient in per_caption_gradients.values())
    for name, gradient in once_gradients.items():
        torch.testing.assert_close(gradient / scale, per_caption_gradients[name] / scale, **TOLERANCE)


@pytest.mark.parametrize("family", TINY_VLM_FAMILIES)
def test_the_vision_tower_runs_once_per_image(family, rows):
    model, processor = build(family)
    model.eval()
    calls = []
    hook = vision_tower(model, family).register_forward_hook(
        lambda module, args, kwargs, output: calls.append((args or tuple(kwargs.values()))[0].size(0)),
        with_kwargs=True,
    )
    captions_per_image = 3
    try:
        with torch.no_grad():
            once, per_caption, _ = logits_both_ways(model, processor, rows, captions_per_image)
    finally:
        hook.remove()
    # one call for each path: the encode-once path's over the images, the per-caption path's over k times as many
    (images_encoded_once, images_encoded_per_caption) = calls
    assert images_encoded_per_caption == captions_per_image * images_encoded_once


def test_several_images_per_prompt_are_refused_with_the_fix():
    model, _ = build("qwen2_vl")
    features_per_image = (torch.zeros(4, 8),) * 3  # three images' features for two prompts
    with pytest.raises(ValueError, match="3 entries for 2 prompts.*one image per prompt"):
        captioner_for(model)._features_per_caption(features_per_image, torch.tensor([0, 0, 1, 1]), num_prompts=2)
