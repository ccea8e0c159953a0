"""The clip_score reward: equal to CLIP-S per caption, images from the trainer's columns, embedding cache."""

import datasets
import numpy as np
import pytest
import torch

from rlcaption.metrics import clip_score
from rlcaption.rewards import ClipScoreReward, RewardMix, get_reward, reward_reads_images
from rlcaption.rewards.clip_rewards import pixel_values_to_images
from tiny_clips import (
    CAPTIONS,
    StubCLIP,
    StubProcessor,
    indexed_images,
    make_processor,
    make_shapes_clip,
    random_images,
)


@pytest.fixture(scope="module")
def clip():
    processor = make_processor(image_size=16)
    return make_shapes_clip(processor), processor


@pytest.fixture(scope="module")
def saved_clip(tmp_path_factory, clip):
    folder = tmp_path_factory.mktemp("tiny-clip")
    clip[0].save_pretrained(folder)
    clip[1].save_pretrained(folder)
    return folder


def captioner_pixel_values(images, image_size=16):
    """What RLCaptionTrainer passes: the images as prepared by a captioner's CaptionProcessor (mean = std = 0.5)."""
    return make_processor(image_size=image_size)(images=images)["pixel_values"]


def test_reward_equals_the_metric_per_caption(clip, saved_clip):
    images = random_images(3)
    # two completions per image, as an RL objective samples them
    completions = ["a red circle", "a blue square", "two shapes", "a red star", "a green circle", "a red circle"]
    rows = [0, 0, 1, 1, 2, 2]
    reward = get_reward("clip_score", model=saved_clip)
    values = reward(
        completions=completions,
        references=[CAPTIONS] * 6,
        pixel_values=captioner_pixel_values(images)[rows],
        image_id=[10 + row for row in rows],
    )
    _, expected = clip_score([images[row] for row in rows], completions, model=clip)
    np.testing.assert_allclose(values, expected, atol=1e-6)
    assert reward.__name__ == "clip_score" and len(set(np.round(values, 6))) > 1


def test_pixel_values_from_a_captioner_of_another_size_are_resized_by_the_clips_processor(clip):
    images = random_images(2, side=24)
    pixel_values = captioner_pixel_values(images, image_size=24)
    assert pixel_values.shape[-1] == 24
    reward = ClipScoreReward(clip)
    values = reward(completions=CAPTIONS[:2], references=[CAPTIONS] * 2, pixel_values=pixel_values)
    _, expected = clip_score(images, CAPTIONS[:2], model=clip)  # the CLIP's processor resizes 24 -> 16 pixels
    np.testing.assert_allclose(values, expected, atol=1e-6)


def test_pixel_values_round_trip_to_the_original_uint8_images():
    images = random_images(3, side=8)
    recovered = pixel_values_to_images(captioner_pixel_values(images, image_size=8))
    for original, back in zip(images, recovered, strict=True):
        np.testing.assert_array_equal(back, original)
    with pytest.raises(ValueError, match="one value per channel"):
        pixel_values_to_images(np.zeros((1, 3, 2, 2)), pixel_mean=(0.5,), pixel_std=(0.5,))


def test_an_image_column_works_as_trl_passes_it(clip):
    images = random_images(2)
    values = ClipScoreReward(clip)(completions=CAPTIONS[:2], references=[CAPTIONS] * 2, image=images)
    np.testing.assert_allclose(values, clip_score(images, CAPTIONS[:2], model=clip)[1], atol=1e-6)


def test_an_undecoded_image_column_is_decoded_for_the_images_not_yet_embedded(clip):
    """Beside precomputed features, recipes keep the training images undecoded (`{"bytes", "path"}`)."""
    images = random_images(2)
    undecoded = [datasets.Image().encode_example(image) for image in images]
    reward = ClipScoreReward(clip)
    values = reward(completions=CAPTIONS[:2], references=[CAPTIONS] * 2, image=undecoded, image_id=[0, 1])
    np.testing.assert_allclose(values, clip_score(images, CAPTIONS[:2], model=clip)[1], atol=1e-6)
    assert reward_reads_images("clip_score") and reward_reads_images("clip_contrastive")
    assert not reward_reads_images("cider") and not reward_reads_images(lambda **columns: [0.0])


def test_each_image_is_embedded_once_per_call_and_cached_by_image_id():
    stub = StubCLIP([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], {"left": [1.0, 0.0], "up": [0.0, 2.0]})
    reward = ClipScoreReward((stub, StubProcessor(stub.texts)), max_cached_images=2)
    images = indexed_images(3)
    rows = [0, 0, 0, 1, 1, 1]
    values = reward(completions=["left", "up"] * 3, references=None, image=[images[r] for r in rows], image_id=rows)
    assert stub.image_calls == 2  # two distinct images among six completions
    assert values == pytest.approx([2.5, 0.0, 2.5, 2.5, 0.0, 2.5])
    reward(completions=["up", "left"], references=None, image=[images[1], images[0]], image_id=[1, 0])
    assert stub.image_calls == 2  # both cached
    reward(completions=["up"], references=None, image=[images[2]], image_id=[2])
    assert stub.image_calls == 3 and list(reward._image_cache) == [0, 2]  # image 1 was least recently used
    # without ids nothing is cached across calls
    reward(completions=["up"], references=None, image=[images[2]])
    assert stub.image_calls == 4


def test_score_groups_equals_the_call_on_flattened_rows(clip):
    images = random_images(3)
    # captions the random CLIP scores above 0 for these images, and differently for each image
    groups = [[CAPTIONS[1], CAPTIONS[2]], [CAPTIONS[2], CAPTIONS[1], CAPTIONS[3]], [CAPTIONS[2]]]
    rows = [0, 0, 1, 1, 1, 2]  # each completion's image
    pixel_values = captioner_pixel_values(images)  # (3, 3, 16, 16): one row per image
    grouped = ClipScoreReward(clip).score_groups(
        completions=groups, references=[CAPTIONS] * 3, pixel_values=pixel_values, image_id=[10, 11, 12]
    )
    flat = ClipScoreReward(clip)(
        completions=[caption for group in groups for caption in group],
        references=[CAPTIONS] * 6,
        pixel_values=pixel_values[rows],
        image_id=[10 + row for row in rows],
    )
    assert [len(group) for group in grouped] == [2, 3, 1]
    np.testing.assert_allclose([value for group in grouped for value in group], flat, rtol=0, atol=1e-6)
    assert len(set(np.round(flat, 6))) > 3


def test_score_groups_embeds_each_image_once_and_a_mix_passes_the_images_once():
    stub = StubCLIP([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], {"left": [1.0, 0.0], "up": [0.0, 2.0]})
    reward = ClipScoreReward((stub, StubProcessor(stub.texts)))
    images = indexed_images(3)
    groups = [["left", "up", "left"], ["up"], ["up", "left"]]
    values = reward.score_groups(completions=groups, references=None, image=images)
    assert stub.image_calls == 3  # no image_id: nothing cached, each image embedded once
    assert values == [pytest.approx([2.5, 0.0, 2.5]), pytest.approx([2.5]), pytest.approx([2.5 / 2**0.5] * 2)]
    total, components = RewardMix([reward], weights=[2.0]).score_groups(
        completions=groups, references=None, image=images, image_id=[0, 1, 2]
    )
    assert stub.image_calls == 6
    np.testing.assert_allclose(total, 2.0 * components["clip_score"])
    np.testing.assert_allclose(components["clip_score"], [value for group in values for value in group])
    with pytest.raises(ValueError, match="image holds 2 images for 3 images; pass one per image"):
        reward.score_groups(completions=groups, references=None, image=images[:2])


def test_reward_mixes_with_other_rewards_and_names_itself(clip):
    mix = RewardMix([ClipScoreReward(clip), "bleu"], weights=[1.0, 0.5])
    images = random_images(2)
    total, components = mix.score(
        completions=CAPTIONS[:2], references=[[CAPTIONS[0]], [CAPTIONS[1]]], image=images, image_id=[0, 1]
    )
    assert set(components) == {"clip_score", "bleu_4"}
    np.testing.assert_allclose(total, np.array(components["clip_score"]) + 0.5 * np.array(components["bleu_4"]))


def test_missing_images_or_clip_are_errors_that_say_what_to_pass(clip):
    with pytest.raises(ValueError, match="needs a CLIP"):
        get_reward("clip_score")
    with pytest.raises(ValueError, match="pixel_values"):
        ClipScoreReward(clip)(completions=["a red circle"], references=[["a red circle"]], image_id=[0])
    with pytest.raises(ValueError, match="2 images for 1 completions"):
        ClipScoreReward(clip)(completions=["a"], references=[["a"]], pixel_values=torch.zeros(2, 3, 16, 16))


def test_scst_training_with_the_clip_reward_gets_the_captioners_pixels(tmp_path):
    from rlcaption.data import load_shapes
    from rlcaption.processing import CaptionProcessor
    from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
    from tiny_captioners import make_show_tell

    shapes = load_shapes(8, 4, 4, image_size=48, seed=3, cache_dir=tmp_path / "shapes")
    captioner_processor = CaptionProcessor.from_captions(shapes["train"]["captions"], image_size=48)
    clip_processor = CaptionProcessor.from_captions(shapes["train"]["captions"], image_size=16)
    reward = ClipScoreReward((make_shapes_clip(clip_processor), clip_processor))
    seen, seen_per_completion = [], []

    class RecordingReward:
        __name__ = "clip_score"

        def score_groups(self, *, completions, references, **image_columns):
            seen.append((completions, image_columns))
            return reward.score_groups(completions=completions, references=references, **image_columns)

    def pixels_per_completion(*, completions, pixel_values, **columns):
        seen_per_completion.append(pixel_values)
        return [0.0] * len(completions)

    args = RLCaptionConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, objective="scst", per_device_train_batch_size=4, max_steps=1,
        num_samples_per_image=2, max_caption_length=8, save_strategy="no", logging_steps=1, disable_tqdm=True,
        report_to="none",
    )  # fmt: skip
    trainer = RLCaptionTrainer(
        model=make_show_tell(captioner_processor, 48),
        args=args,
        processing_class=captioner_processor,
        train_dataset=shapes["train"],
        reward_funcs=[RecordingReward(), pixels_per_completion],
    )
    trainer.train()
    # the set-level call gets the 4 images of the batch once each, with their 2 samples grouped
    completions, image_columns = seen[0]
    assert [len(group) for group in completions] == [2, 2, 2, 2]
    assert image_columns["pixel_values"].shape == (4, 3, 48, 48)
    assert len(image_columns["image_id"]) == 4
    # a per-caption reward that names the pixels gets one row per caption, its image's
    assert seen_per_completion[0].shape == (8, 3, 48, 48)
    torch.testing.assert_close(
        seen_per_completion[0], image_columns["pixel_values"].repeat_interleave(2, dim=0), rtol=0, atol=0
    )
    rewards = [
        entry["reward/clip_score/mean"] for entry in trainer.state.log_history if "reward/clip_score/mean" in entry
    ]
    assert rewards and 0.0 <= rewards[0] <= 2.5
    assert 0 < len(reward._image_cache) <= 4  # one embedding per image of the batch
