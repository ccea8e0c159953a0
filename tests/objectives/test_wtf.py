"""The wtf objective (Chaffin et al. 2024): eq. 3 by hand for every variant, the discriminator's phases, training with
ours and a transformers captioner, and a resume in the discriminator's pretraining phase."""

import math
import shutil

import pytest
import torch
from transformers import TrainerCallback

from rlcaption.data import load_shapes
from rlcaption.objectives import wtf as wtf_module
from rlcaption.objectives.wtf import (
    MINED_NEIGHBOURS_NAME,
    WTF_VARIANTS,
    Discriminator,
    WTFRewardParts,
    wtf_loss,
    wtf_rewards,
)
from rlcaption.processing import CaptionProcessor
from rlcaption.rewards import contrastive as contrastive_module
from rlcaption.rewards.contrastive import ContrastiveRewards, decoupled_contrastive_rewards
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import make_foreign_captioner, make_show_tell
from tiny_clips import save_reward_clip

IMAGE_SIZE = 48
MAX_LENGTH = 8


# ---------------------------------------------------------------- eq. 3 by hand

ALPHA = 0.9
BEAM = {"similarity": [0.5, 0.4], "i2t": [0.1, -0.2], "t2i": [0.3, 0.05]}
GROUND_TRUTH = {"similarity": [0.45, 0.3], "i2t": [0.2, 0.0], "t2i": [-0.1, 0.15]}
GREEDY_SIMILARITY = [0.3, 0.5]
BEAM_P_D = [0.2, 0.6]
GROUND_TRUTH_P_D = [0.9, 0.7]
# log p of each token; the masks end each caption (a -inf after the end must not reach the loss)
BEAM_LOG_PROBS = [[-1.0, -2.0, -math.inf], [-0.1, -0.2, -0.3]]
BEAM_MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
GROUND_TRUTH_LOG_PROBS = [[-0.5, -0.5, -1.0], [-2.0, -1.0, -9.0]]
GROUND_TRUTH_MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
BEAM_SUMS = [-1.0 - 2.0, -0.1 - 0.2 - 0.3]  # Σ_t log p(x_bs)
GROUND_TRUTH_SUMS = [-0.5 - 0.5 - 1.0, -2.0 - 1.0]  # Σ_t log p(x_gt)
NUM_TOKENS = {"beam": 2 + 3, "ground_truth": 3 + 2}


def reward_parts():
    tensor = lambda values: torch.tensor(values, dtype=torch.float64)  # noqa: E731
    return WTFRewardParts(
        beam=ContrastiveRewards(**{name: tensor(values) for name, values in BEAM.items()}),
        ground_truth=ContrastiveRewards(**{name: tensor(values) for name, values in GROUND_TRUTH.items()}),
        greedy_similarity=tensor(GREEDY_SIMILARITY),
        beam_discriminator=tensor(BEAM_P_D),
        ground_truth_discriminator=tensor(GROUND_TRUTH_P_D),
    )


def hand_rewards(variant):
    """(beam rewards, ground-truth rewards) of each image, written out from the paper's definitions."""
    a = ALPHA
    bicont_beam = [BEAM["i2t"][i] + BEAM["t2i"][i] for i in range(2)]
    bicont_gt = [GROUND_TRUTH["i2t"][i] + GROUND_TRUTH["t2i"][i] for i in range(2)]
    full_beam = [a * bicont_beam[i] + (1 - a) * BEAM_P_D[i] for i in range(2)]
    full_gt = [a * bicont_gt[i] + (1 - a) * GROUND_TRUTH_P_D[i] for i in range(2)]
    return {
        "wtf_rl": (full_beam, full_gt),
        "wtf": (None, full_gt),
        "rl": (full_beam, None),
        "rl_unidirectional": ([a * BEAM["i2t"][i] + (1 - a) * BEAM_P_D[i] for i in range(2)], None),
        "scst_discriminator": (
            [a * (BEAM["similarity"][i] - GREEDY_SIMILARITY[i]) + (1 - a) * BEAM_P_D[i] for i in range(2)],
            None,
        ),
        "tf": (None, [1.0, 1.0]),
    }[variant]


@pytest.mark.parametrize("normalization", ["sequence", "token"])
@pytest.mark.parametrize("variant", WTF_VARIANTS)
def test_loss_of_eq3_by_hand_for_every_variant(variant, normalization):
    beam_rewards, ground_truth_rewards = wtf_rewards(reward_parts(), variant, ALPHA)
    expected_beam, expected_ground_truth = hand_rewards(variant)
    for rewards, expected in ((beam_rewards, expected_beam), (ground_truth_rewards, expected_ground_truth)):
        assert (rewards is None) == (expected is None)
        if expected is not None:
            torch.testing.assert_close(rewards, torch.tensor(expected, dtype=torch.float64))

    beam_log_probs = torch.tensor(BEAM_LOG_PROBS, requires_grad=True)
    ground_truth_log_probs = torch.tensor(GROUND_TRUTH_LOG_PROBS, requires_grad=True)
    loss = wtf_loss(
        beam_log_probs, torch.tensor(BEAM_MASK), beam_rewards,
        ground_truth_log_probs, torch.tensor(GROUND_TRUTH_MASK), ground_truth_rewards,
        normalization,
    )  # fmt: skip
    # eq. 3 per image: −[r(x_bs) Σ_t log p(x_bs) + r(x_gt) Σ_t log p(x_gt)], over the variant's trajectories
    total, tokens = 0.0, 0
    if expected_beam is not None:
        total -= sum(reward * log_p for reward, log_p in zip(expected_beam, BEAM_SUMS, strict=True))
        tokens += NUM_TOKENS["beam"]
    if expected_ground_truth is not None:
        total -= sum(reward * log_p for reward, log_p in zip(expected_ground_truth, GROUND_TRUTH_SUMS, strict=True))
        tokens += NUM_TOKENS["ground_truth"]
    expected = total / (2 if normalization == "sequence" else tokens)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert math.isfinite(loss.item())
    loss.backward()
    # the gradient of a token's log-probability is −r / normaliser on the caption, 0 after its end or when unused
    if expected_beam is None:
        assert beam_log_probs.grad is None
    else:
        scale = 2 if normalization == "sequence" else tokens
        expected_grad = torch.tensor([[-r / scale] * 3 for r in expected_beam]) * torch.tensor(BEAM_MASK)
        torch.testing.assert_close(beam_log_probs.grad, expected_grad.float())


def test_loss_needs_a_trajectory():
    with pytest.raises(ValueError, match="needs the rewards"):
        wtf_loss(None, None, None, None, None, None, "token")
    with pytest.raises(ValueError, match="wtf_variant='gan'"):
        wtf_rewards(reward_parts(), "gan", ALPHA)


def test_discriminator_is_a_three_layer_mlp_reading_detached_embeddings():
    discriminator = Discriminator(embedding_size=8, hidden_size=16)
    assert [type(layer).__name__ for layer in discriminator.mlp].count("Linear") == 3
    embeddings = torch.randn(5, 8, requires_grad=True)
    logits = discriminator(embeddings)
    assert logits.shape == (5,)
    logits.sum().backward()
    assert embeddings.grad is None  # the CLIP's embeddings stay frozen


def test_an_image_text_discriminator_reads_the_image_beside_the_text():
    torch.manual_seed(0)
    discriminator = Discriminator(embedding_size=8, hidden_size=16, reads_image=True)
    assert discriminator.mlp[0].in_features == 16  # the image's embedding concatenated with the text's
    texts, images = torch.randn(5, 8), torch.randn(5, 8, requires_grad=True)
    logits = discriminator(texts, images)
    assert logits.shape == (5,)
    assert not torch.allclose(logits, discriminator(texts, images.flip(0)))
    logits.sum().backward()
    assert images.grad is None  # the image embeddings stay frozen too
    with pytest.raises(ValueError, match="reads the image and the text; got no image embeddings"):
        discriminator(texts)
    with pytest.raises(ValueError, match="reads the text only; got image embeddings"):
        Discriminator(embedding_size=8, hidden_size=16)(texts, images)


# ---------------------------------------------------------------- training with RLCaptionTrainer


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return load_shapes(
        num_train=16, num_validation=4, num_test=4, image_size=IMAGE_SIZE, seed=5,
        cache_dir=tmp_path_factory.mktemp("shapes_cache"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def train_captions(shapes):
    return [caption for captions in shapes["train"]["captions"] for caption in captions]


@pytest.fixture(scope="module")
def processor(train_captions):
    return CaptionProcessor.from_captions(train_captions, image_size=IMAGE_SIZE)


@pytest.fixture(scope="module")
def reward_clip(tmp_path_factory, train_captions):
    """A tiny random shapes CLIP saved as a folder, with its own processor, as `reward_clip` names one."""
    return save_reward_clip(tmp_path_factory.mktemp("reward-clip"), train_captions)


def make_trainer(model, processor, dataset, output_dir, reward_clip, **overrides):
    settings = {
        "output_dir": str(output_dir),
        "use_cpu": True,
        "per_device_train_batch_size": 4,
        "max_steps": 3,
        "learning_rate": 1e-2,
        "discriminator_learning_rate": 1e-2,
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "max_caption_length": MAX_LENGTH,
        "objective": "wtf",
        "reward_clip": reward_clip,
        "wtf_num_beams": 2,
        "num_mined_neighbours": 2,
        "seed": 0,
    }
    settings.update(overrides)
    return RLCaptionTrainer(
        model=model, args=RLCaptionConfig(**settings), processing_class=processor, train_dataset=dataset["train"]
    )


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def snapshot(trainer):
    """The captioner's weights (flat) and the discriminator's, copied."""
    return (
        torch.cat([parameter.detach().flatten() for parameter in trainer.model.parameters()]).clone(),
        {name: tensor.clone() for name, tensor in trainer.auxiliary_state_dict().items()},
    )


class Snapshots(TrainerCallback):
    """The weights when training begins (after a resume has loaded its checkpoint) and after every step."""

    def __init__(self, trainer):
        self.trainer, self.states = trainer, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.states.append(snapshot(self.trainer))

    def on_step_end(self, args, state, control, **kwargs):
        self.states.append(snapshot(self.trainer))


def discriminator_changed(before, after):
    return all(not torch.equal(before[1][name], after[1][name]) for name in before[1])


def test_discriminator_pretraining_keeps_the_policy_fixed_then_both_learn(processor, shapes, reward_clip, tmp_path):
    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    trainer = make_trainer(model, processor, shapes, tmp_path, reward_clip, discriminator_pretraining_steps=2)
    snapshots = Snapshots(trainer)
    trainer.add_callback(snapshots)
    trainer.train()
    states = snapshots.states
    for step in (1, 2):  # pretraining: D learns, the policy is fixed
        assert torch.equal(states[step][0], states[step - 1][0]), step
        assert discriminator_changed(states[step - 1], states[step]), step
    assert not torch.equal(states[3][0], states[2][0])  # then both
    assert discriminator_changed(states[2], states[3])
    assert logged(trainer, "objective_phase") == [0.0, 0.0, 1.0]
    assert len(logged(trainer, "discriminator_accuracy")) == 3
    assert len(logged(trainer, "reward/beam")) == 1  # rewards only once the policy trains
    # D learns to call the ground truth human-written and the beam-search captions not
    gaps = [
        human - generated
        for human, generated in zip(
            logged(trainer, "discriminator/ground_truth_probability"),
            logged(trainer, "discriminator/beam_probability"),
            strict=True,
        )
    ]
    assert gaps[-1] > gaps[0] and gaps[-1] > 0.3


@pytest.mark.parametrize("captioner", ["show_tell", "vit_gpt2"])
def test_wtf_trains_ours_and_a_transformers_captioner(
    captioner, processor, train_captions, shapes, reward_clip, tmp_path
):
    if captioner == "show_tell":
        model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    else:  # ViT + GPT-2 with its own TrOCRProcessor and byte-level BPE tokenizer
        model, processor = make_foreign_captioner(captioner, train_captions, IMAGE_SIZE)
    trainer = make_trainer(model, processor, shapes, tmp_path, reward_clip, max_steps=2)
    snapshots = Snapshots(trainer)
    trainer.add_callback(snapshots)
    trainer.train()
    start, end = snapshots.states[0], snapshots.states[-1]
    assert not torch.equal(start[0], end[0])
    assert discriminator_changed(start, end)
    for key in (
        "loss", "policy_loss", "discriminator_loss", "discriminator_accuracy", "reward/beam", "reward/ground_truth",
        "reward/beam/i2t", "reward/beam/t2i", "reward/ground_truth/t2i", "similarity/greedy", "beam_length",
    ):  # fmt: skip
        values = logged(trainer, key)
        assert len(values) == 2 and all(math.isfinite(value) for value in values), key
    assert (tmp_path / MINED_NEIGHBOURS_NAME).is_file()


@pytest.mark.parametrize("discriminator_input", ["text", "image_text"])
def test_the_discriminator_judges_a_caption_with_its_image_only_with_image_text(
    discriminator_input, processor, shapes, reward_clip, tmp_path
):
    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    trainer = make_trainer(model, processor, shapes, tmp_path, reward_clip, discriminator_input=discriminator_input)
    objective = trainer.objective
    images = shapes["train"][:4]
    texts = objective.reward.embed_texts([captions[0] for captions in images["captions"]])
    pixel_values = processor(images=images["image"], return_tensors="pt")["pixel_values"]
    own_images = {"image_id": images["image_id"], "pixel_values": pixel_values}
    # the same captions, each paired with another image of the batch
    other_images = {"image_id": images["image_id"][::-1], "pixel_values": pixel_values.flip(0)}
    with torch.no_grad():
        own = objective.discriminator_logits(texts, range(4), own_images, 4)
        other = objective.discriminator_logits(texts, range(4), other_images, 4)
    assert own.shape == (4,)
    assert torch.allclose(own, other) == (discriminator_input == "text")


def test_rewards_contrast_beam_greedy_and_ground_truth_captions_with_the_batch_images_and_neighbours(
    processor, shapes, reward_clip, tmp_path, monkeypatch
):
    trainer = make_trainer(make_show_tell(processor, IMAGE_SIZE, seed=0), processor, shapes, tmp_path, reward_clip)
    objective = trainer.objective
    seen = {}

    def recording(name, function):
        def wrapper(*args, **kwargs):
            seen[name] = function(*args, **kwargs)
            return seen[name]

        return wrapper

    for name in ("beam_search_captions", "greedy_captions"):
        monkeypatch.setattr(trainer, name, recording(name, getattr(trainer, name)))
    monkeypatch.setattr(objective, "_ground_truth", recording("ground_truth", objective._ground_truth))
    rewards = wtf_module.wtf_rewards

    def recording_rewards(parts, *args):
        seen["parts"] = parts
        return rewards(parts, *args)

    monkeypatch.setattr(wtf_module, "wtf_rewards", recording_rewards)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    trainer.compute_loss(trainer.model, batch)

    # the ground truth is one of each image's references, decoded as generated captions are
    ground_truth_texts = seen["ground_truth"][2]
    for image, text in enumerate(ground_truth_texts):
        rows = batch["caption_input_ids"][batch["caption_image_index"] == image]
        assert text in [decoded.strip() for decoded in processor.batch_decode(rows, skip_special_tokens=True)]
    # T = beam-search, greedy and ground-truth captions of every image; I = batch images + mined neighbours
    reward = objective.reward
    texts = [*seen["beam_search_captions"].texts, *seen["greedy_captions"].texts, *ground_truth_texts]
    images = reward.image_set({"image_id": batch["image_id"]}, 4)
    assert images.size(0) > 4  # the neighbours are there
    expected = decoupled_contrastive_rewards(reward.embed_texts(texts), images, [0, 1, 2, 3] * 3, reward.temperature)
    parts = seen["parts"]
    torch.testing.assert_close(parts.beam.i2t, expected.i2t[:4])
    torch.testing.assert_close(parts.beam.t2i, expected.t2i[:4])
    torch.testing.assert_close(parts.greedy_similarity, expected.similarity[4:8])
    torch.testing.assert_close(parts.ground_truth.i2t, expected.i2t[8:])
    torch.testing.assert_close(parts.ground_truth.t2i, expected.t2i[8:])
    # p_D is the discriminator's probability that each caption is human-written
    with torch.no_grad():
        p_d = torch.sigmoid(objective.discriminator(reward.embed_texts(texts))).double()
    torch.testing.assert_close(parts.beam_discriminator, p_d[:4])
    torch.testing.assert_close(parts.ground_truth_discriminator, p_d[8:])


def test_variants_train_only_their_trajectories(processor, shapes, reward_clip, tmp_path):
    # `wtf` weighs only the ground truth: the beam-search caption's reward is never used (nor logged)
    trainer = make_trainer(
        make_show_tell(processor, IMAGE_SIZE), processor, shapes, tmp_path, reward_clip, max_steps=1,
        wtf_variant="wtf",
    )  # fmt: skip
    trainer.train()
    assert logged(trainer, "reward/beam") == [] and len(logged(trainer, "reward/ground_truth")) == 1
    # `tf` weighs every ground-truth caption by 1
    trainer = make_trainer(
        make_show_tell(processor, IMAGE_SIZE), processor, shapes, tmp_path, reward_clip, max_steps=1,
        wtf_variant="tf",
    )  # fmt: skip
    trainer.train()
    assert logged(trainer, "reward/ground_truth") == [1.0]


@pytest.mark.parametrize(
    ("killed_after", "pretraining_steps", "discriminator_input"),
    [(1, 2, "text"), (2, 1, "text"), (2, 1, "image_text")],
    ids=["in-discriminator-pretraining", "in-rl", "in-rl-image-text-discriminator"],
)
def test_a_killed_run_resumes_in_its_phase_reading_the_mined_neighbours(
    processor, shapes, reward_clip, tmp_path, monkeypatch, killed_after, pretraining_steps, discriminator_input
):
    settings = {
        "max_steps": 3, "discriminator_pretraining_steps": pretraining_steps, "save_strategy": "steps",
        "save_steps": 1, "discriminator_input": discriminator_input,
    }  # fmt: skip
    straight = make_trainer(
        make_show_tell(processor, IMAGE_SIZE, seed=0), processor, shapes, tmp_path / "straight", reward_clip,
        **settings,
    )  # fmt: skip
    straight.train()
    expected_model = {name: tensor.clone() for name, tensor in straight.model.state_dict().items()}
    expected_discriminator = {name: tensor.clone() for name, tensor in straight.auxiliary_state_dict().items()}

    # the run killed after step `killed_after`: its output directory holds that checkpoint and the mined neighbours
    killed = tmp_path / "killed"
    killed.mkdir()
    checkpoint = f"checkpoint-{killed_after}"
    shutil.copytree(tmp_path / "straight" / checkpoint, killed / checkpoint)
    shutil.copy(tmp_path / "straight" / MINED_NEIGHBOURS_NAME, killed / MINED_NEIGHBOURS_NAME)
    calls = []

    def counted(function):
        def wrapper(*args, **kwargs):
            calls.append(function.__name__)
            return function(*args, **kwargs)

        return wrapper

    for name in ("embed_images", "mine_neighbours"):
        monkeypatch.setattr(contrastive_module, name, counted(getattr(contrastive_module, name)))
    resumed = make_trainer(
        make_show_tell(processor, IMAGE_SIZE, seed=9), processor, shapes, killed, reward_clip, **settings
    )
    snapshots = Snapshots(resumed)
    resumed.add_callback(snapshots)
    resumed.train(resume_from_checkpoint=True)
    assert calls == []  # no training image embedded again, nothing mined again

    # the checkpoint's log entries, then the resumed run's: every step in the phase it belongs to
    history = resumed.state.log_history
    assert [(entry["step"], entry["objective_phase"]) for entry in history if "objective_phase" in entry] == [
        (step, float(step > pretraining_steps)) for step in (1, 2, 3)
    ]
    # the steps after the resume: D pretraining keeps the policy fixed, the RL phase moves it; D learns in both
    states = snapshots.states
    for before, after, step in zip(states[:-1], states[1:], range(killed_after + 1, 4), strict=True):
        assert torch.equal(after[0], before[0]) == (step <= pretraining_steps), step
        assert discriminator_changed(before, after), step
    # and the resumed run ends where the uninterrupted one did
    for name, tensor in resumed.model.state_dict().items():
        torch.testing.assert_close(tensor, expected_model[name], rtol=0, atol=0, msg=name)
    for name, tensor in resumed.auxiliary_state_dict().items():
        torch.testing.assert_close(tensor, expected_discriminator[name], rtol=0, atol=0, msg=name)


def test_config_validates_the_wtf_fields(tmp_path):
    with pytest.raises(ValueError, match="objective='wtf' rewards captions with a CLIP: set reward_clip"):
        RLCaptionConfig(objective="wtf", output_dir=str(tmp_path), use_cpu=True)
    common = {"output_dir": str(tmp_path), "use_cpu": True, "objective": "wtf", "reward_clip": "clip"}
    with pytest.raises(ValueError, match="wtf_variant='gan' is not one of"):
        RLCaptionConfig(wtf_variant="gan", **common)
    with pytest.raises(ValueError, match="wtf_alpha"):
        RLCaptionConfig(wtf_alpha=1.5, **common)
    with pytest.raises(ValueError, match="contrastive_temperature must be > 0"):
        RLCaptionConfig(contrastive_temperature=0.0, **common)
    for field in ("num_mined_neighbours", "discriminator_pretraining_steps"):
        with pytest.raises(ValueError, match=f"{field} must be >= 0"):
            RLCaptionConfig(**{field: -1}, **common)
    for field in ("discriminator_hidden_size", "wtf_num_beams"):
        with pytest.raises(ValueError, match=f"{field} must be >= 1"):
            RLCaptionConfig(**{field: 0}, **common)
    with pytest.raises(ValueError, match="discriminator_learning_rate must be > 0"):
        RLCaptionConfig(discriminator_learning_rate=0.0, **common)
    with pytest.raises(ValueError, match="discriminator_input='image' is not one of"):
        RLCaptionConfig(discriminator_input="image", **common)


def test_the_ground_truth_is_drawn_among_each_images_own_references_and_a_missing_one_is_named(
    processor, shapes, reward_clip, tmp_path
):
    objective = make_trainer(
        make_show_tell(processor, IMAGE_SIZE, seed=0), processor, shapes, tmp_path, reward_clip
    ).objective
    captions = ["a red circle", "a blue square", "a green star", "a red star", "a small blue star", "a star"]
    encoded = processor(text=captions, return_tensors="pt", padding=True)
    inputs = {
        "caption_input_ids": encoded["input_ids"], "caption_attention_mask": encoded["attention_mask"],
        "caption_image_index": torch.tensor([0, 2, 1, 0, 2, 2]),  # references need not come image by image
    }  # fmt: skip
    drawn = [set() for _ in range(3)]
    for _ in range(60):
        for image, text in enumerate(objective._ground_truth(inputs, 3)[2]):
            drawn[image].add(text)
    assert drawn == [
        {"a red circle", "a red star"},
        {"a green star"},
        {"a blue square", "a small blue star", "a star"},
    ]
    with pytest.raises(ValueError, match="Image 3 of the batch has no tokenized reference"):
        objective._ground_truth(inputs, 4)
