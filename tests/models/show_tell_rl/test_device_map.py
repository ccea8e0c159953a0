"""ShowTellRL across devices: `_no_split_modules` names the blocks that stay whole, and a model whose decoder sits
on another device than its image encoder computes (the second device is emulated by `meta`, where every mix of
devices raises as between two GPUs)."""

import pytest
import torch
from accelerate import infer_auto_device_map
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from accelerate.utils import compute_module_sizes
from transformers import ViTConfig

from rlcaption.models.show_tell_rl import ShowTellRL, ShowTellRLConfig

# the children up to here encode the image; the rest (word embeddings, attention, LSTM, output layer) decode
IMAGE_SIDE = (
    "image_encoder",
    "image_projection",
    "image_norm",
    "grid_projection",
    "grid_norm",
    "grid_position_embeddings",
)


def tiny_model(**overrides) -> ShowTellRL:
    fields = dict(
        vocab_size=50, hidden_size=32, word_embedding_size=16, image_size=16, cnn_channels=[4, 8], dropout=0.0
    )
    torch.manual_seed(0)
    return ShowTellRL(ShowTellRLConfig(**{**fields, **overrides})).eval()


def test_no_split_modules_name_blocks_of_the_model_not_the_model():
    model = tiny_model(image_attention=True)
    classes = {type(module).__name__ for module in model.modules()}
    assert model._no_split_modules and set(model._no_split_modules) <= classes
    assert "ShowTellRL" not in model._no_split_modules


def test_a_transformers_backbone_keeps_its_own_blocks_whole():
    backbone = ViTConfig(
        image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
    )
    model = tiny_model(encoder_type="backbone", backbone_config=backbone.to_dict())
    assert "ViTLayer" in model._no_split_modules  # the backbone's layers, not the backbone as one block


def test_auto_device_map_spreads_the_model_and_keeps_the_cnn_whole():
    model = tiny_model(image_attention=True, hidden_size=64)
    model_bytes = compute_module_sizes(model)[""]
    device_map = infer_auto_device_map(
        model,
        max_memory={0: model_bytes - 1, 1: 2 * model_bytes},
        no_split_module_classes=list(model._no_split_modules),
    )
    assert set(device_map.values()) == {0, 1}
    assert device_map["image_encoder"] == 0  # whole, not block by block


def test_auto_device_map_never_splits_the_cnn_encoder():
    model = tiny_model(cnn_channels=[64, 128], hidden_size=8, word_embedding_size=8)
    encoder_bytes = compute_module_sizes(model)["image_encoder"]
    # the first device has room for the encoder's first blocks, not for all of it
    device_map = infer_auto_device_map(
        model,
        max_memory={0: encoder_bytes, 1: 4 * encoder_bytes},
        no_split_module_classes=list(model._no_split_modules),
    )
    assert not [name for name in device_map if name.startswith("image_encoder.")], device_map


def put_decoder_on_meta(model: ShowTellRL) -> None:
    """What `device_map` dispatch does with the decoder on a second device: weights there, inputs moved there."""
    for name, child in model.named_children():
        if name not in IMAGE_SIDE:
            child.to("meta")
            add_hook_to_module(child, AlignDevicesHook(execution_device="meta"))


@pytest.mark.parametrize("image_attention", [False, True], ids=["show-tell", "attention"])
def test_forward_with_the_decoder_on_another_device_than_the_image_encoder(image_attention):
    model = tiny_model(image_attention=image_attention)
    put_decoder_on_meta(model)
    pixel_values = torch.randn(2, 3, 16, 16)
    right_padded = torch.tensor([[1, 5, 6, 2, 0], [1, 7, 2, 0, 0]])
    # left padding takes the step-by-step path; right padding with a cache packs the sequences, and unpacking
    # copies out of the device, which `meta` cannot do
    left_padded = torch.tensor([[0, 1, 5, 6, 2], [0, 0, 1, 7, 2]])
    for ids, use_cache in ((right_padded, False), (left_padded, True)):
        output = model(
            ids, pixel_values=pixel_values, attention_mask=(ids != 0).long(), labels=ids, use_cache=use_cache
        )
        assert output.logits.shape == (2, 5, 50) and output.loss is not None
    state = model.initial_state(pixel_values).select(torch.tensor([1, 0]))
    state.reorder_cache(torch.tensor([0, 0]))
    logits, _, _ = model.step(torch.tensor([5, 6]), state)
    assert logits.shape == (2, 50)
