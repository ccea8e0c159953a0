"""ShapesCLIP: config checks, CLIPModel-like outputs, the contrastive loss, towers, save/load and the Auto classes."""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel, AutoProcessor

import rlcaption.auto  # noqa: F401  (registers the Auto classes)
from rlcaption.models.shapes_clip import ShapesCLIPConfig, ShapesCLIPModel
from rlcaption.processing import CaptionProcessor

PAD, BOS, EOS = 0, 1, 2


def tiny_config(**overrides) -> ShapesCLIPConfig:
    fields = dict(
        vocab_size=30, word_embedding_size=8, text_hidden_size=8, image_size=16, cnn_channels=[4, 8], projection_dim=8
    )
    fields.update(overrides)
    return ShapesCLIPConfig(**fields)


def tiny_model(seed: int = 0, **overrides) -> ShapesCLIPModel:
    torch.manual_seed(seed)
    return ShapesCLIPModel(tiny_config(**overrides)).eval()


def random_pixels(batch_size: int, side: int = 16, seed: int = 2) -> torch.FloatTensor:
    return torch.randn(batch_size, 3, side, side, generator=torch.Generator().manual_seed(seed))


def captions(lengths: list[int], pad_to: int | None = None, seed: int = 1) -> tuple[torch.LongTensor, torch.Tensor]:
    """Right-padded `<bos> w ... <eos>` rows of the given total lengths and their attention mask."""
    generator = torch.Generator().manual_seed(seed)
    width = pad_to or max(lengths)
    input_ids = torch.full((len(lengths), width), PAD)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(3, 30, (length,), generator=generator)
        input_ids[row, 0], input_ids[row, length - 1] = BOS, EOS
    return input_ids, (input_ids != PAD).long()


# ------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(encoder_type="features"), "encoder_type"),
        (dict(image_size=18), "divisible"),
        (dict(encoder_type="backbone"), "backbone_config"),
        (dict(encoder_type="backbone", backbone_config={"model_type": "vit", "image_size": 32}), "32px"),
        (dict(eos_token_id=30), "eos_token_id"),
        (dict(projection_dim=0), "projection_dim"),
    ],
)
def test_config_rejects_inconsistent_settings(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


# ------------------------------------------------------------------ outputs


def test_logits_are_scaled_cosines_of_the_feature_methods():
    model = tiny_model()
    pixel_values = random_pixels(3)
    input_ids, attention_mask = captions([4, 6, 3, 5])
    with torch.no_grad():
        outputs = model(input_ids=input_ids, pixel_values=pixel_values, attention_mask=attention_mask)
        images = model.get_image_features(pixel_values).pooler_output
        texts = model.get_text_features(input_ids, attention_mask).pooler_output
    assert images.shape == (3, 8) and texts.shape == (4, 8)
    expected = model.logit_scale.exp() * F.normalize(texts, dim=-1) @ F.normalize(images, dim=-1).T
    torch.testing.assert_close(outputs.logits_per_text, expected)
    torch.testing.assert_close(outputs.logits_per_image, expected.T)
    torch.testing.assert_close(outputs.image_embeds, F.normalize(images, dim=-1))
    assert outputs.loss is None


def test_loss_is_clips_symmetric_cross_entropy_and_trains_both_towers():
    model = tiny_model().train()
    input_ids, attention_mask = captions([4, 6, 3])
    outputs = model(
        input_ids=input_ids, pixel_values=random_pixels(3), attention_mask=attention_mask, return_loss=True
    )
    targets = torch.arange(3)
    expected = F.cross_entropy(outputs.logits_per_text, targets) + F.cross_entropy(outputs.logits_per_image, targets)
    torch.testing.assert_close(outputs.loss, expected / 2)
    outputs.loss.backward()
    for name in ("image_encoder.blocks.0.weight", "text_encoder.gru.weight_ih_l0", "logit_scale"):
        gradient = model.get_parameter(name).grad
        assert gradient is not None and gradient.abs().sum() > 0, name


def test_loss_needs_one_text_per_image():
    input_ids, attention_mask = captions([4, 6])
    with pytest.raises(ValueError, match="2 texts and 3 images"):
        tiny_model()(
            input_ids=input_ids, pixel_values=random_pixels(3), attention_mask=attention_mask, return_loss=True
        )


def test_text_embedding_ignores_padding_and_reads_every_token():
    model = tiny_model()
    short, short_mask = captions([5], seed=4)
    padded, padded_mask = captions([5], pad_to=9, seed=4)
    with torch.no_grad():
        reference = model.get_text_features(short, short_mask).pooler_output
        torch.testing.assert_close(model.get_text_features(padded, padded_mask).pooler_output, reference)
        # without a mask, padding is recognised by its id
        torch.testing.assert_close(model.get_text_features(padded).pooler_output, reference)
        changed = short.clone()
        changed[0, 2] = 3 if changed[0, 2] != 3 else 4  # a word in the middle, far from both ends
        assert not torch.allclose(model.get_text_features(changed, short_mask).pooler_output, reference)


def test_cnn_tower_sees_where_objects_are():
    model = tiny_model()
    left, right = torch.zeros(1, 3, 16, 16), torch.zeros(1, 3, 16, 16)
    left[..., 4:8, 1:5] = 1.0
    right[..., 4:8, 11:15] = 1.0
    with torch.no_grad():
        features = model.get_image_features(torch.cat([left, right])).pooler_output
    assert not torch.allclose(features[0], features[1], atol=1e-4)


def test_a_transformers_backbone_can_be_the_image_tower():
    backbone = {"model_type": "vit", "image_size": 16, "patch_size": 8, "hidden_size": 16, "num_hidden_layers": 1,
                "num_attention_heads": 2, "intermediate_size": 32}  # fmt: skip
    model = tiny_model(encoder_type="backbone", backbone_config=backbone)
    input_ids, attention_mask = captions([4, 6])
    outputs = model(
        input_ids=input_ids, pixel_values=random_pixels(2), attention_mask=attention_mask, return_loss=True
    )
    assert outputs.logits_per_image.shape == (2, 2) and torch.isfinite(outputs.loss)


# ------------------------------------------------------------------ save / load


@pytest.fixture
def saved_model(tmp_path):
    model = tiny_model(seed=5)
    processor = CaptionProcessor.from_captions(["a red circle", "a blue square left of a green star"], image_size=16)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    return model, tmp_path


def test_save_load_round_trip_through_the_auto_classes(saved_model):
    model, folder = saved_model
    assert not list(folder.glob("*.py"))  # no copy of the package's code: the installed package registers the classes
    assert type(AutoConfig.from_pretrained(folder)) is ShapesCLIPConfig
    loaded = AutoModel.from_pretrained(folder).eval()
    assert type(loaded) is ShapesCLIPModel
    processor = AutoProcessor.from_pretrained(folder)
    assert type(processor) is CaptionProcessor
    assert processor.image_processor.size == {"height": 16, "width": 16}
    inputs = processor(images=[torch.rand(3, 24, 24)], text=["A red circle."])  # resized from 24 to 16 pixels
    with torch.no_grad():
        expected = model(**inputs).logits_per_image
        torch.testing.assert_close(loaded(**inputs).logits_per_image, expected)
    for name, parameter in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], parameter, msg=name)
