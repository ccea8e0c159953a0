"""Ren et al.'s embedding reward: the cosine of a caption's and its image's embeddings, the hinge ranking loss that
trains the embedding, and the embedding as a checkpoint of its own."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModel, AutoProcessor

import rlcaption.rewards.embedding  # noqa: F401  (registers the `embedding` reward)
from rlcaption.data import load_shapes
from rlcaption.models import ShowTellRL, ShowTellRLConfig, VisualSemanticEmbedding, VisualSemanticEmbeddingConfig
from rlcaption.processing import CaptionProcessor
from rlcaption.rewards import CiderReward, RewardMix, get_reward
from rlcaption.rewards.embedding import EmbeddingReward, bidirectional_hinge_losses, train_embedding_model

IMAGE_SIZE = 48


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return load_shapes(
        num_train=24, num_validation=4, num_test=4, image_size=IMAGE_SIZE, seed=7,
        cache_dir=tmp_path_factory.mktemp("shapes_cache"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def processor(shapes):
    captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
    return CaptionProcessor.from_captions(captions, image_size=IMAGE_SIZE)


def make_embedding(processor, seed: int = 0, **fields) -> VisualSemanticEmbedding:
    torch.manual_seed(seed)
    tokenizer = processor.tokenizer
    config = VisualSemanticEmbeddingConfig(
        vocab_size=len(tokenizer), word_embedding_size=16, hidden_size=24, joint_embedding_size=12,
        image_size=IMAGE_SIZE, cnn_channels=[8, 8, 16, 16], pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **fields,
    )  # fmt: skip
    return VisualSemanticEmbedding(config).eval()


def by_hand(model, processor, caption: str, image) -> float:
    """cos(h_T(S), l_e(f_I)): the GRU's last state over the caption's words and end token, and the image's map."""
    token_ids = processor(text=[caption])["input_ids"][0, 1:]  # w_1 ... w_n <eos>
    _, last_state = model.embedding.caption_rnn(model.word_embeddings(token_ids)[None])
    caption_embedding = model.embedding.caption_projection(last_state[0, 0])
    pixel_values = processor(images=[image])["pixel_values"]
    image_embedding = model.embedding.image_projection(model.embedding.image_encoder(pixel_values))[0]
    return float(F.cosine_similarity(caption_embedding, image_embedding, dim=0))


def test_reward_is_the_cosine_of_the_caption_and_image_embeddings(shapes, processor):
    model = make_embedding(processor)
    reward = EmbeddingReward((model, processor))
    images = shapes["train"]["image"][:3]
    completions = ["a red circle", "a small blue square on the left", "", "a green triangle"]
    rows = [0, 0, 1, 2]  # two completions for image 0; an empty caption still has its end token
    with torch.no_grad():
        expected = [by_hand(model, processor, text, images[row]) for text, row in zip(completions, rows, strict=True)]
    # the pixel values a captioner's processor prepared, as the trainer passes them, one per completion
    pixel_values = processor(images=images)["pixel_values"][rows]
    values = reward(completions=completions, references=[["unused"]] * 4, pixel_values=pixel_values)
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-6)
    assert reward.__name__ == "embedding" and all(-1.0 <= value <= 1.0 for value in values)
    # the images of a dataset's `image` column, as TRL passes them, give the same
    from_images = reward(completions=completions, references=None, image=[images[row] for row in rows])
    np.testing.assert_allclose(from_images, expected, rtol=1e-5, atol=1e-6)
    # grouped per image, each image given once
    groups = reward.score_groups(
        completions=[completions[:2], completions[2:3], completions[3:]],
        pixel_values=processor(images=images)["pixel_values"],
    )
    np.testing.assert_allclose([value for group in groups for value in group], expected, rtol=1e-5, atol=1e-6)
    # an image without completions (its group is empty) still counts as a row of the image columns
    empty_group = reward.score_groups(completions=[completions[:1], []], image=images[:2])
    assert empty_group[1] == [] and empty_group[0] == pytest.approx(expected[:1], rel=1e-5, abs=1e-6)
    with pytest.raises(ValueError, match="one image per completion"):
        reward(completions=completions, pixel_values=pixel_values[:2])


def test_hinge_loss_matches_a_hand_computation():
    # rows are captions, columns images; caption i describes image i
    similarities = torch.tensor([[0.9, -0.2, 0.8], [0.1, 0.4, 0.3], [-0.6, 0.7, 0.8]])
    # pair 0: images for caption 0: max(0, .2 - .9 - .2) + max(0, .2 - .9 + .8) = 0.1;
    #         captions for image 0: max(0, .2 - .9 + .1) + max(0, .2 - .9 - .6) = 0          -> 0.1
    # pair 1: images: (.2 - .4 + .1) + (.2 - .4 + .3) = 0 + 0.1; captions: (.2 - .4 - .2) + (.2 - .4 + .7) = 0.5
    #                                                                                          -> 0.6
    # pair 2: images: (.2 - .8 - .6) + (.2 - .8 + .7) = 0.1; captions: (.2 - .8 + .8) + (.2 - .8 + .3) = 0.2
    #                                                                                          -> 0.3
    losses = bidirectional_hinge_losses(similarities, margin=0.2)
    torch.testing.assert_close(losses, torch.tensor([0.1, 0.6, 0.3]))
    assert bidirectional_hinge_losses(torch.tensor([[0.3]])).tolist() == [0.0]


def batch_loss(model, processor, dataset, margin: float = 0.2) -> float:
    """The mean hinge loss of the first reference of every image, all images in one batch."""
    text = processor(text=[captions[0] for captions in dataset["captions"]])
    with torch.no_grad():
        similarities = model(
            input_ids=text["input_ids"], attention_mask=text["attention_mask"],
            pixel_values=processor(images=dataset["image"])["pixel_values"],
        )  # fmt: skip
    return float(bidirectional_hinge_losses(similarities, margin).mean())


def test_a_few_training_steps_lower_the_loss_and_leave_a_fixed_encoder_alone(shapes, processor):
    model = make_embedding(processor)
    before = batch_loss(model, processor, shapes["train"])
    losses = train_embedding_model(
        model, processor, shapes["train"], num_steps=30, batch_size=12, learning_rate=3e-3, seed=1
    )
    assert len(losses) == 30 and not model.training
    assert batch_loss(model, processor, shapes["train"]) < 0.8 * before
    assert np.mean(losses[-5:]) < np.mean(losses[:5])

    # a captioner's fixed, pretrained CNN becomes the embedding's fixed image encoder: l_e maps fixed features
    captioner = ShowTellRL(
        ShowTellRLConfig(vocab_size=len(processor.tokenizer), hidden_size=16, word_embedding_size=16,
                         image_size=IMAGE_SIZE, cnn_channels=[8, 8, 16, 16], freeze_image_encoder=True)
    )  # fmt: skip
    copied = VisualSemanticEmbedding.from_captioner(captioner, word_embedding_size=8, hidden_size=8)
    assert copied.config.freeze_image_encoder and copied.config.vocab_size == len(processor.tokenizer)
    encoder = {name: tensor.clone() for name, tensor in captioner.image_encoder.state_dict().items()}
    assert all(torch.equal(copied.embedding.image_encoder.state_dict()[name], t) for name, t in encoder.items())
    projection = copied.embedding.image_projection.weight.clone()
    train_embedding_model(copied, processor, shapes["train"], num_steps=2, batch_size=4)
    assert all(torch.equal(copied.embedding.image_encoder.state_dict()[name], t) for name, t in encoder.items())
    assert not torch.equal(copied.embedding.image_projection.weight, projection)


def test_a_saved_embedding_loads_by_folder_and_gives_the_same_reward(shapes, processor, tmp_path):
    model = make_embedding(processor, seed=3)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    assert type(AutoConfig.from_pretrained(tmp_path)) is VisualSemanticEmbeddingConfig
    assert type(AutoModel.from_pretrained(tmp_path)) is VisualSemanticEmbedding
    assert type(AutoProcessor.from_pretrained(tmp_path)) is CaptionProcessor

    completions = ["a red circle", "two shapes", "a blue square above a green star"]
    pixel_values = processor(images=shapes["train"]["image"][:3])["pixel_values"]
    expected = EmbeddingReward((model, processor))(completions=completions, pixel_values=pixel_values)
    loaded = get_reward("embedding", model=tmp_path)
    assert isinstance(loaded, EmbeddingReward)
    assert loaded(completions=completions, pixel_values=pixel_values) == pytest.approx(expected, abs=1e-7)
    with pytest.raises(ValueError, match="needs a trained VisualSemanticEmbedding"):
        get_reward("embedding")


def test_embedding_mixes_with_cider(shapes, processor):
    train = shapes["train"]
    embedding = EmbeddingReward((make_embedding(processor), processor))
    cider = CiderReward(document_frequencies=train["captions"])
    mix = RewardMix([cider, embedding], weights=[1.0, 0.5])
    completions = [["a red circle", "two shapes"], ["a blue square"]]
    totals, components = mix.score_groups(
        completions=completions, references=train["captions"][:2],
        pixel_values=processor(images=train["image"][:2])["pixel_values"], image_id=train["image_id"][:2],
    )  # fmt: skip
    assert set(components) == {"cider", "embedding"}
    np.testing.assert_allclose(totals, components["cider"] + 0.5 * components["embedding"])


def test_an_embedding_of_precomputed_features():
    processor = CaptionProcessor.from_captions(["a red circle", "a blue square"], image_size=16)
    torch.manual_seed(0)
    config = VisualSemanticEmbeddingConfig(
        vocab_size=len(processor.tokenizer), word_embedding_size=8, hidden_size=8, joint_embedding_size=6,
        encoder_type="features", image_feature_size=10,
    )  # fmt: skip
    model = VisualSemanticEmbedding(config).eval()
    features = torch.randn(2, 10)
    values = EmbeddingReward((model, processor)).score_groups(
        completions=[["a red circle"], ["a blue square", "a circle"]], image_features=features
    )
    with torch.no_grad():
        images = model.get_image_features(image_features=features).pooler_output
        text = processor(text=["a red circle", "a blue square", "a circle"])
        captions = model.get_text_features(text["input_ids"], text["attention_mask"]).pooler_output
    expected = (captions * images[[0, 1, 1]]).sum(dim=-1)
    np.testing.assert_allclose([value for group in values for value in group], expected.numpy(), rtol=1e-5)
    with pytest.raises(ValueError, match="encoder_type"):
        VisualSemanticEmbeddingConfig(encoder_type="backbone")
