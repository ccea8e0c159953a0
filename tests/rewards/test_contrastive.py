"""The clip_contrastive reward: Chaffin et al.'s eq. 2 by hand, neighbour mining, its cache, and the sets T and I."""

import math

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from rlcaption.rewards import contrastive as contrastive_module
from rlcaption.rewards import get_reward
from rlcaption.rewards.contrastive import (
    ContrastiveReward,
    MinedNeighbours,
    decoupled_contrastive_rewards,
    mine_neighbours,
)
from tiny_clips import StubCLIP, StubProcessor, indexed_images, make_processor, make_shapes_clip

# five images on the unit circle: their cosine similarities order the neighbours
ANGLES = [0.0, 10.0, 30.0, 90.0, 100.0]
IMAGE_VECTORS = [[math.cos(math.radians(angle)), math.sin(math.radians(angle))] for angle in ANGLES]
IMAGE_IDS = [10, 11, 12, 13, 14]
TEXT_VECTORS = {"right": [1.0, 0.0], "up": [0.0, 1.0], "diagonal": [0.6, 0.8]}


def hand_lse(tau, values):
    return tau * math.log(sum(math.exp(value / tau) for value in values))


def test_eq2_by_hand_on_two_images_and_three_texts():
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    texts = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6]])
    own_image = [0, 0, 1]  # texts 0 and 1 describe image 0, text 2 image 1
    tau = 0.5
    # s(x, i): x0 -> (1, 0), x1 -> (0.6, 0.8), x2 -> (0.8, 0.6)
    rewards = decoupled_contrastive_rewards(texts, images, own_image, tau)
    # image-to-text: each text against the OTHER texts at its image
    expected_i2t = [
        1.0 - hand_lse(tau, [0.6, 0.8]),  # at image 0: x1 0.6, x2 0.8
        0.6 - hand_lse(tau, [1.0, 0.8]),  # at image 0: x0 1.0, x2 0.8
        0.6 - hand_lse(tau, [0.0, 0.8]),  # at image 1: x0 0.0, x1 0.8
    ]
    # text-to-image: each text against the OTHER image (one here, so the log-sum-exp is that similarity)
    expected_t2i = [1.0 - 0.0, 0.6 - 0.8, 0.6 - 0.8]
    torch.testing.assert_close(rewards.similarity, torch.tensor([1.0, 0.6, 0.6], dtype=torch.float64))
    torch.testing.assert_close(rewards.i2t, torch.tensor(expected_i2t, dtype=torch.float64))
    torch.testing.assert_close(rewards.t2i, torch.tensor(expected_t2i, dtype=torch.float64))
    torch.testing.assert_close(rewards.combined("i2t"), rewards.i2t)
    torch.testing.assert_close(rewards.combined("t2i"), rewards.t2i)
    torch.testing.assert_close(
        rewards.combined("both"), torch.tensor(expected_i2t, dtype=torch.float64) + torch.tensor(expected_t2i)
    )
    with pytest.raises(ValueError, match="direction"):
        rewards.combined("sideways")


def test_the_positive_is_excluded_from_the_denominators():
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    texts = torch.tensor([[1.0, 0.0], [0.8, 0.6]])  # both describe image 0; text 0 fits it best
    rewards = decoupled_contrastive_rewards(texts, images, [0, 0], temperature=0.1)
    # with one negative the log-sum-exp is that negative's similarity: r = s(x_c, i_c) − s(x', i_c), exactly
    torch.testing.assert_close(rewards.i2t, torch.tensor([1.0 - 0.8, 0.8 - 1.0], dtype=torch.float64))
    # the best caption is rewarded; with the positive in the sum, τ log(e^{1/τ} + e^{0.8/τ}) > 1 would make it < 0
    assert rewards.i2t[0] > 0 and rewards.t2i[0] > 0
    assert 1.0 - hand_lse(0.1, [1.0, 0.8]) < 0
    # a small τ makes the log-sum-exp a maximum: the hardest negative is the baseline
    many = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.9, 0.3], [0.5, 0.5], [0.2, 0.9]]), dim=-1)
    sharp = decoupled_contrastive_rewards(many, images, [0, 0, 1, 1], temperature=1e-3)
    similarities = (many @ images.T).double()
    hardest_text = torch.tensor([similarities[1, 0], similarities[0, 0], similarities[3, 1], similarities[2, 1]])
    torch.testing.assert_close(sharp.i2t, sharp.similarity - hardest_text, atol=1e-2, rtol=0)


def test_eq2_refuses_sets_without_negatives_and_bad_inputs():
    with pytest.raises(ValueError, match="at least 2 texts and 2 images"):
        decoupled_contrastive_rewards(torch.eye(2), torch.eye(2)[:1], [0, 0], 0.1)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        decoupled_contrastive_rewards(torch.eye(2), torch.eye(2), [0, 1], 0.0)
    with pytest.raises(ValueError, match="one image row"):
        decoupled_contrastive_rewards(torch.eye(2), torch.eye(2), [0, 2], 0.1)


def test_neighbours_are_the_most_similar_other_images():
    neighbours = mine_neighbours(torch.tensor(IMAGE_VECTORS), num_neighbours=2, chunk_size=2)
    assert neighbours.tolist() == [[1, 2], [0, 2], [1, 0], [4, 2], [3, 2]]
    with pytest.raises(ValueError, match="Cannot mine 5 neighbours per image among 5 images"):
        mine_neighbours(torch.tensor(IMAGE_VECTORS), num_neighbours=5)


def stub_dataset():
    images = [Image.fromarray(image) for image in indexed_images(len(ANGLES))]
    features = datasets.Features({"image": datasets.Image(), "image_id": datasets.Value("int64")})
    return datasets.Dataset.from_dict({"image": images, "image_id": IMAGE_IDS}, features=features)


def stub_reward(**kwargs):
    stub = StubCLIP(IMAGE_VECTORS, TEXT_VECTORS)
    return ContrastiveReward((stub, StubProcessor(stub.texts)), temperature=0.1, num_neighbours=2, **kwargs), stub


def test_prepare_mines_once_writes_the_cache_and_a_later_run_reads_it_without_embedding(tmp_path):
    cache = tmp_path / "out" / "mined_neighbours.safetensors"
    first, first_clip = stub_reward(cache_path=cache)
    first.prepare(stub_dataset())
    assert first_clip.image_calls == len(ANGLES)  # every training image embedded once
    assert cache.is_file()
    assert first.mined.neighbours.tolist() == [[1, 2], [0, 2], [1, 0], [4, 2], [3, 2]]

    resumed, resumed_clip = stub_reward(cache_path=cache)
    resumed.prepare(stub_dataset())
    assert resumed_clip.image_calls == 0  # read, not mined again
    assert resumed.mined.image_ids == IMAGE_IDS
    torch.testing.assert_close(resumed.mined.image_embeddings, first.mined.image_embeddings)
    assert torch.equal(resumed.mined.neighbours, first.mined.neighbours)

    # a file mined for another run is refused, never silently used
    other_k, _ = stub_reward(cache_path=cache)
    other_k.num_neighbours = 3
    with pytest.raises(ValueError, match="holds 2 neighbours per image, not 3.*Delete the file"):
        other_k.prepare(stub_dataset())
    with pytest.raises(ValueError, match="image ids"):
        stub_reward(cache_path=cache)[0].prepare(stub_dataset().select(range(4)))


def test_score_groups_contrasts_all_completions_with_the_batch_images_and_their_neighbours():
    reward, stub = stub_reward()
    reward.prepare(stub_dataset())
    calls = stub.image_calls
    groups = [["right", "diagonal"], ["up", "right", "diagonal"]]
    values = reward.score_groups(completions=groups, references=None, image_id=[10, 13])
    assert stub.image_calls == calls  # mined images take their stored embeddings
    # I: the batch (10, 13), then the neighbours of 10 (11, 12) and of 13 (14; 12 already in)
    expected_images = torch.tensor([IMAGE_VECTORS[row] for row in (0, 3, 1, 2, 4)])
    torch.testing.assert_close(reward.image_set({"image_id": [10, 13]}, 2), expected_images)
    texts = torch.tensor([TEXT_VECTORS[text] for group in groups for text in group])
    expected = decoupled_contrastive_rewards(texts, expected_images, [0, 0, 1, 1, 1], 0.1).combined("both")
    np.testing.assert_allclose([value for group in values for value in group], expected.numpy(), atol=1e-6)
    assert [len(group) for group in values] == [2, 3]

    # an image that was not mined is embedded from its column and brings no neighbours
    image = indexed_images(len(ANGLES))[4]
    unknown = reward.image_set({"image_id": [10, 99], "image": [None, image]}, 2)
    assert stub.image_calls == calls + 1
    torch.testing.assert_close(unknown, torch.tensor([IMAGE_VECTORS[row] for row in (0, 4, 1, 2)]))

    one_direction, _ = stub_reward(direction="i2t")
    one_direction.prepare(stub_dataset())
    i2t = one_direction.score_groups(completions=groups, references=None, image_id=[10, 13])
    expected_i2t = decoupled_contrastive_rewards(texts, expected_images, [0, 0, 1, 1, 1], 0.1).i2t
    np.testing.assert_allclose([value for group in i2t for value in group], expected_i2t.numpy(), atol=1e-6)


def test_registered_reward_takes_the_clips_own_temperature_by_default(tmp_path):
    processor = make_processor(image_size=16)
    clip = make_shapes_clip(processor)
    reward = get_reward("clip_contrastive", model=(clip, processor))
    assert isinstance(reward, ContrastiveReward) and reward.__name__ == "clip_contrastive"
    assert reward.temperature == pytest.approx(1.0 / math.exp(float(clip.logit_scale.detach())))
    assert get_reward("clip_contrastive", model=(clip, processor), temperature=0.01).temperature == 0.01
    stub = StubCLIP(IMAGE_VECTORS, TEXT_VECTORS)
    with pytest.raises(ValueError, match="no `logit_scale`.*temperature="):
        ContrastiveReward((stub, StubProcessor(stub.texts)))
    with pytest.raises(ValueError, match="needs a CLIP"):
        get_reward("clip_contrastive")


def test_the_cache_round_trips_string_ids(tmp_path):
    mined = MinedNeighbours(["a", "b"], torch.eye(2), torch.tensor([[1], [0]]), "clip")
    mined.save(tmp_path / "mined.safetensors")
    loaded = MinedNeighbours.load(tmp_path / "mined.safetensors")
    assert loaded.image_ids == ["a", "b"] and loaded.row_of == {"a": 0, "b": 1} and loaded.clip == "clip"
    assert not (tmp_path / "mined.safetensors.tmp").exists()


def test_mining_reads_pixel_values_columns(monkeypatch):
    reward, stub = stub_reward()
    dataset = stub_dataset()
    # the same images as a `pixel_values` column normalised with mean = std = 0.5
    pixel_values = [
        (np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255 - 0.5) / 0.5 for image in dataset["image"]
    ]
    as_pixels = datasets.Dataset.from_dict({"pixel_values": pixel_values, "image_id": IMAGE_IDS})
    reward.prepare(as_pixels)
    assert reward.mined.neighbours.tolist() == [[1, 2], [0, 2], [1, 0], [4, 2], [3, 2]]
    monkeypatch.setattr(contrastive_module, "_MINING_CHUNK", 2)  # several chunks give the same embeddings
    chunked, _ = stub_reward()
    chunked.prepare(dataset)
    torch.testing.assert_close(chunked.mined.image_embeddings, reward.mined.image_embeddings)
