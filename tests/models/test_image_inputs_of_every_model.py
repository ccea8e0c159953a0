"""The value network, the listener and the visual-semantic embedding read the three kinds of image input of
`rlcaption.models.show_tell_rl.encoders`: pixels through the CNN, pixels through a transformers vision backbone, and
precomputed features (pooled vectors, or regions of varying count padded with a mask). Each kind: a forward, a
save/load round trip with equal outputs, and, for regions, outputs that padding does not change."""

import pytest
import torch
from transformers import ViTConfig, ViTModel

from rlcaption.models import (
    PolicyValueCaptioner,
    PolicyValueConfig,
    ShowTellRL,
    ShowTellRLConfig,
    SpeakerListener,
    SpeakerListenerConfig,
    VisualSemanticEmbedding,
    VisualSemanticEmbeddingConfig,
)
from rlcaption.models.show_tell_rl.encoders import BackboneImageEncoder, ConvImageEncoder, PrecomputedFeatureEncoder

BOS = 1
VOCAB_SIZE = 40
FEATURE_SIZE = 12
TINY_VIT = dict(
    model_type="vit", image_size=16, patch_size=8, hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
    intermediate_size=32,
)  # fmt: skip
# the encoder fields of each input kind, as a captioner's config (and the embedding's) names them
INPUT_KINDS = {
    "cnn": dict(encoder_type="cnn", image_size=16, cnn_channels=[4, 8]),
    "backbone": dict(encoder_type="backbone", backbone_config=TINY_VIT),
    "pooled_features": dict(encoder_type="features", image_feature_size=FEATURE_SIZE),
    "regions": dict(encoder_type="features", image_feature_size=FEATURE_SIZE, image_feature_layout="grid"),
}
ENCODER_CLASSES = {
    "cnn": ConvImageEncoder,
    "backbone": BackboneImageEncoder,
    "pooled_features": PrecomputedFeatureEncoder,
    "regions": PrecomputedFeatureEncoder,
}
# regions per image: padded to 4 in a batch, and the last image has one
REGION_COUNTS = (4, 2, 1)


def policy_config(kind: str) -> ShowTellRLConfig:
    return ShowTellRLConfig(
        vocab_size=VOCAB_SIZE, hidden_size=16, word_embedding_size=8, max_caption_length=6, **INPUT_KINDS[kind]
    )


def value_of(model: PolicyValueCaptioner, captions: torch.LongTensor, images: dict) -> torch.Tensor:
    return model.value(input_ids=captions, **images)  # (N, T)


def listener_of(model: SpeakerListener, captions: torch.LongTensor, images: dict) -> torch.Tensor:
    return model.rank_images(captions, **images)  # (N, I)


def embedding_of(model: VisualSemanticEmbedding, captions: torch.LongTensor, images: dict) -> torch.Tensor:
    return model(input_ids=captions, **images)  # (N, I)


# each model: how it is built for an input kind, what it computes from captions and images, and its image encoder
MODELS = {
    "value_network": (
        lambda kind: PolicyValueCaptioner(
            PolicyValueConfig(
                policy_config=policy_config(kind),
                value_word_embedding_size=8,
                value_hidden_size=8,
                value_mlp_hidden_size=8,
            )  # fmt: skip
        ),
        value_of,
        lambda model: model.value_network.image_encoder,
    ),
    "listener": (
        lambda kind: SpeakerListener(
            SpeakerListenerConfig(speaker_config=policy_config(kind), listener_hidden_size=8, joint_embedding_size=8)
        ),
        listener_of,
        lambda model: model.listener.image_encoder,
    ),
    "visual_semantic_embedding": (
        lambda kind: VisualSemanticEmbedding(
            VisualSemanticEmbeddingConfig(
                vocab_size=VOCAB_SIZE,
                word_embedding_size=8,
                hidden_size=8,
                joint_embedding_size=8,
                **INPUT_KINDS[kind],
            )  # fmt: skip
        ),
        embedding_of,
        lambda model: model.embedding.image_encoder,
    ),
}
EVERY_MODEL = pytest.mark.parametrize("model_name", list(MODELS))


def build(model_name: str, kind: str, seed: int = 0):
    torch.manual_seed(seed)
    return MODELS[model_name][0](kind).eval()


def image_regions(counts=REGION_COUNTS, seed: int = 2) -> list[torch.FloatTensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(count, FEATURE_SIZE, generator=generator) for count in counts]


def pad_regions(regions: list[torch.FloatTensor], width: int | None = None, seed: int = 3) -> dict[str, torch.Tensor]:
    """`image_features` `(B, width, D)` and `image_feature_mask` `(B, width)`; the padding holds large noise, not
    zeros, so that only the mask tells it apart from the regions."""
    width = max(len(image) for image in regions) if width is None else width
    features = 100 * torch.randn(len(regions), width, FEATURE_SIZE, generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(features.shape[:2], dtype=torch.long)
    for row, image in enumerate(regions):
        features[row, : len(image)] = image
        mask[row, : len(image)] = 1
    return {"image_features": features, "image_feature_mask": mask}


def images_of(kind: str, num_images: int = 3) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(4)
    if kind in ("cnn", "backbone"):
        return {"pixel_values": torch.randn(num_images, 3, 16, 16, generator=generator)}
    if kind == "pooled_features":
        return {"image_features": torch.randn(num_images, FEATURE_SIZE, generator=generator)}
    return pad_regions(image_regions(REGION_COUNTS[:num_images]))


def random_captions(num_captions: int = 3, length: int = 5) -> torch.LongTensor:
    captions = torch.randint(3, VOCAB_SIZE, (num_captions, length), generator=torch.Generator().manual_seed(1))
    captions[:, 0] = BOS
    return captions


@EVERY_MODEL
@pytest.mark.parametrize("kind", list(INPUT_KINDS))
def test_every_input_kind_builds_the_shared_encoder_and_survives_a_save_load_round_trip(model_name, kind, tmp_path):
    model = build(model_name, kind)
    _, compute, image_encoder = MODELS[model_name]
    assert type(image_encoder(model)) is ENCODER_CLASSES[kind]
    captions, images = random_captions(), images_of(kind)
    with torch.no_grad():
        outputs = compute(model, captions, images)
    assert outputs.shape[0] == 3 and torch.isfinite(outputs).all()
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    config = reloaded.config
    encoder_config = getattr(config, "policy_config", None) or getattr(config, "speaker_config", None) or config
    assert {name: getattr(encoder_config, name) for name in INPUT_KINDS[kind]} == INPUT_KINDS[kind]
    with torch.no_grad():
        torch.testing.assert_close(compute(reloaded, captions, images), outputs)


@EVERY_MODEL
@pytest.mark.parametrize("kind", ["cnn", "backbone", "pooled_features", "regions"])
def test_the_image_changes_the_output(model_name, kind):
    """The image side is read: other images give other outputs."""
    model = build(model_name, kind)
    compute = MODELS[model_name][1]
    captions, images = random_captions(), images_of(kind)
    others = {name: tensor.flip(0) for name, tensor in images.items()}
    with torch.no_grad():
        assert not torch.allclose(compute(model, captions, images), compute(model, captions, others))


@EVERY_MODEL
def test_padded_regions_change_nothing(model_name):
    """Each image of a padded batch gives what it gives alone, and extra padding (more noise, masked) changes
    nothing: the encoder's mean reads the real regions only."""
    model = build(model_name, "regions")
    compute = MODELS[model_name][1]
    regions = image_regions()
    captions = random_captions(len(regions))
    with torch.no_grad():
        batch = compute(model, captions, pad_regions(regions))
        wider = compute(model, captions, pad_regions(regions, width=7, seed=9))
        torch.testing.assert_close(wider, batch)
        for row, image in enumerate(regions):
            alone = {"image_features": image[None]}  # no padding, no mask
            if model_name == "value_network":  # the values of this image's caption
                torch.testing.assert_close(batch[row], compute(model, captions[row : row + 1], alone)[0])
            else:  # the similarities of every caption with this image
                torch.testing.assert_close(batch[:, row], compute(model, captions, alone)[:, 0])


@EVERY_MODEL
def test_a_pixel_encoder_refuses_a_region_mask_and_a_features_encoder_needs_features(model_name):
    compute = MODELS[model_name][1]
    captions = random_captions()
    with pytest.raises(ValueError, match="drop the mask"):
        compute(build(model_name, "cnn"), captions, {**images_of("cnn"), "image_feature_mask": torch.ones(3, 2)})
    with pytest.raises(ValueError, match="pass image_features"):
        compute(build(model_name, "regions"), captions, images_of("cnn"))


@pytest.fixture(scope="module")
def pretrained_vit(tmp_path_factory) -> str:
    """A tiny ViT saved as a folder, as a hub id would give it: the pretrained backbone to load or copy."""
    torch.manual_seed(7)
    folder = tmp_path_factory.mktemp("tiny-vit")
    config = {key: value for key, value in TINY_VIT.items() if key != "model_type"}
    ViTModel(ViTConfig(**config)).save_pretrained(folder)
    return str(folder)


def same_weights(encoder: BackboneImageEncoder, folder: str) -> bool:
    pretrained = ViTModel.from_pretrained(folder).state_dict()
    return all(torch.equal(tensor, pretrained[name]) for name, tensor in encoder.backbone.state_dict().items())


def test_a_pretrained_backbone_is_loaded_into_every_network_and_not_again_after_saving(pretrained_vit, tmp_path):
    fields = dict(encoder_type="backbone", backbone=pretrained_vit)
    captioner_config = ShowTellRLConfig(vocab_size=VOCAB_SIZE, hidden_size=16, word_embedding_size=8, **fields)
    policy_value = PolicyValueCaptioner(
        PolicyValueConfig(policy_config=captioner_config, value_word_embedding_size=8, value_hidden_size=8)
    )
    assert same_weights(policy_value.policy.image_encoder, pretrained_vit)
    assert same_weights(policy_value.value_network.image_encoder, pretrained_vit)
    speaker_config = ShowTellRLConfig(vocab_size=VOCAB_SIZE, hidden_size=16, word_embedding_size=8, **fields)
    speaker_listener = SpeakerListener(SpeakerListenerConfig(speaker_config=speaker_config, joint_embedding_size=8))
    assert same_weights(speaker_listener.listener.image_encoder, pretrained_vit)
    embedding = VisualSemanticEmbedding(VisualSemanticEmbeddingConfig(vocab_size=VOCAB_SIZE, **fields))
    assert same_weights(embedding.embedding.image_encoder, pretrained_vit)
    assert not embedding.config.use_pretrained_backbone  # the weights are the model's own now
    embedding.save_pretrained(tmp_path)
    assert VisualSemanticEmbedding.from_pretrained(tmp_path).config.use_pretrained_backbone is False


def test_value_network_listener_and_embedding_start_from_a_copy_of_the_captioners_backbone():
    torch.manual_seed(0)
    captioner = ShowTellRL(policy_config("backbone"))
    value_network = PolicyValueCaptioner.from_policy(captioner, value_hidden_size=8).value_network
    listener = SpeakerListener.from_speaker(captioner, joint_embedding_size=8).listener
    embedding = VisualSemanticEmbedding.from_captioner(captioner, joint_embedding_size=8).embedding
    expected = captioner.image_encoder.backbone.state_dict()
    for network in (value_network, listener, embedding):
        copied = network.image_encoder.backbone.state_dict()
        assert all(torch.equal(copied[name], tensor) for name, tensor in expected.items())
        assert copied[next(iter(copied))].data_ptr() != expected[next(iter(expected))].data_ptr()  # a copy
        assert network.image_encoder.freeze  # the captioner's freeze_backbone (True by default)
