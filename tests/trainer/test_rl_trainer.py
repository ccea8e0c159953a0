import copy
import math
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tiny_training import IMAGE_SIZE, make_tiny_model

from rlcaption.data import CaptionCollator
from rlcaption.rewards import get_reward
from rlcaption.rewards import processes as reward_processes_module
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer, forward_through
from rlcaption.trainer import rl_trainer as rl_trainer_module
from rlcaption.trainer.rl_trainer import check_data_parallel
from tiny_captioners import make_vision_encoder_decoder


def make_trainer(model, processor, dataset, tmp_path, reward_funcs=None, data_collator=None, **overrides):
    settings = {
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 8,
        "max_steps": 3,
        "learning_rate": 1e-2,
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "max_caption_length": 12,
        "num_samples_per_image": 3,
        "seed": 0,
    }
    settings.update(overrides)
    args = RLCaptionConfig(**settings)
    return RLCaptionTrainer(
        model=model,
        args=args,
        processing_class=processor,
        train_dataset=dataset["train"],
        eval_dataset=dataset["validation"],
        reward_funcs=reward_funcs,
        data_collator=data_collator,
    )


def parameters_of(model):
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


def changed_parameters(before, model):
    return [name for name, parameter in model.named_parameters() if not torch.equal(before[name], parameter)]


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_xe_training_updates_the_captioner_and_logs_its_loss(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    before = parameters_of(tiny_model)
    trainer = make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="xe")
    trainer.train()
    changed = changed_parameters(before, tiny_model)
    assert any(name.startswith("lm_head") or "lstm" in name for name in changed)
    losses = logged(trainer, "loss_xe")
    assert len(losses) == 3 and all(math.isfinite(value) for value in losses)
    # the first loss of an untrained model is about log(vocabulary size)
    assert losses[0] == pytest.approx(math.log(len(tiny_processor.tokenizer)), rel=0.25)


def test_scst_logs_each_reward_and_the_greedy_baseline(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    before = parameters_of(tiny_model)
    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="scst", reward_funcs=["cider", "bleu"],
        reward_weights=[1.0, 0.5],
    )  # fmt: skip
    trainer.train()
    assert changed_parameters(before, tiny_model)
    for key in ("reward/cider/mean", "reward/bleu_4/mean", "greedy/cider/mean", "reward", "loss_scst"):
        values = logged(trainer, key)
        assert values and all(math.isfinite(value) for value in values), key
    total = logged(trainer, "reward")[0]
    cider, bleu = logged(trainer, "reward/cider/mean")[0], logged(trainer, "reward/bleu_4/mean")[0]
    assert total == pytest.approx(cider + 0.5 * bleu, rel=1e-6, abs=1e-9)


def recording(function, calls: list):
    """`function`, appending the arguments of each call to `calls`."""

    def recorded(*args):
        calls.append(args)
        return function(*args)

    return recorded


@pytest.mark.slow
def test_rewards_in_worker_processes_train_as_in_the_training_process(
    tiny_processor, tiny_shapes, tmp_path, monkeypatch
):
    monkeypatch.setattr(reward_processes_module, "MIN_ROWS_PER_SHARE", 2)  # this tiny batch's 12 captions split too
    runs = {}
    for reward_processes in (0, 2):
        model = make_tiny_model(tiny_processor)
        trainer = make_trainer(
            model, tiny_processor, tiny_shapes, tmp_path / str(reward_processes), objective="scst",
            reward_funcs=["cider", "bleu"], reward_processes=reward_processes,
        )  # fmt: skip
        assert list(trainer.reward_mix._in_processes) == ([0, 1] if reward_processes else [])
        shares = []
        if reward_processes:
            assert trainer.reward_mix.wait_for_processes(timeout=120)  # else the first calls are scored here
            executor = trainer.reward_mix._processes._executor
            monkeypatch.setattr(executor, "submit", recording(executor.submit, shares))
        trainer.train()
        # 3 steps, each scoring samples and greedy captions with 2 rewards, each call in 2 shares
        assert len(shares) == (3 * 2 * 2 * 2 if reward_processes else 0)
        runs[reward_processes] = (logged(trainer, "reward"), logged(trainer, "greedy/cider/mean"), model)
        trainer.reward_mix.close()
    assert runs[0][0] == runs[2][0] and runs[0][1] == runs[2][1] and len(runs[0][0]) == 3
    for in_process, in_processes in zip(runs[0][2].parameters(), runs[2][2].parameters(), strict=True):
        torch.testing.assert_close(in_processes, in_process, rtol=0, atol=0)


@pytest.mark.parametrize("baseline", ["greedy", "mean_of_others"])
def test_constant_reward_gives_zero_policy_gradient(baseline, tiny_model, tiny_processor, tiny_shapes, tmp_path):
    def constant_reward(completions, **kwargs):
        return [0.7] * len(completions)

    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="scst", baseline=baseline,
        reward_funcs=[constant_reward],
    )  # fmt: skip
    batch = next(iter(trainer.get_train_dataloader()))
    loss = trainer.compute_loss(tiny_model, trainer._prepare_inputs(batch))
    assert loss.item() == pytest.approx(0.0, abs=1e-9)


def test_scst_increases_a_simple_reward(tiny_processor, tiny_shapes, tmp_path):
    target_word = "red"
    assert target_word in tiny_processor.tokenizer.get_vocab()

    def word_reward(completions, **kwargs):
        return [float(caption.split().count(target_word)) / max(1, len(caption.split())) for caption in completions]

    model = make_tiny_model(tiny_processor, seed=1)
    trainer = make_trainer(
        model, tiny_processor, tiny_shapes, tmp_path, objective="scst", baseline="mean_of_others",
        reward_funcs=[word_reward], max_steps=25, learning_rate=5e-2, num_samples_per_image=4,
    )  # fmt: skip
    trainer.train()
    rewards = logged(trainer, "reward")
    assert np.mean(rewards[-5:]) > np.mean(rewards[:5]) + 0.1


def test_non_finite_reward_names_the_function_and_keeps_checkpoints(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    calls = {"count": 0}

    def flaky_reward(completions, **kwargs):
        calls["count"] += 1
        # the greedy baseline is scored after the samples: two calls per step
        return [float("nan") if calls["count"] > 4 else 0.5] * len(completions)

    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="scst", reward_funcs=[flaky_reward],
        max_steps=4, save_strategy="steps", save_steps=1,
    )  # fmt: skip
    with pytest.raises(ValueError, match="flaky_reward"):
        trainer.train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert (checkpoint / "trainer_state.json").is_file()
    state = load_file(str(checkpoint / "model.safetensors"))
    assert all(torch.isfinite(tensor).all() for tensor in state.values())


@pytest.mark.parametrize(
    ("objective", "bad_value"), [("xe", float("nan")), ("xe", float("inf")), ("spider_pg", float("nan"))]
)
def test_a_non_finite_loss_stops_before_the_optimizer_step_and_keeps_checkpoints(
    objective, bad_value, tiny_model, tiny_processor, tiny_shapes, tmp_path
):
    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective=objective, max_steps=4, save_strategy="steps",
        save_steps=1, **({"num_rollouts": 1, "baseline_pretraining_steps": 0} if objective == "spider_pg" else {}),
    )  # fmt: skip
    objective_loss = trainer.objective.compute_loss
    calls = {"count": 0}

    def loss_going_bad_in_the_third_step(model, inputs):
        calls["count"] += 1
        loss = objective_loss(model, inputs)
        return loss * bad_value if calls["count"] == 3 else loss

    trainer.objective.compute_loss = loss_going_bad_in_the_third_step
    with pytest.raises(RuntimeError, match=f"'{objective}' loss is {bad_value} at step 2.*resume_from_checkpoint"):
        trainer.train()
    # no gradient of the bad step is left to add to those of a resumed run's first step, the auxiliary networks' too
    networks = [trainer.model, *(network.module for network in trainer._auxiliary_networks.values())]
    assert len(networks) == (2 if objective == "spider_pg" else 1)
    assert all(parameter.grad is None for network in networks for parameter in network.parameters())
    # the bad step's gradients never reached the weights: they are those of the last checkpoint, which is intact
    saved = load_file(str(tmp_path / "out" / "checkpoint-2" / "model.safetensors"))
    for name, tensor in trainer.model.state_dict().items():
        if name in saved:
            torch.testing.assert_close(tensor, saved[name], rtol=0, atol=0, msg=name)
    assert not (tmp_path / "out" / "checkpoint-3").exists()


def test_the_loss_is_checked_once_a_step_with_its_backward_pass_queued(
    tiny_model, tiny_processor, tiny_shapes, tmp_path
):
    trainer = make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="xe", max_steps=2)
    assert trainer.args.logging_nan_inf_filter is False  # the Trainer's own check would read the loss again
    events = []
    original_backward = trainer.accelerator.backward
    trainer.accelerator.backward = lambda loss, **kwargs: (
        events.append("backward"),
        original_backward(loss, **kwargs),
    )
    original_isfinite = torch.isfinite

    def isfinite(tensor):
        events.append("check")
        return original_isfinite(tensor)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "isfinite", isfinite)
        trainer.train()
    assert events == ["backward", "check"] * 2


def test_with_an_optimizer_stepping_in_the_backward_pass_the_loss_is_checked_before_it(
    tiny_model, tiny_processor, tiny_shapes, tmp_path, monkeypatch
):
    # fused LOMO and layer-wise GaLore update the weights during the backward pass: a bad loss must not reach it
    trainer = make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="xe", max_steps=2)
    monkeypatch.setattr(rl_trainer_module, "_OPTIMIZERS_STEPPING_IN_BACKWARD", {trainer.args.optim})
    objective_loss = trainer.objective.compute_loss
    trainer.objective.compute_loss = lambda model, inputs: objective_loss(model, inputs) * float("nan")
    backward_calls = []
    original_backward = trainer.accelerator.backward
    trainer.accelerator.backward = lambda loss, **kwargs: backward_calls.append(1) or original_backward(loss, **kwargs)
    before = {name: parameter.detach().clone() for name, parameter in trainer.model.named_parameters()}
    with pytest.raises(RuntimeError, match="'xe' loss is nan at step 0"):
        trainer.train()
    assert backward_calls == []
    assert all(torch.equal(parameter, before[name]) for name, parameter in trainer.model.named_parameters())


def test_resume_from_checkpoint_reproduces_uninterrupted_training(tiny_processor, tiny_shapes, tmp_path):
    straight = make_tiny_model(tiny_processor, seed=5)
    make_trainer(straight, tiny_processor, tiny_shapes, tmp_path / "a", objective="xe", max_steps=4).train()

    interrupted = make_tiny_model(tiny_processor, seed=5)
    trainer = make_trainer(
        interrupted, tiny_processor, tiny_shapes, tmp_path / "b", objective="xe", max_steps=4,
        save_strategy="steps", save_steps=2,
    )  # fmt: skip
    trainer.train()
    # simulate a crash after step 2: drop the last checkpoint and leave a half-written one behind
    output_dir = tmp_path / "b" / "out"
    os.remove(output_dir / "checkpoint-4" / "trainer_state.json")
    resumed = make_tiny_model(tiny_processor, seed=99)
    trainer = make_trainer(
        resumed, tiny_processor, tiny_shapes, tmp_path / "b", objective="xe", max_steps=4,
        save_strategy="steps", save_steps=2,
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=True)
    for (name, expected), actual in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(actual, expected, msg=name)


def test_evaluate_scores_beam_search_captions(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    trainer = make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="xe", eval_num_beams=2)
    metrics = trainer.evaluate()
    assert metrics["eval_num_images"] == tiny_shapes["validation"].num_rows
    assert 0.0 <= metrics["eval_Bleu_4"] <= 1.0
    assert metrics["eval_CIDEr"] >= 0.0


def test_unknown_objective_and_reward_are_rejected(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    with pytest.raises(ValueError, match="objective='ppo' is unknown; valid objectives: .*scst"):
        make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="ppo")
    with pytest.raises(ValueError, match="cidr"):
        make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="scst", reward_funcs=["cidr"])


def test_reward_weights_must_match_the_reward_functions(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    with pytest.raises(ValueError, match="2 weights for 1 reward functions"):
        make_trainer(
            tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="scst", reward_funcs=["cider"],
            reward_weights=[1.0, 0.5],
        )  # fmt: skip


def test_scst_and_evaluation_work_with_a_transformers_vision_encoder_decoder(tiny_processor, tiny_shapes, tmp_path):
    model = make_vision_encoder_decoder(tiny_processor, IMAGE_SIZE)
    before = parameters_of(model)
    trainer = make_trainer(model, tiny_processor, tiny_shapes, tmp_path, objective="scst", max_steps=2)
    trainer.train()
    assert changed_parameters(before, model)
    assert logged(trainer, "reward/cider/mean")
    assert trainer.evaluate()["eval_num_images"] == tiny_shapes["validation"].num_rows


@pytest.mark.parametrize("objective", ["xe", "scst"])
def test_gradient_accumulation_averages_the_micro_batch_gradients(objective, tiny_processor, tiny_shapes, tmp_path):
    model = make_tiny_model(tiny_processor, seed=7)
    reference = copy.deepcopy(model)
    seen_batches = []

    class RecordingCollator(CaptionCollator):
        def __call__(self, rows):
            batch = super().__call__(rows)
            seen_batches.append(batch)
            return batch

    # A near-zero sampling temperature makes SCST's samples the argmax captions, so recomputing the loss of the
    # recorded batches samples the same captions; the reward depends on the caption only.
    def fixed_reward(completions, **kwargs):
        return [float(len(caption)) / 100 for caption in completions]

    sampling = {"temperature": 1e-8, **({"baseline": "none"} if objective == "scst" else {})}
    trainer = make_trainer(
        model, tiny_processor, tiny_shapes, tmp_path, objective=objective, reward_funcs=[fixed_reward],
        per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=1, learning_rate=1.0,
        optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, data_collator=RecordingCollator(tiny_processor),
        **sampling,
    )  # fmt: skip
    torch.manual_seed(11)
    trainer.train()
    assert len(seen_batches) >= 2  # the data loader may collate one batch ahead

    # the same two micro-batches by hand: the update is the mean of their gradients (plain SGD, lr 1)
    reference_trainer = make_trainer(
        reference, tiny_processor, tiny_shapes, tmp_path / "ref", objective=objective, reward_funcs=[fixed_reward],
        **sampling,
    )  # fmt: skip
    for batch in seen_batches[:2]:
        (reference_trainer.objective.compute_loss(reference, batch) / 2).backward()
    for (name, updated), original in zip(model.named_parameters(), reference.parameters(), strict=True):
        expected = original.detach() - (original.grad if original.grad is not None else 0.0)
        torch.testing.assert_close(
            updated.detach(), expected, rtol=1e-4, atol=1e-6, msg=lambda text, name=name: f"{name}: {text}"
        )


def test_spider_pg_baseline_is_an_auxiliary_network_with_its_own_learning_rate(
    tiny_model, tiny_processor, tiny_shapes, tmp_path
):
    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="spider_pg", baseline_learning_rate=0.05,
        max_steps=2,
    )  # fmt: skip
    baseline = trainer.objective.baseline
    before = {name: tensor.clone() for name, tensor in baseline.state_dict().items()}
    trainer.train()
    groups = trainer.optimizer.param_groups
    baseline_groups = [group for group in groups if group.get("name") == "auxiliary/baseline"]
    assert len(baseline_groups) == 1
    baseline_ids = {id(parameter) for parameter in baseline.parameters()}
    assert {id(parameter) for parameter in baseline_groups[0]["params"]} == baseline_ids
    assert all(
        id(p) not in baseline_ids for group in groups if group is not baseline_groups[0] for p in group["params"]
    )
    # the linear schedule scales both groups from their own starting rate
    assert baseline_groups[0]["initial_lr"] == pytest.approx(0.05)
    assert baseline_groups[0]["weight_decay"] == 0.0
    assert all(not torch.equal(before[name], tensor) for name, tensor in baseline.state_dict().items())


def test_resuming_a_finished_run_changes_nothing(tiny_processor, tiny_shapes, tmp_path):
    model = make_tiny_model(tiny_processor, seed=5)
    settings = {"objective": "xe", "max_steps": 2, "save_strategy": "steps", "save_steps": 2}
    make_trainer(model, tiny_processor, tiny_shapes, tmp_path, **settings).train()
    restarted = make_tiny_model(tiny_processor, seed=6)
    trainer = make_trainer(restarted, tiny_processor, tiny_shapes, tmp_path, **settings)
    output = trainer.train(resume_from_checkpoint=True)
    # the Trainer alone would take a third step and write checkpoint-3
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoint-2"]
    assert output.global_step == 2 and trainer.state.global_step == 2
    for (name, expected), actual in zip(model.named_parameters(), restarted.parameters(), strict=True):
        torch.testing.assert_close(actual, expected, msg=name)


class _Wrapper(torch.nn.Module):
    """Stands for DDP: only what runs inside its forward is synchronised."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.forward_calls = 0

    def forward(self, *args, **kwargs):
        self.forward_calls += 1
        return self.module(*args, **kwargs)


def test_forward_through_runs_a_method_inside_the_wrapper_forward(tiny_processor):
    model = make_tiny_model(tiny_processor)
    wrapper = _Wrapper(model)
    ids = torch.tensor([[1, 5, 6]])
    pixels = torch.zeros(1, 3, 48, 48)
    through = forward_through(wrapper, "caption_log_probs", ids, pixel_values=pixels)
    torch.testing.assert_close(through, model.caption_log_probs(ids, pixel_values=pixels))
    assert wrapper.forward_calls == 1
    assert "forward" not in model.__dict__  # the model's own forward is back
    assert model(input_ids=ids, pixel_values=pixels).logits.shape == (1, 3, model.config.vocab_size)
    # without a wrapper it is the plain method call
    torch.testing.assert_close(forward_through(model, "caption_log_probs", ids, pixel_values=pixels), through)


def test_auxiliary_networks_follow_mixed_precision(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="spider_pg", bf16=True, max_steps=2
    )
    before = {name: tensor.clone() for name, tensor in trainer.auxiliary_state_dict().items()}
    trainer.train()
    hidden_states = torch.randn(2, 3, tiny_model.config.hidden_size)
    # accelerate's wrapper computes in bfloat16 and hands float32 back: the values are bfloat16 numbers
    values = trainer.auxiliary_network("baseline")(hidden_states)
    assert values.dtype == torch.float32 and torch.equal(values, values.to(torch.bfloat16).float())
    full_precision = trainer.objective.baseline.mlp(hidden_states).squeeze(-1)  # the layers, without the wrapper
    assert not torch.equal(values, full_precision)
    torch.testing.assert_close(values, full_precision, rtol=2e-2, atol=2e-2)
    after = trainer.auxiliary_state_dict()
    for name, tensor in after.items():
        assert tensor.dtype == torch.float32, name  # master weights stay in full precision
        assert not torch.equal(tensor, before[name]), name


def test_positional_arguments_follow_the_trainer_order(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    args = RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, max_steps=1, report_to="none")
    collator = CaptionCollator(tiny_processor)
    # transformers.Trainer(model, args, data_collator, train_dataset, eval_dataset, processing_class)
    trainer = RLCaptionTrainer(
        tiny_model, args, collator, tiny_shapes["train"], tiny_shapes["validation"], tiny_processor
    )
    assert trainer.data_collator is collator
    assert trainer.train_dataset is tiny_shapes["train"] and trainer.eval_dataset is tiny_shapes["validation"]
    assert trainer.processing_class is tiny_processor
    with pytest.raises(TypeError):  # the reward functions are named, never bound by position
        RLCaptionTrainer(tiny_model, args, collator, None, None, tiny_processor, ["cider"])


@pytest.mark.parametrize("name", ["compute_metrics", "compute_loss_func", "preprocess_logits_for_metrics"])
def test_trainer_arguments_that_would_be_ignored_are_refused(name, tiny_model, tiny_processor, tmp_path):
    args = RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match=rf"does not take {name}"):
        RLCaptionTrainer(tiny_model, args, processing_class=tiny_processor, **{name: lambda *inputs: {}})


def test_references_are_no_longer_than_the_captions_the_model_may_generate(
    tiny_model, tiny_processor, tiny_shapes, tmp_path
):
    trainer = make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="xe", max_caption_length=3)
    batch = next(iter(trainer.get_train_dataloader()))
    # <bos> then at most max_caption_length tokens, the end token included, as generate(max_new_tokens=3) produces
    assert batch["caption_input_ids"].size(1) == 1 + 3
    assert (batch["caption_input_ids"][:, -1] == trainer.eos_token_id).all()  # shapes captions are longer
    generated = trainer.greedy_captions({"pixel_values": batch["pixel_values"]})
    assert generated.sequences.size(1) <= 1 + 3


def caption_length(completions, **kwargs):
    return [float(len(caption.split())) for caption in completions]


def test_sampled_captions_are_printed_with_their_rewards_at_every_log(
    tiny_model, tiny_processor, tiny_shapes, tmp_path, capsys
):
    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="scst", reward_funcs=[caption_length],
        max_steps=2, num_completions_to_print=2,
    )  # fmt: skip
    capsys.readouterr()
    trainer.train()
    printed = capsys.readouterr().out
    assert printed.count("Sampled captions at step") == 2
    rows = [line for line in printed.splitlines() if line.startswith("| ") and not line.startswith("| image_id")]
    assert len(rows) == 4
    for row in rows:
        image_id, reward, length, caption = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert int(image_id) in tiny_shapes["train"]["image_id"]
        assert float(reward) == float(length) == len(caption.split())


def test_completion_printing_can_be_turned_off(tiny_model, tiny_processor, tiny_shapes, tmp_path, capsys):
    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="scst", reward_funcs=[caption_length],
        max_steps=1, log_completions=False,
    )  # fmt: skip
    trainer.train()
    assert "Sampled captions" not in capsys.readouterr().out


def test_sampled_captions_are_logged_as_a_wandb_table(tiny_model, tiny_processor, tiny_shapes, tmp_path, monkeypatch):
    logged_tables = []

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    fake_wandb = type(sys)("wandb")
    fake_wandb.Table, fake_wandb.run = Table, object()
    fake_wandb.log = lambda values, **kwargs: logged_tables.append(values)
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="scst", reward_funcs=[caption_length],
        max_steps=1,
    )  # fmt: skip
    trainer.args.report_to = ["wandb"]  # after the callbacks are built: the real integration is not installed here
    trainer.train()
    (table,) = [values["completions"] for values in logged_tables]
    assert table.columns == ["step", "image_id", "reward", "caption_length", "caption"]
    assert len(table.data) == 3 and all(row[0] == 1 for row in table.data)


@pytest.mark.parametrize(
    ("plugins", "message"),
    [
        ({"deepspeed_plugin": object(), "fsdp_plugin": None}, r"DeepSpeed.*not supported.*fsdp.yaml"),
        (
            {"deepspeed_plugin": None, "fsdp_plugin": SimpleNamespace(fsdp_version=1)},
            r"FSDP version 1.*fsdp_version: 2",
        ),
    ],
)
def test_deepspeed_and_fsdp1_set_up_by_the_accelerate_launcher_are_refused(plugins, message):
    with pytest.raises(ValueError, match=message):
        check_data_parallel(SimpleNamespace(**plugins))


def test_ddp_and_fsdp2_pass_the_data_parallel_check(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    check_data_parallel(SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=None))
    check_data_parallel(SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=SimpleNamespace(fsdp_version=2)))


def test_fsdp_asked_of_cpu_processes_is_refused_instead_of_replicating(monkeypatch):
    # accelerate leaves CPU processes without an FSDP plugin even under `accelerate launch --use_fsdp`
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match=r"--use_fsdp.*does not shard CPU processes"):
        check_data_parallel(SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=None))


def test_rouge_l_is_one_name_for_the_reward_and_the_metric(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="scst", reward_funcs=["rouge_l"],
        eval_metrics=["rouge_l"], max_steps=1,
    )  # fmt: skip
    trainer.train()
    assert logged(trainer, "reward/rouge_l/mean")
    assert "eval_ROUGE_L" in trainer.evaluate()
    with pytest.raises(ValueError, match="Unknown reward 'rouge'.*rouge_l"):
        get_reward("rouge")


def test_rewards_get_the_image_columns_of_their_rows_and_the_batch_images_uncopied_for_all_in_order():
    pixels = torch.arange(3 * 2, dtype=torch.float32).view(3, 2)
    inputs = {
        "references": [["a"], ["b"], ["c"]], "image_id": [10, 11, 12], "pixel_values": pixels,
        "caption_input_ids": torch.zeros(5, 4), "scalar": torch.tensor(1.0),
    }  # fmt: skip
    in_order = RLCaptionTrainer._image_columns(inputs, [0, 1, 2])
    assert set(in_order) == {"image_id", "pixel_values"}
    assert in_order["pixel_values"] is pixels and in_order["image_id"] == [10, 11, 12]
    in_order["image_id"].append(13)  # a reward's own list: the batch's is untouched
    assert inputs["image_id"] == [10, 11, 12]
    chosen = RLCaptionTrainer._image_columns(inputs, [2, 0])
    assert chosen["image_id"] == [12, 10]
    torch.testing.assert_close(chosen["pixel_values"], pixels[[2, 0]])


def test_recorded_tensors_are_read_at_the_log_and_averaged_with_floats(
    tiny_model, tiny_processor, tiny_shapes, tmp_path
):
    trainer = make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="xe")
    loss = torch.tensor(2.0, requires_grad=True) * 1.5  # part of a graph: kept detached, not read in the step
    trainer.record_metric("mixed", loss)
    trainer.record_metric("mixed", 1.0)
    trainer.record_metric("mixed", torch.tensor([4.0], dtype=torch.float64))
    assert trainer._recorded_metrics["mixed"][0].requires_grad is False
    assert trainer._gathered_recorded_metrics() == {"mixed": pytest.approx((3.0 + 1.0 + 4.0) / 3)}
    with pytest.raises(ValueError, match="'per_token' must be a scalar, got a tensor of shape \\(2,\\)"):
        trainer.record_metric("per_token", torch.ones(2))
