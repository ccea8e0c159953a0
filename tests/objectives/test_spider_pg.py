import math
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from rlcaption.generation.decoding import caption_token_mask, generate_captions
from rlcaption.objectives import spider_pg as spider_pg_module
from rlcaption.objectives.spider_pg import (
    Rollouts,
    SpiderPGBaseline,
    monte_carlo_q_values,
    rollout_prefixes,
    sample_rollouts,
    sample_rollouts_per_prefix,
    spider_pg_losses,
)
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import make_show_tell, make_vision_encoder_decoder

IMAGE_SIZE = 48
MAX_LENGTH = 10
BOS, EOS, PAD = 1, 2, 0


@pytest.fixture(scope="module")
def pixel_values(shapes, processor):
    return processor(images=shapes["train"]["image"][:4], return_tensors="pt")["pixel_values"]


def sampled_captions(model, processor, pixel_values, num_paths=1, seed=0):
    torch.manual_seed(seed)
    generated = generate_captions(
        model, processor, {"pixel_values": pixel_values}, do_sample=True, top_k=0, top_p=1.0,
        num_return_sequences=num_paths, max_length=MAX_LENGTH + 1,
    )  # fmt: skip
    return generated.sequences, caption_token_mask(generated.sequences, EOS)


def decode(processor, sequences):
    return [text.strip() for text in processor.batch_decode(sequences, skip_special_tokens=True)]


def word_count_reward(texts):
    # a reward whose value depends on the whole caption, so Q differs from prefix to prefix
    return torch.tensor([1.0 + 0.1 * len(text.split()) + 0.5 * text.split().count("red") for text in texts])


# ---------------------------------------------------------------- prefixes and Q


def test_rollout_prefixes_cover_every_step_but_the_last():
    sequences = torch.tensor(
        [
            [BOS, 5, 6, EOS, PAD],  # 3 tokens: prefixes of length 1 and 2
            [BOS, EOS, PAD, PAD, PAD],  # ends at once: no rollout
            [BOS, 7, 8, 9, 10],  # cut at the maximum length: prefixes 1..3
        ]
    )
    caption_index, prefix_length = rollout_prefixes(caption_token_mask(sequences, EOS), num_rollouts=2)
    assert caption_index.tolist() == [0, 0, 0, 0, 2, 2, 2, 2, 2, 2]
    assert prefix_length.tolist() == [1, 1, 2, 2, 1, 1, 2, 2, 3, 3]


def test_q_values_average_the_rollouts_and_equal_the_reward_at_the_last_step():
    sequences = torch.tensor([[BOS, 5, 6, EOS], [BOS, 7, 8, 9]])
    mask = caption_token_mask(sequences, EOS)
    caption_index, prefix_length = rollout_prefixes(mask, num_rollouts=2)
    rollouts = Rollouts(torch.zeros(len(caption_index), 4, dtype=torch.long), caption_index, prefix_length)
    rollout_rewards = torch.tensor([1.0, 3.0, 0.0, 0.5, 2.0, 2.0, 4.0, 5.0])
    q_values = monte_carlo_q_values(mask, torch.tensor([0.25, 0.75]), rollouts, rollout_rewards, num_rollouts=2)
    # caption 0 (5 6 <eos>): Q(g_1) = (1 + 3) / 2, Q(g_2) = (0 + 0.5) / 2, its own reward at <eos>;
    # caption 1 (7 8 9, cut at the maximum length): (2 + 2) / 2, (4 + 5) / 2, its own reward at the last token
    expected = torch.tensor([[2.0, 0.25, 0.25], [2.0, 4.5, 0.75]])
    torch.testing.assert_close(q_values, expected)


# ---------------------------------------------------------------- rollouts


def test_token_sampler_follows_the_softmax_distribution():
    from rlcaption.objectives.spider_pg import _sample_from

    logits = torch.tensor([[2.0, 0.0, torch.finfo(torch.float32).min, 1.0, -1.0]])
    draws = 40_000
    tokens = _sample_from(logits.expand(draws, -1), torch.rand(draws, generator=torch.Generator().manual_seed(0)))
    frequencies = torch.bincount(tokens, minlength=5).float() / draws
    torch.testing.assert_close(frequencies, torch.softmax(logits[0], dim=-1), atol=0.01, rtol=0)
    assert frequencies[2] == 0  # a token of zero probability is never sampled


def test_rollout_draws_follow_the_policy_warpers_temperature_top_k_and_top_p():
    from rlcaption.objectives.spider_pg import _policy_warpers, _sample_from

    logits = torch.tensor([[2.0, 0.0, 1.5, 1.0, -1.0]])
    draws = 40_000
    uniforms = torch.rand(draws, generator=torch.Generator().manual_seed(1))
    hot = _sample_from(_policy_warpers(0.5, 0, 1.0)(None, logits.expand(draws, -1)), uniforms)
    torch.testing.assert_close(
        torch.bincount(hot, minlength=5).float() / draws, torch.softmax(logits[0] / 0.5, dim=-1), atol=0.01, rtol=0
    )
    top_two = _sample_from(_policy_warpers(1.0, 2, 1.0)(None, logits.expand(draws, -1)), uniforms)
    assert set(top_two.tolist()) == {0, 2}
    # softmax [0.43, 0.06, 0.26, 0.16, 0.02]: the nucleus of p = 0.6 is tokens 0 and 2
    nucleus = _sample_from(_policy_warpers(1.0, 0, 0.6)(None, logits.expand(draws, -1)), uniforms)
    assert set(nucleus.tolist()) == {0, 2}


@pytest.mark.parametrize(
    "sampling", [{}, {"temperature": 0.8, "top_k": 5, "top_p": 0.9}], ids=["pure", "temperature-top-k-top-p"]
)
@pytest.mark.parametrize("image_attention", [False, True], ids=["show-tell", "attention"])
def test_batched_rollouts_equal_the_per_prefix_loop(processor, pixel_values, image_attention, sampling):
    num_paths = 2  # several captions per image: rollouts find each caption's image through image_index
    pixel_values = pixel_values[:2]
    model = make_show_tell(processor, IMAGE_SIZE, seed=3, dropout=0.3, image_attention=image_attention)
    sequences, mask = sampled_captions(model, processor, pixel_values, num_paths=num_paths)
    image_index = torch.arange(pixel_values.size(0)).repeat_interleave(num_paths)
    num_rows = 3 * int((mask.sum(dim=1) - 1).sum())
    uniforms = torch.rand(num_rows, MAX_LENGTH, generator=torch.Generator().manual_seed(7))
    common = dict(
        num_rollouts=3, max_length=MAX_LENGTH, eos_token_id=EOS, pad_token_id=PAD, image_index=image_index,
        uniforms=uniforms, **sampling,
    )  # fmt: skip
    model.train()  # rollouts must switch dropout off themselves
    batched = sample_rollouts(model, {"pixel_values": pixel_values}, sequences, mask, **common)
    looped = sample_rollouts_per_prefix(model, {"pixel_values": pixel_values}, sequences, mask, **common)
    assert model.training
    assert batched.sequences.shape == (num_rows, MAX_LENGTH + 1)
    assert torch.equal(batched.caption_index, looped.caption_index)
    assert torch.equal(batched.prefix_length, looped.prefix_length)
    assert torch.equal(batched.sequences, looped.sequences)
    # the loop a GPU runs, stepping the finished rows along instead of asking at every step which ended
    kept = sample_rollouts(model, {"pixel_values": pixel_values}, sequences, mask, drop_finished_rows=False, **common)
    assert torch.equal(kept.sequences, batched.sequences)

    # every rollout keeps its prefix, then ends with the end token or at the maximum length
    for row, (caption, length) in enumerate(zip(batched.caption_index, batched.prefix_length, strict=True)):
        assert torch.equal(batched.sequences[row, : length + 1], sequences[caption, : length + 1])
    rollout_mask = caption_token_mask(batched.sequences, EOS)
    ended = (batched.sequences[:, 1:] == EOS).any(dim=1)
    assert bool((ended | (rollout_mask.sum(dim=1) == MAX_LENGTH)).all())

    # hence the same Q, which at the last step is the caption's own reward
    caption_rewards = word_count_reward(decode(processor, sequences))
    q_batched = monte_carlo_q_values(
        mask, caption_rewards, batched, word_count_reward(decode(processor, batched.sequences)), 3
    )
    q_looped = monte_carlo_q_values(
        mask, caption_rewards, looped, word_count_reward(decode(processor, looped.sequences)), 3
    )
    torch.testing.assert_close(q_batched, q_looped)
    last = mask.sum(dim=1).long() - 1
    torch.testing.assert_close(q_batched[torch.arange(len(last)), last], caption_rewards)


@pytest.mark.parametrize("image_attention", [False, True], ids=["show-tell", "attention"])
def test_the_rollout_loop_a_gpu_captures_as_a_graph_gives_the_step_by_step_rollouts(
    processor, pixel_values, image_attention, monkeypatch
):
    # the graph's loop runs on rows padded to one of a few counts, every step, without asking the device whether all
    # rows have ended; run here eagerly in place of the graph
    model = make_show_tell(processor, IMAGE_SIZE, seed=3, image_attention=image_attention)
    sequences, mask = sampled_captions(model, processor, pixel_values, num_paths=2)
    image_index = torch.arange(pixel_values.size(0)).repeat_interleave(2)
    num_rows = 3 * int((mask.sum(dim=1) - 1).sum())
    common = dict(
        num_rollouts=3, max_length=MAX_LENGTH, eos_token_id=EOS, pad_token_id=PAD, image_index=image_index,
        uniforms=torch.rand(num_rows, MAX_LENGTH, generator=torch.Generator().manual_seed(7)), top_k=5,
    )  # fmt: skip
    step_by_step = sample_rollouts(model, {"pixel_values": pixel_values}, sequences, mask, **common)
    graph_rows = []

    def graph_run_eagerly(model, function, inputs, settings):
        graph_rows.append(
            {name: tensor.shape[1 if name in ("hidden", "cell") else 0] for name, tensor in inputs.items()}
        )
        return function(**{name: tensor.clone() for name, tensor in inputs.items()})

    monkeypatch.setattr(spider_pg_module, "graphed_call", graph_run_eagerly)
    on_a_gpu = spider_pg_module.uses_cuda_graphs
    monkeypatch.setattr(
        spider_pg_module, "uses_cuda_graphs", lambda config, device: on_a_gpu(config, torch.device("cuda"))
    )
    graphed = sample_rollouts(
        model, {"pixel_values": pixel_values}, sequences, mask, drop_finished_rows=False, **common
    )
    assert len(graph_rows) == 1 and set(graph_rows[0].values()) == {spider_pg_module._padded_row_count(num_rows)}
    assert spider_pg_module._padded_row_count(num_rows) > num_rows  # padding rows were stepped along, and dropped
    assert torch.equal(graphed.sequences, step_by_step.sequences)
    assert torch.equal(graphed.caption_index, step_by_step.caption_index)
    assert torch.equal(graphed.prefix_length, step_by_step.prefix_length)
    # a policy whose generation config turns graphs off rolls out step by step, as its own decodings do
    model.generation_config.cuda_graphs = False
    kept_rows = sample_rollouts(
        model, {"pixel_values": pixel_values}, sequences, mask, drop_finished_rows=False, **common
    )
    assert len(graph_rows) == 1 and torch.equal(kept_rows.sequences, step_by_step.sequences)


def test_rollout_rows_are_padded_to_a_few_counts_at_most_a_quarter_larger():
    counts = {rows: spider_pg_module._padded_row_count(rows) for rows in range(1, 5000)}
    assert all(rows <= padded <= 1.25 * rows for rows, padded in counts.items())
    assert len({padded for rows, padded in counts.items() if 2048 <= rows < 4096}) == 5
    assert counts[3198] == 3584 and counts[8] == 8 and counts[1] == 1


@pytest.mark.parametrize("image_attention", [False, True], ids=["show-tell", "attention"])
def test_rollouts_continue_the_policy_from_the_prefix_state(processor, pixel_values, image_attention):
    """The first rollout token is drawn from π(· | g_{1:t}, image): compare with a forward pass over the prefix."""
    model = make_show_tell(processor, IMAGE_SIZE, seed=4, image_attention=image_attention).eval()
    sequences, mask = sampled_captions(model, processor, pixel_values)
    caption_index, prefix_length = rollout_prefixes(mask, num_rollouts=1)
    row = int(torch.argmax(prefix_length))  # the longest prefix
    caption, length = int(caption_index[row]), int(prefix_length[row])
    with torch.no_grad():
        logits = model(
            input_ids=sequences[caption : caption + 1, : length + 1], pixel_values=pixel_values[caption : caption + 1]
        ).logits
    probabilities = torch.softmax(logits[0, -1], dim=-1)
    # a uniform draw just below a token's CDF boundary must select that token
    token = int(torch.argmax(probabilities))
    uniforms = torch.full((len(caption_index), MAX_LENGTH), 0.5)
    uniforms[row, 0] = float(probabilities[:token].sum() + probabilities[token] / 2)
    rollouts = sample_rollouts(
        model, {"pixel_values": pixel_values}, sequences, mask, 1, MAX_LENGTH, EOS, PAD, uniforms=uniforms
    )
    assert int(rollouts.sequences[row, length + 1]) == token


def rollout_rows_and_first_tokens(model, pixel_values, sequences, mask, **sampling):
    """The rollouts of every prefix and, for each rollout row, the policy's next-token logits after its prefix."""
    rollouts = sample_rollouts(
        model, {"pixel_values": pixel_values}, sequences, mask, 3, MAX_LENGTH, EOS, PAD, **sampling
    )
    with torch.no_grad():
        logits = model(input_ids=rollouts.sequences, pixel_values=pixel_values[rollouts.caption_index]).logits
    # (R, V): the logits that chose each rollout's first token, the one after its prefix g_{1:t}
    first_logits = logits[torch.arange(len(rollouts.prefix_length)), rollouts.prefix_length]
    first_tokens = rollouts.sequences[torch.arange(len(rollouts.prefix_length)), rollouts.prefix_length + 1]
    return rollouts, first_logits, first_tokens


def test_rollouts_with_top_k_1_are_the_greedy_continuation(processor, pixel_values):
    model = make_show_tell(processor, IMAGE_SIZE, seed=5).eval()
    sequences, mask = sampled_captions(model, processor, pixel_values)
    rollouts, first_logits, first_tokens = rollout_rows_and_first_tokens(
        model, pixel_values, sequences, mask, temperature=0.7, top_k=1
    )
    assert torch.equal(first_tokens, first_logits.argmax(dim=-1))
    # and every later token too: each rollout is what greedy decoding continues its prefix with
    prefixes = zip(rollouts.caption_index.tolist(), rollouts.prefix_length.tolist(), strict=True)
    for row, (caption, length) in enumerate(prefixes):
        state = sequences[caption : caption + 1, : length + 1]
        for _ in range(MAX_LENGTH - length):
            with torch.no_grad():
                token = model(input_ids=state, pixel_values=pixel_values[caption : caption + 1]).logits[0, -1].argmax()
            state = torch.cat([state, token.view(1, 1)], dim=1)
            if int(token) == EOS:
                break
        assert torch.equal(rollouts.sequences[row, : state.size(1)], state[0])


def test_rollouts_with_a_small_top_p_draw_only_nucleus_tokens(processor, pixel_values):
    model = make_show_tell(processor, IMAGE_SIZE, seed=5).eval()
    sequences, mask = sampled_captions(model, processor, pixel_values)
    top_p = 0.3
    _, first_logits, first_tokens = rollout_rows_and_first_tokens(model, pixel_values, sequences, mask, top_p=top_p)
    # the nucleus: the most probable tokens whose mass before them is below top_p
    probabilities, order = torch.softmax(first_logits, dim=-1).sort(dim=-1, descending=True)
    mass_before = probabilities.cumsum(dim=-1) - probabilities
    rank = (order == first_tokens[:, None]).float().argmax(dim=-1)
    assert bool((mass_before.gather(1, rank[:, None]) < top_p).all())
    # a random tiny policy is near uniform: without top-p, tokens outside the nucleus are drawn
    _, _, unrestricted = rollout_rows_and_first_tokens(model, pixel_values, sequences, mask)
    unrestricted_rank = (order == unrestricted[:, None]).float().argmax(dim=-1)
    assert bool((mass_before.gather(1, unrestricted_rank[:, None]) >= top_p).any())


# ---------------------------------------------------------------- losses and baseline


def test_baseline_loss_sends_no_gradient_into_the_lstm_or_encoder(processor, pixel_values):
    model = make_show_tell(processor, IMAGE_SIZE, seed=1)
    baseline = SpiderPGBaseline(model.config.hidden_size, 16)
    sequences, mask = sampled_captions(model, processor, pixel_values)
    q_values = torch.rand_like(mask) * mask
    outputs = model(input_ids=sequences, pixel_values=pixel_values, output_hidden_states=True)
    log_probs = torch.log_softmax(outputs.logits[:, :-1], dim=-1).gather(-1, sequences[:, 1:, None]).squeeze(-1)
    baseline_values = baseline(outputs.hidden_states[:, :-1])
    policy_loss, baseline_loss = spider_pg_losses(log_probs, baseline_values, q_values, mask, "token")

    baseline_loss.backward(retain_graph=True)
    assert all(parameter.grad is not None and parameter.grad.abs().sum() > 0 for parameter in baseline.parameters())
    assert all(parameter.grad is None for parameter in model.parameters())
    baseline.zero_grad(set_to_none=True)
    policy_loss.backward()
    assert all(parameter.grad is None for parameter in baseline.parameters())
    assert model.lstm.weight_hh_l0.grad.abs().sum() > 0
    assert any(parameter.grad is not None for parameter in model.image_encoder.parameters())


def test_policy_loss_matches_the_hand_written_sum():
    log_probs = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -0.2, -0.3]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    q_values = torch.tensor([[1.0, 0.5, 0.0], [2.0, 2.0, 1.0]])
    baseline = torch.tensor([[0.5, 0.5, 9.0], [1.0, 3.0, 1.0]], requires_grad=True)
    policy_loss, baseline_loss = spider_pg_losses(log_probs, baseline, q_values, mask, "sequence")
    # Σ_t (Q − B) · −log π per caption, mean over captions
    expected_policy = ((0.5 * 1.0 + 0.0 * 2.0) + (1.0 * 0.1 + (-1.0) * 0.2 + 0.0)) / 2
    assert policy_loss.item() == pytest.approx(expected_policy)
    assert baseline_loss.item() == pytest.approx((0.25 + 0.0 + 1.0 + 1.0 + 0.0) / 5)
    policy_loss.backward()
    assert baseline.grad is None  # the advantage is a constant for the policy term


def _draw(model, processor, pixel_values, seed):
    """One Monte-Carlo estimate on a fixed batch: the token mask, Q, and the forward outputs (with gradient)."""
    sequences, mask = sampled_captions(model, processor, pixel_values, seed=seed)
    rollouts = sample_rollouts(model, {"pixel_values": pixel_values}, sequences, mask, 3, MAX_LENGTH, EOS, PAD)
    q_values = monte_carlo_q_values(
        mask, word_count_reward(decode(processor, sequences)), rollouts,
        word_count_reward(decode(processor, rollouts.sequences)), 3,
    )  # fmt: skip
    outputs = model(input_ids=sequences, pixel_values=pixel_values, output_hidden_states=True)
    log_probs = torch.log_softmax(outputs.logits[:, :-1], dim=-1).gather(-1, sequences[:, 1:, None]).squeeze(-1)
    return mask, q_values, outputs.hidden_states[:, :-1], log_probs


def test_the_learned_baseline_lowers_the_variance_of_the_policy_gradient(processor, pixel_values):
    model = make_show_tell(processor, IMAGE_SIZE, seed=2)
    baseline = SpiderPGBaseline(model.config.hidden_size, 16)
    # 1. fit the baseline to Q on draws from the policy (the objective does this step by step)
    states, targets = [], []
    for seed in range(12):
        mask, q_values, hidden, _ = _draw(model, processor, pixel_values, seed)
        states.append(hidden.detach()[mask.bool()])
        targets.append(q_values[mask.bool()])
    states, targets = torch.cat(states), torch.cat(targets)  # (P, H), (P,)
    optimizer = torch.optim.Adam(baseline.parameters(), lr=1e-2)
    for _ in range(300):
        optimizer.zero_grad()
        loss = (baseline(states[None]).squeeze(0) - targets).pow(2).mean()
        loss.backward()
        optimizer.step()
    model.zero_grad(set_to_none=True)

    # 2. on fresh draws, the same samples give two estimates of the policy gradient: with and without the baseline
    parameters = [model.lm_head.weight, model.lstm.weight_hh_l0]
    with_baseline, without_baseline = [], []
    for seed in range(100, 124):
        mask, q_values, hidden, log_probs = _draw(model, processor, pixel_values, seed)
        baseline_values = baseline(hidden)
        for estimates, values in ((with_baseline, baseline_values), (without_baseline, torch.zeros_like(q_values))):
            policy_loss, _ = spider_pg_losses(log_probs, values, q_values, mask, "sequence")
            gradients = torch.autograd.grad(policy_loss, parameters, retain_graph=True)
            estimates.append(torch.cat([gradient.flatten() for gradient in gradients]))
    variance_with = torch.stack(with_baseline).var(dim=0).sum()
    variance_without = torch.stack(without_baseline).var(dim=0).sum()
    assert variance_with < 0.5 * variance_without
    # both estimate the same expectation: their means agree within the noise of 24 draws
    mean_gap = (torch.stack(with_baseline).mean(dim=0) - torch.stack(without_baseline).mean(dim=0)).norm()
    assert mean_gap < 3 * math.sqrt(float(variance_without) / 24)


# ---------------------------------------------------------------- training with RLCaptionTrainer


def make_trainer(model, processor, dataset, output_dir, reward_funcs=None, **overrides):
    settings = {
        "output_dir": str(output_dir),
        "use_cpu": True,
        "per_device_train_batch_size": 4,
        "max_steps": 3,
        "learning_rate": 1e-2,
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "max_caption_length": MAX_LENGTH,
        "objective": "spider_pg",
        "reward_funcs": ["cider"],
        "seed": 0,
    }
    settings.update(overrides)
    return RLCaptionTrainer(
        model=model,
        args=RLCaptionConfig(**settings),
        processing_class=processor,
        train_dataset=dataset["train"],
        reward_funcs=reward_funcs,
    )


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_trainer_runs_spider_pg_and_updates_policy_and_baseline(processor, shapes, tmp_path):
    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    trainer = make_trainer(model, processor, shapes, tmp_path / "out", num_paths_per_image=2)
    baseline_before = {name: tensor.clone() for name, tensor in trainer.auxiliary_state_dict().items()}
    trainer.train()
    changed = [name for name, parameter in model.named_parameters() if not torch.equal(before[name], parameter)]
    assert any(name.startswith("lstm") for name in changed)
    baseline_after = trainer.auxiliary_state_dict()
    assert set(baseline_after) == {f"baseline.mlp.{layer}.{kind}" for layer in (0, 2) for kind in ("weight", "bias")}
    assert all(not torch.equal(baseline_before[key], baseline_after[key]) for key in baseline_after)
    for key in ("reward", "reward/cider/mean", "rollout/cider/mean", "baseline_loss", "policy_loss", "q_mean"):
        values = logged(trainer, key)
        assert len(values) == 3 and all(math.isfinite(value) for value in values), key
    assert all(value > 0 for value in logged(trainer, "rollout_captions"))


def test_baseline_pretraining_phase_keeps_the_policy_fixed_then_trains_both(processor, shapes, tmp_path):
    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    trainer = make_trainer(model, processor, shapes, tmp_path / "out", baseline_pretraining_steps=2, max_steps=3)
    snapshots = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            snapshots.append(
                (
                    torch.cat([parameter.detach().flatten() for parameter in model.parameters()]).clone(),
                    {name: tensor.clone() for name, tensor in trainer.auxiliary_state_dict().items()},
                )
            )

    start = (
        torch.cat([parameter.detach().flatten() for parameter in model.parameters()]).clone(),
        {name: tensor.clone() for name, tensor in trainer.auxiliary_state_dict().items()},
    )
    trainer.add_callback(Snapshot())
    trainer.train()
    states = [start, *snapshots]
    for step in (1, 2):  # baseline pretraining: the policy is fixed, the baseline learns
        assert torch.equal(states[step][0], states[step - 1][0]), step
        assert not torch.equal(states[step][1]["baseline.mlp.0.weight"], states[step - 1][1]["baseline.mlp.0.weight"])
    assert not torch.equal(states[3][0], states[2][0])  # then the policy gradient starts
    assert logged(trainer, "objective_phase") == [0.0, 0.0, 1.0]


def test_constant_reward_gives_zero_loss_once_the_baseline_predicts_it(processor, shapes, tmp_path):
    def constant_reward(completions, **kwargs):
        return [0.7] * len(completions)

    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    trainer = make_trainer(model, processor, shapes, tmp_path / "out", reward_funcs=[constant_reward])
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert trainer.compute_loss(model, batch).item() > 0  # the untrained baseline is far from 0.7
    # Q = 0.7 at every step; a baseline that outputs 0.7 zeroes both the advantage and its own squared error
    assert float(np.mean(trainer._recorded_metrics["q_mean"])) == pytest.approx(0.7)
    with torch.no_grad():
        trainer.objective.baseline.mlp[-1].weight.zero_()
        trainer.objective.baseline.mlp[-1].bias.fill_(0.7)
    assert trainer.compute_loss(model, batch).item() == pytest.approx(0.0, abs=1e-6)


def test_resume_restores_the_baseline(processor, shapes, tmp_path):
    trained = make_show_tell(processor, IMAGE_SIZE, seed=0)
    first = make_trainer(trained, processor, shapes, tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    first.train()
    saved = load_file(str(tmp_path / "checkpoint-2" / "auxiliary_networks.safetensors"))
    expected = {name: tensor.clone() for name, tensor in first.auxiliary_state_dict().items()}
    assert set(saved) == set(expected)
    # the baseline is the objective's, not the model's: the model's weights are those of a plain ShowTellRL
    assert not any("baseline" in name for name in load_file(str(tmp_path / "checkpoint-2" / "model.safetensors")))

    torch.manual_seed(42)
    second = make_trainer(make_show_tell(processor, IMAGE_SIZE, seed=42), processor, shapes, tmp_path, max_steps=2)
    assert not torch.equal(second.auxiliary_state_dict()["baseline.mlp.0.weight"], expected["baseline.mlp.0.weight"])
    second.train(resume_from_checkpoint=True)
    for name, tensor in second.auxiliary_state_dict().items():
        torch.testing.assert_close(tensor, expected[name], msg=name)


def test_spider_pg_rejects_models_without_rollout_state(processor, shapes, tmp_path):
    model = make_vision_encoder_decoder(processor, IMAGE_SIZE)
    with pytest.raises(ValueError, match="spider_pg objective needs a recurrent captioner.*ShowTellRL"):
        make_trainer(model, processor, shapes, tmp_path / "out")
    with pytest.raises(ValueError, match="num_rollouts must be >= 1"):
        make_trainer(make_show_tell(processor, IMAGE_SIZE), processor, shapes, tmp_path / "out", num_rollouts=0)


def test_spice_reward_stops_with_its_own_error_where_spice_cannot_run(processor, shapes, tmp_path):
    from rlcaption.metrics.spice import check_spice

    try:
        check_spice()
    except RuntimeError:
        pass
    else:
        pytest.skip("SPICE runs on this machine")
    trainer = make_trainer(make_show_tell(processor, IMAGE_SIZE), processor, shapes, tmp_path, reward_funcs=["spider"])
    with pytest.raises((RuntimeError, FileNotFoundError), match="SPICE"):
        trainer.train()


def test_resumed_spider_pg_equals_uninterrupted_training_in_either_phase(processor, shapes, tmp_path):
    settings = {"max_steps": 4, "baseline_pretraining_steps": 2, "save_strategy": "steps", "save_steps": 1}
    straight = make_trainer(
        make_show_tell(processor, IMAGE_SIZE, seed=0), processor, shapes, tmp_path / "a", **settings
    )
    straight.train()
    expected_model = {name: tensor.clone() for name, tensor in straight.model.state_dict().items()}
    expected_baseline = {name: tensor.clone() for name, tensor in straight.auxiliary_state_dict().items()}
    for resume_step in (1, 3):  # in the baseline pretraining phase, then in joint training
        output_dir = tmp_path / f"resumed-from-{resume_step}"
        output_dir.mkdir()
        shutil.copytree(tmp_path / "a" / f"checkpoint-{resume_step}", output_dir / f"checkpoint-{resume_step}")
        resumed = make_trainer(
            make_show_tell(processor, IMAGE_SIZE, seed=9), processor, shapes, output_dir, **settings
        )
        resumed.train(resume_from_checkpoint=True)
        for name, tensor in resumed.model.state_dict().items():
            torch.testing.assert_close(tensor, expected_model[name], rtol=0, atol=0, msg=name)
        for name, tensor in resumed.auxiliary_state_dict().items():
            torch.testing.assert_close(tensor, expected_baseline[name], rtol=0, atol=0, msg=name)


def test_spider_pg_scores_captions_under_the_policy_that_sampled_them(processor, shapes, tmp_path, monkeypatch):
    # with dropout active in training mode, scoring in training mode would use another policy than sampling did
    model = make_show_tell(processor, IMAGE_SIZE, seed=0, dropout=0.5)
    trainer = make_trainer(model, processor, shapes, tmp_path / "out")
    sampled, scored = [], []
    sample_captions = trainer.sample_captions

    def recording_sample_captions(*args, **kwargs):
        sampled.append(sample_captions(*args, **kwargs))
        return sampled[-1]

    monkeypatch.setattr(trainer, "sample_captions", recording_sample_captions)
    losses = spider_pg_module.spider_pg_losses

    def recording_losses(token_log_probs, *args):
        scored.append(token_log_probs.detach())
        return losses(token_log_probs, *args)

    monkeypatch.setattr(spider_pg_module, "spider_pg_losses", recording_losses)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    model.train()
    trainer.compute_loss(model, batch)
    assert model.training  # the mode is restored
    sequences = sampled[0].sequences
    mask = caption_token_mask(sequences, EOS).bool()
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=sequences, pixel_values=batch["pixel_values"], use_cache=False).logits[:, :-1]
    expected = torch.log_softmax(logits.float(), dim=-1).gather(-1, sequences[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(scored[0][mask], expected[mask], rtol=1e-5, atol=1e-5)


def test_the_baseline_is_in_training_checkpoints_not_in_the_saved_captioner(processor, shapes, tmp_path):
    trainer = make_trainer(
        make_show_tell(processor, IMAGE_SIZE), processor, shapes, tmp_path, max_steps=1, save_strategy="steps",
        save_steps=1,
    )  # fmt: skip
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    assert (tmp_path / "checkpoint-1" / "auxiliary_networks.safetensors").is_file()
    assert (tmp_path / "final" / "model.safetensors").is_file()
    assert not (tmp_path / "final" / "auxiliary_networks.safetensors").exists()


def test_the_captions_are_scored_before_their_and_their_rollouts_texts_are_read(
    processor, shapes, tmp_path, monkeypatch
):
    # on a GPU the host then queues the forward pass while the device still draws the rollouts
    model = make_show_tell(processor, IMAGE_SIZE, seed=0)
    trainer = make_trainer(model, processor, shapes, tmp_path / "out", num_paths_per_image=2)
    events, sampled, rows = [], [], []
    model.register_forward_pre_hook(lambda *_: events.append("score") if torch.is_grad_enabled() else None)
    batch_decode = processor.batch_decode
    monkeypatch.setattr(processor, "batch_decode", lambda *a, **k: events.append("texts") or batch_decode(*a, **k))
    sample_captions, start_rewards = trainer.sample_captions, trainer.start_rewards
    monkeypatch.setattr(
        trainer, "sample_captions", lambda *a, **k: sampled.append(sample_captions(*a, **k)) or sampled[-1]
    )
    monkeypatch.setattr(
        trainer, "start_rewards", lambda texts, inputs, row_index, **k: rows.append(row_index) or start_rewards(
            texts, inputs, row_index, **k
        )
    )  # fmt: skip
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert torch.isfinite(trainer.compute_loss(model, batch))
    assert events == ["score", "texts", "texts"]  # the samples' texts, then the rollouts'
    # the image row of every rollout, known without reading the rollouts: that of the caption it continues
    mask = caption_token_mask(sampled[0].sequences, EOS)
    caption_index, _ = rollout_prefixes(mask, trainer.args.num_rollouts)
    assert rows[0] == [row for row in range(len(batch["references"])) for _ in range(2)]
    assert rows[1] == (caption_index // 2).tolist() and len(rows[1]) > 0
