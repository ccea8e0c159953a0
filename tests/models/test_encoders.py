import json

import pytest
import torch
from transformers import ResNetConfig, ViTConfig

from rlcaption.data import features as feature_extraction
from rlcaption.models.policy_value import PolicyValueConfig
from rlcaption.models.shapes_clip import ShapesCLIPConfig, configuration_shapes_clip
from rlcaption.models.show_tell_rl import ShowTellRLConfig, encoders
from rlcaption.models.show_tell_rl.encoders import (
    BackboneImageEncoder,
    ConvImageEncoder,
    PrecomputedFeatureEncoder,
    build_image_encoder,
    pool_image_features,
)
from rlcaption.models.speaker_listener import SpeakerListenerConfig
from rlcaption.models.visual_semantic_embedding import VisualSemanticEmbeddingConfig


def test_cnn_output_size_keeps_the_spatial_layout():
    encoder = ConvImageEncoder(image_size=32, num_channels=3, channels=[4, 6, 8])
    features = encoder(torch.randn(2, 3, 32, 32))
    assert features.shape == (2, encoder.output_size) == (2, 8 * 4 * 4)


def test_cnn_features_depend_on_where_things_are():
    torch.manual_seed(0)
    encoder = ConvImageEncoder(image_size=16, num_channels=3, channels=[4, 4])
    left, right = torch.zeros(1, 3, 16, 16), torch.zeros(1, 3, 16, 16)
    left[..., 4:8, 0:4] = 1.0
    right[..., 4:8, 12:16] = 1.0
    # a globally pooled encoder would give (nearly) the same vector for a shape moved left or right
    assert not torch.allclose(encoder(left), encoder(right))


def test_cnn_rejects_the_wrong_image_size():
    encoder = ConvImageEncoder(image_size=16, num_channels=3, channels=[4])
    with pytest.raises(ValueError, match="16x16"):
        encoder(torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize(
    "backbone_config, expected_size",
    [
        (
            ViTConfig(
                image_size=16,
                patch_size=8,
                hidden_size=24,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
            ),
            24,
        ),  # fmt: skip
        (ResNetConfig(embedding_size=8, hidden_sizes=[8, 12], depths=[1, 1], num_channels=3), 12),
    ],
)
def test_backbone_pooled_output(backbone_config, expected_size):
    encoder = BackboneImageEncoder(backbone_config.to_dict(), freeze=False)
    assert encoder.output_size == expected_size
    assert encoder(torch.randn(2, 3, 16, 16)).shape == (2, expected_size)


def test_frozen_backbone_has_no_trainable_parameters_and_stays_in_eval_mode():
    config = ResNetConfig(embedding_size=8, hidden_sizes=[8], depths=[1], num_channels=3)
    encoder = BackboneImageEncoder(config.to_dict(), freeze=True).train()
    assert not any(p.requires_grad for p in encoder.parameters())
    assert not encoder.backbone.training


def test_build_image_encoder_follows_the_config():
    features = build_image_encoder(ShowTellRLConfig(encoder_type="features", image_feature_size=7))
    assert isinstance(features, PrecomputedFeatureEncoder) and features.output_size == 7
    cnn = build_image_encoder(ShowTellRLConfig(image_size=32, cnn_channels=[4, 4]))
    assert isinstance(cnn, ConvImageEncoder) and cnn.output_size == 4 * 8 * 8
    assert features.layout == "pooled"
    grid_config = ShowTellRLConfig(encoder_type="features", image_feature_size=7, image_feature_layout="grid")
    assert build_image_encoder(grid_config).layout == "grid"


def test_precomputed_regions_pool_to_their_masked_mean_and_zero_their_padding():
    encoder = PrecomputedFeatureEncoder(3, layout="grid")
    assert encoder.grid_feature_size == 3 and encoder.num_grid_positions is None  # regions have no fixed position
    features = torch.randn(2, 4, 3)
    features[0, 2:] = float("nan")  # padding may hold anything
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    pooled, grid = encoder.forward_with_grid(features, mask)
    torch.testing.assert_close(pooled[0], features[0, :2].mean(dim=0))
    torch.testing.assert_close(pooled[1], features[1].mean(dim=0))
    assert torch.equal(grid[0, 2:], torch.zeros(2, 3)) and torch.equal(grid[:, :2], features[:, :2])
    torch.testing.assert_close(encoder(features, mask), pooled)
    # a fixed grid needs no mask
    torch.testing.assert_close(encoder(features[1:]), features[1:].mean(dim=1))


def test_precomputed_features_are_checked_against_their_layout_and_mask():
    grid, pooled = PrecomputedFeatureEncoder(3, layout="grid"), PrecomputedFeatureEncoder(3)
    with pytest.raises(ValueError, match=r"\(batch_size, num_regions, 3\).*image_feature_layout='pooled'"):
        grid(torch.randn(2, 3))
    with pytest.raises(ValueError, match=r"\(batch_size, 3\).*image_feature_layout='grid'"):
        pooled(torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match="image_feature_layout='grid'"):
        pooled.forward_with_grid(torch.randn(2, 3))
    with pytest.raises(ValueError, match="does not match"):
        grid(torch.randn(2, 4, 3), torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"no region at all in batch rows \[0, 2\]"):
        grid(torch.randn(3, 4, 3), torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="Unknown image feature layout 'regions'"):
        PrecomputedFeatureEncoder(3, layout="regions")


def test_pooling_rules():
    class Output:
        def __init__(self, pooler_output=None, last_hidden_state=None):
            self.pooler_output = pooler_output
            self.last_hidden_state = last_hidden_state

    tokens = torch.arange(24.0).reshape(2, 3, 4)
    assert torch.equal(pool_image_features(Output(last_hidden_state=tokens)), tokens.mean(dim=1))
    feature_map = torch.arange(32.0).reshape(2, 4, 2, 2)
    assert torch.equal(pool_image_features(Output(last_hidden_state=feature_map)), feature_map.mean(dim=(2, 3)))
    pooled = torch.ones(2, 5, 1, 1)
    assert pool_image_features(Output(pooler_output=pooled, last_hidden_state=tokens)).shape == (2, 5)
    assert pool_image_features(torch.ones(2, 7)).shape == (2, 7)
    with pytest.raises(ValueError, match="neither `pooler_output` nor `last_hidden_state`"):
        pool_image_features(Output())


def test_pooling_none_keeps_every_position():
    class Output:
        def __init__(self, pooler_output=None, last_hidden_state=None):
            self.pooler_output = pooler_output
            self.last_hidden_state = last_hidden_state

    tokens = torch.arange(24.0).reshape(2, 3, 4)
    assert torch.equal(pool_image_features(Output(torch.ones(2, 4), tokens), pooling="none"), tokens)
    feature_map = torch.arange(48.0).reshape(2, 4, 2, 3)  # (B, C, H, W)
    grid = pool_image_features(Output(torch.ones(2, 4, 1, 1), feature_map), pooling="none")
    assert grid.shape == (2, 6, 4)  # (B, H * W, C), row by row
    assert torch.equal(grid[1, 4], feature_map[1, :, 1, 1])
    with pytest.raises(ValueError, match=r"shape \(2, 7\).*a grid needs the backbone's hidden states"):
        pool_image_features(torch.ones(2, 7), pooling="none")
    with pytest.raises(ValueError, match=r"Unknown pooling 'max'; expected one of \('auto', 'none'\)"):
        pool_image_features(Output(last_hidden_state=tokens), pooling="max")


def test_backbone_encoder_and_feature_extraction_pool_in_one_place(monkeypatch):
    # extraction and a captioner of features computing them from pixels encode with the one function that pools
    assert feature_extraction.encode_images_with_backbone is encoders.encode_images_with_backbone
    poolings = []

    def recording_pool(outputs, pooling="auto"):
        poolings.append(pooling)
        return pool_image_features(outputs, pooling=pooling)

    monkeypatch.setattr(encoders, "pool_image_features", recording_pool)
    config = ResNetConfig(embedding_size=8, hidden_sizes=[8], depths=[1], num_channels=3)
    pooled, grid = BackboneImageEncoder(config.to_dict(), freeze=True).forward_with_grid(torch.randn(1, 3, 16, 16))
    assert poolings == ["auto", "none"]  # the pooled vector and the grid attention reads
    assert pooled.shape == (1, 8) and grid.shape == (1, 4 * 4, 8)


def test_encoder_types_are_named_in_one_place():
    assert configuration_shapes_clip.IMAGE_ENCODER_TYPES is encoders.IMAGE_ENCODER_TYPES
    assert set(encoders.IMAGE_ENCODER_TYPES) < set(encoders.ENCODER_TYPES)
    # the captioner and the embedding check their encoder fields with the one method of encoders.py
    for config_class in (ShowTellRLConfig, VisualSemanticEmbeddingConfig):
        with pytest.raises(ValueError, match=r"expected one of \('cnn', 'backbone', 'features'\)"):
            config_class(encoder_type="transformer")
        with pytest.raises(ValueError, match="image_feature_layout='ragged' is not supported"):
            config_class(encoder_type="features", image_feature_size=8, image_feature_layout="ragged")
    with pytest.raises(ValueError, match=r"expected one of \('cnn', 'backbone'\)"):
        ShapesCLIPConfig(encoder_type="features")
    # the networks that mirror a captioner's image input with a CNN of their own check it with the same function
    with pytest.raises(ValueError, match="listener_cnn_channels must be a non-empty list"):
        SpeakerListenerConfig(listener_cnn_channels=[])
    with pytest.raises(ValueError, match="divisible by 128 .* change image_size or value_cnn_channels"):
        PolicyValueConfig(value_cnn_channels=[4] * 7)


def test_image_encoder_fields_are_declared_once_and_saved_at_the_top_level(tmp_path):
    # the captioner and the embedding have every field of the mixin; the shapes CLIP those of an image tower trained
    # from scratch on pixels, with defaults of its own
    for config_class in (ShowTellRLConfig, VisualSemanticEmbeddingConfig, ShapesCLIPConfig):
        assert issubclass(config_class, encoders.ImageEncoderConfigMixin)
    assert ShowTellRLConfig.image_encoder_defaults is encoders.IMAGE_ENCODER_DEFAULTS
    assert VisualSemanticEmbeddingConfig.image_encoder_defaults is encoders.IMAGE_ENCODER_DEFAULTS
    assert set(ShapesCLIPConfig.image_encoder_defaults) < set(encoders.IMAGE_ENCODER_DEFAULTS)
    clip = ShapesCLIPConfig()
    assert (clip.image_size, clip.cnn_channels) == (48, [16, 32, 64, 64]) and not hasattr(clip, "freeze_backbone")
    configs = [
        ShowTellRLConfig(encoder_type="features", image_feature_size=8, image_feature_layout="grid"),
        VisualSemanticEmbeddingConfig(image_size=32, cnn_channels=(4, 8), freeze_image_encoder=True),
        clip,
    ]
    for config in configs:
        config.save_pretrained(tmp_path / config.model_type)
        saved = json.loads((tmp_path / config.model_type / "config.json").read_text())
        fields = {name: getattr(config, name) for name in config.image_encoder_defaults}
        # flat keys, as the published checkpoints have them
        assert {name: saved[name] for name in fields} == fields
        reloaded = type(config).from_pretrained(tmp_path / config.model_type)
        assert {name: getattr(reloaded, name) for name in fields} == fields
