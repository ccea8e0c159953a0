import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel, AutoModelForImageTextToText, AutoProcessor

import rlcaption.auto  # noqa: F401  (registers the Auto classes)
from rlcaption.generation.captioners import captioner_for
from rlcaption.models import ShowTellRL, ShowTellRLConfig, SpeakerListener, SpeakerListenerConfig
from rlcaption.processing import CaptionProcessor

PAD, BOS, EOS = 0, 1, 2
VOCAB_SIZE = 50


def tiny_speaker_config(**overrides) -> ShowTellRLConfig:
    fields = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        word_embedding_size=16,
        image_size=16,
        cnn_channels=[4, 8],
        max_caption_length=8,
        dropout=0.1,
    )
    fields.update(overrides)
    return ShowTellRLConfig(**fields)


def tiny_config(**speaker_overrides) -> SpeakerListenerConfig:
    speaker_config = tiny_speaker_config(**speaker_overrides)
    return SpeakerListenerConfig(speaker_config=speaker_config, listener_hidden_size=24, joint_embedding_size=12)


def tiny_model(seed: int = 0, **speaker_overrides) -> SpeakerListener:
    torch.manual_seed(seed)
    return SpeakerListener(tiny_config(**speaker_overrides)).eval()


def random_pixels(batch_size: int, seed: int = 2) -> torch.FloatTensor:
    return torch.randn(batch_size, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def random_tokens(batch_size: int, length: int, seed: int = 1) -> torch.LongTensor:
    return torch.randint(3, VOCAB_SIZE, (batch_size, length), generator=torch.Generator().manual_seed(seed))


def captions_of_lengths(lengths: list[int], width: int) -> torch.LongTensor:
    """`<bos> w ... <eos> <pad> ...` rows whose words and end token fill `lengths[i]` steps."""
    captions = torch.full((len(lengths), width), PAD)
    captions[:, 0] = BOS
    for row, (length, words) in enumerate(zip(lengths, random_tokens(len(lengths), width), strict=True)):
        captions[row, 1:length] = words[: length - 1]
        captions[row, length] = EOS
    return captions


@pytest.mark.parametrize(
    "speaker_overrides, listener_fields, message",
    [
        ({}, dict(listener_cnn_channels=[4, 4, 4, 4, 4]), "divisible"),
        ({}, dict(joint_embedding_size=0), "joint_embedding_size"),
    ],
)
def test_config_rejects_a_listener_it_cannot_build(speaker_overrides, listener_fields, message):
    with pytest.raises(ValueError, match=message):
        SpeakerListenerConfig(speaker_config=tiny_speaker_config(**speaker_overrides), **listener_fields)


def test_config_defaults_the_listener_cnn_to_the_speaker_s_and_serialises_the_speaker():
    config = tiny_config()
    assert config.listener_cnn_channels == [4, 8]
    assert config.get_text_config() is config.speaker_config
    reloaded = SpeakerListenerConfig.from_dict(config.to_dict())
    assert isinstance(reloaded.speaker_config, ShowTellRLConfig)
    assert reloaded.speaker_config.to_dict() == config.speaker_config.to_dict()


def test_generate_forward_and_caption_tokens_are_the_speaker_s():
    model = tiny_model()
    pixel_values = random_pixels(3)
    assert torch.equal(model.generate(pixel_values=pixel_values), model.speaker.generate(pixel_values=pixel_values))
    captions = captions_of_lengths([3, 5, 8], width=9)
    assert torch.equal(
        model(input_ids=captions, pixel_values=pixel_values).logits,
        model.speaker(input_ids=captions, pixel_values=pixel_values).logits,
    )
    assert model.generation_config is model.speaker.generation_config
    captioner = captioner_for(model)
    assert captioner.family == "SpeakerListener"
    assert (captioner.tokens.start_token_id, captioner.tokens.end_token_id) == (BOS, EOS)


def test_save_load_round_trip_gives_identical_outputs(tmp_path):
    model = tiny_model()
    model.generation_config.max_length = 6
    pixel_values = random_pixels(4)
    captions = model.generate(pixel_values=pixel_values)
    model.save_pretrained(tmp_path)
    loaded = SpeakerListener.from_pretrained(tmp_path).eval()
    assert loaded.generation_config.max_length == 6
    assert torch.equal(loaded.generate(pixel_values=pixel_values), captions)
    logits = model(input_ids=captions, pixel_values=pixel_values).logits
    assert torch.equal(loaded(input_ids=captions, pixel_values=pixel_values).logits, logits)
    assert torch.equal(loaded.rank_images(captions, pixel_values), model.rank_images(captions, pixel_values))


def test_auto_classes_resolve_a_saved_speaker_listener(tmp_path):
    processor = CaptionProcessor.from_captions(["a red circle", "a blue square"], image_size=16)
    model = tiny_model(vocab_size=len(processor.tokenizer))
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is SpeakerListenerConfig
    assert type(AutoModel.from_pretrained(tmp_path)) is SpeakerListener
    assert type(AutoModelForImageTextToText.from_pretrained(tmp_path)) is SpeakerListener
    assert type(AutoProcessor.from_pretrained(tmp_path)) is CaptionProcessor


def test_a_frozen_speaker_encoder_stays_frozen_after_loading(tmp_path):
    tiny_model(freeze_image_encoder=True).save_pretrained(tmp_path)
    loaded = SpeakerListener.from_pretrained(tmp_path)
    assert not any(parameter.requires_grad for parameter in loaded.speaker.image_encoder.parameters())
    assert all(parameter.requires_grad for parameter in loaded.listener.parameters())


def test_the_listener_ranks_images_by_the_cosine_of_its_gru_and_image_embeddings():
    model = tiny_model()
    captions = captions_of_lengths([2, 6, 4], width=8)  # padding after the end token must not count
    pixel_values = random_pixels(5)
    listener, embeddings = model.listener, model.speaker.word_embeddings.weight
    expected_captions = []
    for caption in captions:
        length = int((caption == EOS).nonzero()[0])  # the words and the end token, after <bos>
        _, last_state = listener.caption_rnn(embeddings[caption[1 : length + 1]][None])
        expected_captions.append(listener.caption_projection(last_state[0, 0]))
    images = listener.image_projection(listener.image_encoder(pixel_values))  # (5, J)
    expected = F.cosine_similarity(torch.stack(expected_captions)[:, None, :], images[None, :, :], dim=-1)
    similarities = model.rank_images(captions, pixel_values)
    assert similarities.shape == (3, 5)
    torch.testing.assert_close(similarities, expected, rtol=1e-5, atol=1e-6)


def test_soft_one_hot_word_vectors_equal_the_hard_token_path():
    model = tiny_model()
    tokens = random_tokens(4, 7)
    mask = torch.tensor([[1] * n + [0] * (7 - n) for n in (7, 3, 1, 5)])
    word_embeddings = model.speaker.get_input_embeddings()
    one_hots = F.one_hot(tokens, VOCAB_SIZE).float().requires_grad_()
    soft = model.listener.embed_captions(one_hots, word_embeddings, mask)
    hard = model.listener.embed_captions(tokens, word_embeddings, mask)
    torch.testing.assert_close(soft, hard, rtol=0, atol=1e-6)
    # the word vectors are differentiable inputs, and only the steps up to each caption's end are read
    soft.sum().backward()
    assert one_hots.grad[0].abs().sum() > 0
    assert one_hots.grad[1, 3:].abs().sum() == 0


def test_a_features_speaker_gets_a_listener_that_maps_the_same_features():
    torch.manual_seed(0)
    config = SpeakerListenerConfig(
        speaker_config=tiny_speaker_config(encoder_type="features", image_feature_size=10), joint_embedding_size=6
    )
    model = SpeakerListener(config).eval()
    image_features = torch.randn(3, 10)
    captions = model.generate(image_features=image_features)
    similarities = model.rank_images(captions, image_features=image_features)
    assert similarities.shape == (3, 3)
    with pytest.raises(ValueError, match="image_features"):
        model.rank_images(captions, pixel_values=random_pixels(3))


def test_a_detached_listener_leaves_the_parameters_but_is_saved_loaded_and_moved_with_the_model(tmp_path):
    model = tiny_model()
    listener = model.listener
    listener_ids = {id(parameter) for parameter in listener.parameters()}
    assert model.detach_listener() is listener
    assert model.detach_listener() is listener  # idempotent
    assert model.listener is listener and model.listener_is_detached
    assert not listener_ids & {id(parameter) for parameter in model.parameters()}
    assert not any(key.startswith("listener.") for key in model.state_dict())

    model.save_pretrained(tmp_path)
    assert model.listener_is_detached
    loaded = SpeakerListener.from_pretrained(tmp_path)
    for name, tensor in loaded.listener.state_dict().items():
        assert torch.equal(tensor, listener.state_dict()[name])

    # what a resumed run does: load the saved weights into a model whose listener is detached
    other = tiny_model(seed=1)
    other.detach_listener()
    other.load_state_dict(loaded.state_dict())
    for name, tensor in other.listener.state_dict().items():
        assert torch.equal(tensor, listener.state_dict()[name])

    model.to(torch.float64)
    assert all(parameter.dtype == torch.float64 for parameter in listener.parameters())
    model.train()
    assert listener.training
    model.attach_listener()
    assert not model.listener_is_detached
    assert listener_ids <= {id(parameter) for parameter in model.parameters()}


def test_from_speaker_copies_the_speaker_and_adds_a_listener():
    torch.manual_seed(0)
    speaker = ShowTellRL(tiny_speaker_config()).eval()
    speaker.generation_config.num_beams = 2
    model = SpeakerListener.from_speaker(speaker, joint_embedding_size=6).eval()
    assert model.config.joint_embedding_size == 6
    assert model.generation_config.num_beams == 2
    pixel_values = random_pixels(2)
    assert torch.equal(model.generate(pixel_values=pixel_values), speaker.generate(pixel_values=pixel_values))
    # a copy: training the SpeakerListener leaves the captioner it started from unchanged
    with torch.no_grad():
        model.speaker.lm_head.weight.add_(1.0)
    assert not torch.equal(model.speaker.lm_head.weight, speaker.lm_head.weight)
