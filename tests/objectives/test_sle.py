import math

import pytest
import torch

from rlcaption.generation.decoding import caption_token_mask, sample_token_log_probs
from rlcaption.metrics.diversity import pairwise_caption_distances
from rlcaption.objectives import policy_gradient_loss, sequence_level_exploration_loss
from rlcaption.objectives.sle import sequence_level_exploration_advantages
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import make_show_tell

IMAGE_SIZE = 48
NEG_INF = float("-inf")

# ---------------------------------------------------------------- the loss of eqs. 15-16 on fixed numbers

# One image, s = 3 samples of 2, 3 and 1 tokens (the third padded with a -inf log-probability).
LOG_PROBS = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -1.0], [-3.0, NEG_INF, NEG_INF]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
REWARDS = torch.tensor([1.0, 0.5, 0.2], dtype=torch.float64)
GREEDY_REWARDS = torch.tensor([0.6], dtype=torch.float64)
# d(y_j, y_k), not symmetric; the diagonal must be ignored (a constant diagonal would cancel out, so it varies)
DISTANCES = torch.tensor([[[9.0, 0.2, 0.4], [0.4, 5.0, 0.6], [0.6, 0.8, 7.0]]], dtype=torch.float64)


def test_loss_matches_a_hand_computation_of_eqs_15_16():
    # precision: Δ - b_p with b_p = 0.6 -> [0.4, -0.1, -0.4]
    # diversity: b_d = (0.2 + 0.4 + 0.4 + 0.6 + 0.6 + 0.8) / 6 = 0.5 over the 6 ordered pairs of distinct samples;
    # A_j = (1 / s) Σ_{k≠j} (d_jk + d_kj - 2 b_d):
    #   j=0: ((0.2 + 0.4) + (0.4 + 0.6) - 2) / 3 = -0.4 / 3
    #   j=1: ((0.4 + 0.2) + (0.6 + 0.8) - 2) / 3 = 0.0
    #   j=2: ((0.6 + 0.4) + (0.8 + 0.6) - 2) / 3 = 0.4 / 3
    # α = 0.75: A = 0.75 * [0.4, -0.1, -0.4] + 0.25 * [-0.4, 0, 0.4] / 3 = [0.8, -0.225, -0.8] / 3
    # log p(y_j) = [-3, -2, -3]; eq. 15: (1/3) Σ_j -A_j log p(y_j) = (2.4 - 0.45 - 2.4) / 9 = -0.05
    advantages, precision, diversity = sequence_level_exploration_advantages(
        REWARDS, GREEDY_REWARDS, DISTANCES, alpha=0.75
    )
    assert precision.tolist() == pytest.approx([0.4, -0.1, -0.4])
    assert diversity.tolist() == pytest.approx([-0.4 / 3, 0.0, 0.4 / 3])
    assert advantages.tolist() == pytest.approx([0.8 / 3, -0.075, -0.8 / 3])

    log_probs = LOG_PROBS.clone().requires_grad_(True)
    loss = sequence_level_exploration_loss(
        log_probs, MASK, REWARDS, GREEDY_REWARDS, DISTANCES, alpha=0.75, normalization="sequence"
    )
    assert loss.item() == pytest.approx(-0.05)
    loss.backward()
    # d loss / d log p(token) = -A_j / s on the caption's tokens, 0 on padding
    expected_gradient = torch.tensor([[-0.8 / 3, -0.8 / 3, 0.0], [0.075, 0.075, 0.075], [0.8 / 3, 0.0, 0.0]]) / 3
    assert torch.allclose(log_probs.grad, expected_gradient.double())

    token_loss = sequence_level_exploration_loss(
        LOG_PROBS, MASK, REWARDS, GREEDY_REWARDS, DISTANCES, alpha=0.75, normalization="token"
    )
    assert token_loss.item() == pytest.approx(-0.15 / 6)  # the same sum over the 6 tokens


def test_diversity_advantage_is_the_papers_eq_16_for_a_symmetric_distance():
    # For a symmetric d with d(y, y) = 0, our estimate is eq. 16 literally ((2/s) Σ_k over all k, b_d the mean over
    # all s² pairs); every image is treated on its own.
    generator = torch.Generator().manual_seed(0)
    num_images, s = 2, 5
    upper = torch.rand(num_images, s, s, generator=generator, dtype=torch.float64).triu(diagonal=1)
    distances = upper + upper.transpose(1, 2)  # symmetric, zero diagonal
    _, _, diversity = sequence_level_exploration_advantages(
        torch.zeros(num_images * s, dtype=torch.float64), torch.zeros(num_images, dtype=torch.float64), distances, 0.0
    )
    for image in range(num_images):
        d = distances[image]
        paper_baseline = d.sum() / s**2
        paper = torch.stack([(2 / s) * (d[j] - paper_baseline).sum() for j in range(s)])
        ours = diversity[image * s : (image + 1) * s]
        assert torch.allclose(ours, paper)
        assert ours.sum().item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("normalization", ["sequence", "token"])
def test_alpha_one_is_the_scst_greedy_baseline_loss(normalization):
    huge_distances = DISTANCES * 1e3  # the diversity term must vanish whatever the distances
    loss = sequence_level_exploration_loss(
        LOG_PROBS, MASK, REWARDS, GREEDY_REWARDS, huge_distances, alpha=1.0, normalization=normalization
    )
    scst = policy_gradient_loss(LOG_PROBS, MASK, REWARDS - GREEDY_REWARDS.repeat(3), normalization)
    assert loss.item() == pytest.approx(scst.item(), abs=1e-12)


def test_advantages_reject_inconsistent_shapes_and_alpha():
    with pytest.raises(ValueError, match=r"s >= 2 samples per image, got \(1, 1, 1\)"):
        sequence_level_exploration_advantages(REWARDS[:1], GREEDY_REWARDS, DISTANCES[:, :1, :1], 0.5)
    with pytest.raises(ValueError, match=r"rewards of shape \(3,\)"):
        sequence_level_exploration_advantages(REWARDS[:2], GREEDY_REWARDS, DISTANCES, 0.5)
    with pytest.raises(ValueError, match="alpha must be in"):
        sequence_level_exploration_advantages(REWARDS, GREEDY_REWARDS, DISTANCES, 1.5)


# ---------------------------------------------------------------- the objective in the trainer


def make_trainer(model, processor, dataset, output_dir, **overrides):
    settings = {
        "output_dir": str(output_dir),
        "use_cpu": True,
        "per_device_train_batch_size": 4,
        "max_steps": 3,
        "learning_rate": 1e-2,
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "max_caption_length": 10,
        "objective": "sle",
        "num_samples_per_image": 3,
        "reward_funcs": ["cider"],
        "seed": 0,
    }
    settings.update(overrides)
    return RLCaptionTrainer(
        model=model, args=RLCaptionConfig(**settings), processing_class=processor, train_dataset=dataset["train"]
    )


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


@pytest.mark.parametrize("distance", ["bleu", "edit"])
def test_trainer_runs_sle_and_updates_the_captioner(processor, shapes, tmp_path, distance):
    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    trainer = make_trainer(model, processor, shapes, tmp_path / "out", sle_distance=distance)
    trainer.train()
    changed = [name for name, parameter in model.named_parameters() if not torch.equal(before[name], parameter)]
    assert any(name.startswith("lstm") for name in changed)
    for key in ("loss_sle", "reward", "greedy", "precision_advantage_std", "diversity_advantage_std"):
        values = logged(trainer, key)
        assert len(values) == 3 and all(math.isfinite(value) for value in values), key
    distances = logged(trainer, "pairwise_distance")
    assert len(distances) == 3 and all(0.0 < value <= 1.0 for value in distances)


def test_sle_with_alpha_one_computes_the_scst_loss(processor, shapes, tmp_path):
    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    losses = {}
    for objective, overrides in (("scst", {"baseline": "greedy"}), ("sle", {"sle_alpha": 1.0})):
        trainer = make_trainer(model, processor, shapes, tmp_path / objective, objective=objective, **overrides)
        batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
        torch.manual_seed(0)  # the same samples for both objectives
        losses[objective] = trainer.objective.compute_loss(model, batch).item()
    assert losses["sle"] == pytest.approx(losses["scst"], rel=1e-6)
    assert losses["sle"] != 0.0


@pytest.mark.parametrize("distance", ["bleu", "edit"])
def test_sle_with_alpha_zero_weighs_each_sample_by_its_distances_to_the_same_images_samples(
    processor, shapes, tmp_path, distance
):
    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    # sampling among the 2 likeliest words, so that an untrained model's samples share 3- and 4-grams
    trainer = make_trainer(model, processor, shapes, tmp_path, sle_alpha=0.0, sle_distance=distance, top_k=2)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    torch.manual_seed(0)
    loss = trainer.objective.compute_loss(model, batch)

    # the same samples again, their distances grouped by image, by hand
    s, batch_size = 3, len(batch["references"])
    torch.manual_seed(0)
    samples = trainer.sample_captions({"pixel_values": batch["pixel_values"]}, num_return_sequences=s)
    distances = torch.stack(
        [
            torch.as_tensor(pairwise_caption_distances(samples.texts[i * s : (i + 1) * s], distance, normalize=True))
            for i in range(batch_size)
        ]
    ).float()
    assert len(set(samples.texts)) > batch_size  # samples differ, so the grouping matters
    assert distances[:, ~torch.eye(s, dtype=torch.bool)].min() < 1.0  # some samples share n-grams
    image_index = torch.arange(batch_size).repeat_interleave(s)
    log_probs = sample_token_log_probs(model, {"pixel_values": batch["pixel_values"]}, samples.sequences, image_index)
    mask = caption_token_mask(samples.sequences, trainer.eos_token_id)
    expected = sequence_level_exploration_loss(
        log_probs, mask, torch.zeros(batch_size * s), torch.zeros(batch_size), distances, 0.0, "token"
    )
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert expected.item() != 0.0


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sle_alpha": -0.1}, r"sle_alpha must be in \[0, 1\]"),
        ({"sle_alpha": 1.5}, r"sle_alpha must be in \[0, 1\]"),
        ({"sle_distance": "cosine"}, r"sle_distance='cosine' is not one of \('bleu', 'edit'\)"),
        ({"num_samples_per_image": 1}, "needs num_samples_per_image >= 2, got 1"),
        ({"objective": "scst", "entropy_bonus_weight": -1e-2}, "entropy_bonus_weight must be >= 0"),
    ],
)
def test_config_rejects_invalid_sle_settings(tmp_path, overrides, message):
    settings = {"output_dir": str(tmp_path), "use_cpu": True, "objective": "sle", **overrides}
    with pytest.raises(ValueError, match=message):
        RLCaptionConfig(**settings)


def test_sle_takes_no_option_of_its_sll_baselines(tmp_path):
    # the SLL baselines are `scst` runs: their options are SCST's, which SLE never reads
    for option, value in (("entropy_bonus_weight", 1e-2), ("baseline", "greedy")):
        with pytest.raises(TypeError, match=f"SLEConfig has no option '{option}'.*SCSTConfig"):
            RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, objective="sle", **{option: value})


def test_config_defaults_are_the_papers(tmp_path):
    config = RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, objective="sle")
    assert (config.sle_alpha, config.sle_distance, config.num_samples_per_image) == (0.75, "bleu", 5)
    # one sample per image is fine for objectives that do not compare samples
    RLCaptionConfig(
        output_dir=str(tmp_path), use_cpu=True, objective="scst", num_samples_per_image=1, baseline="greedy"
    )
