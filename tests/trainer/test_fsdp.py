"""RL training with the captioner fully sharded by accelerate's FSDP2, on two CPU processes (gloo)."""

import json
from pathlib import Path

import numpy as np
import pytest
from accelerate_launch import launch_on_two_processes

from rlcaption.trainer import last_complete_checkpoint

FSDP_CONFIG = str(Path(__file__).parents[2] / "examples" / "accelerate" / "fsdp.yaml")
STEPS = 3  # two_process_fsdp.MAX_STEPS


def launch_fsdp(output_dir: Path, cache_dir: Path, objective: str, *kill_at_step: str):
    return launch_on_two_processes(
        "two_process_fsdp.py", str(output_dir), str(cache_dir), objective, *kill_at_step, config_file=FSDP_CONFIG
    )


def reports_of(output_dir: Path) -> list[dict]:
    return [json.loads((output_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def assert_trained_fully_sharded(reports: list[dict]) -> None:
    for report in reports:
        assert report["world_size"] == 2
        assert report["distributed_type"] == "DistributedType.FSDP"
        # every parameter is a shard: each process holds about half the captioner, the two together all of it
        assert report["sharded"]
        assert report["local_numel"] < report["full_numel"]
        assert report["changed"]
        assert report["final_step"] == STEPS
        assert len(report["losses"]) == STEPS and report["losses_finite"]
        # the last checkpoint holds the whole captioner, loadable with from_pretrained
        assert report["saved_model_is_the_trained_one"]
    assert reports[0]["local_numel"] + reports[1]["local_numel"] == reports[0]["full_numel"]
    # the shards gathered give the same captioner on both processes
    assert reports[0]["captioner"] == reports[1]["captioner"]
    assert reports[0]["losses"] == reports[1]["losses"]


# scst samples, scores and updates the sharded model; xe's teacher forcing is the same forward without sampling. The
# main suite samples and trains under FSDP in the test_critic case of the comparison with DDP below.
@pytest.mark.slow
@pytest.mark.parametrize("objective", ["xe", "scst"])
def test_objectives_train_a_fully_sharded_captioner_on_two_cpu_processes(tmp_path, objective):
    result = launch_fsdp(tmp_path / "out", tmp_path / "cache", objective)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_trained_fully_sharded(reports_of(tmp_path / "out"))


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["scst", "test_critic"])  # test_critic: with its critic and its optimizer
def test_a_fully_sharded_run_killed_after_a_checkpoint_resumes_as_if_never_stopped(tmp_path, objective):
    cache = tmp_path / "cache"
    straight = launch_fsdp(tmp_path / "straight", cache, objective)
    assert straight.returncode == 0, straight.stderr[-4000:]
    # killed at the end of step 2, before its checkpoint: the newest complete one is step 1's
    killed = launch_fsdp(tmp_path / "killed", cache, objective, "2")
    assert killed.returncode != 0
    assert not (tmp_path / "killed" / "rank0.json").exists()
    assert last_complete_checkpoint(str(tmp_path / "killed")).endswith("checkpoint-1")
    resumed = launch_fsdp(tmp_path / "killed", cache, objective)
    assert resumed.returncode == 0, resumed.stderr[-4000:]

    expected, actual = reports_of(tmp_path / "straight"), reports_of(tmp_path / "killed")
    assert_trained_fully_sharded(actual)
    assert all(report["resumed"] for report in actual)
    assert actual[0]["captioner"] == expected[0]["captioner"]
    assert actual[0]["auxiliary"] == expected[0]["auxiliary"]
    assert actual[0]["losses"] == expected[0]["losses"]


# each trains its auxiliary network alone for a step or two, then with the captioner: test_critic's critic, spider_pg's
# baseline, actor_critic's value network and psst's listener (each taken out of the model it trains), wtf's
# discriminator
@pytest.mark.parametrize(
    ("objective", "network"),
    [
        ("test_critic", "critic"),
        pytest.param("psst", "listener", marks=pytest.mark.slow),
        pytest.param("spider_pg", "baseline", marks=pytest.mark.slow),
        pytest.param("actor_critic", "value", marks=pytest.mark.slow),
        pytest.param("wtf", "discriminator", marks=pytest.mark.slow),
    ],
)
def test_an_objective_with_an_auxiliary_network_trains_as_under_ddp(tmp_path, objective, network):
    """Under FSDP the captioner is sharded and the auxiliary network has an optimizer of its own; under DDP both are
    replicas in one optimizer. The same two processes on the same batches must train the same weights.

    One checkpoint, at the end: a sharded checkpoint written while the captioner has no optimizer state yet (in its
    objective's pretraining phase) has torch's distributed checkpointing create that state with a step of zero
    gradients, and Adam then counts one step more for the captioner than DDP does."""
    without_checkpoints_before_the_end = ("0", str(STEPS))
    result = launch_fsdp(tmp_path / "fsdp", tmp_path / "cache", objective, *without_checkpoints_before_the_end)
    assert result.returncode == 0, result.stderr[-4000:]
    reports = reports_of(tmp_path / "fsdp")
    assert_trained_fully_sharded(reports)
    auxiliary = [report["auxiliary"][network] for report in reports]
    assert all(weights["changed"] for weights in auxiliary)
    assert auxiliary[0]["weights"] == auxiliary[1]["weights"]  # its gradients were averaged over both processes
    assert set(reports[0]["auxiliary_optimizer_steps"]) == {STEPS}

    ddp = launch_on_two_processes(
        "two_process_fsdp.py",
        str(tmp_path / "ddp"),
        str(tmp_path / "cache"),
        objective,
        *without_checkpoints_before_the_end,
    )
    assert ddp.returncode == 0, ddp.stderr[-4000:]
    replicated = reports_of(tmp_path / "ddp")[0]
    assert replicated["distributed_type"] == "DistributedType.MULTI_CPU"
    tolerance = {"rtol": 1e-4, "atol": 1e-6}
    np.testing.assert_allclose(reports[0]["captioner"], replicated["captioner"], **tolerance)
    np.testing.assert_allclose(auxiliary[0]["weights"], replicated["auxiliary"][network]["weights"], **tolerance)
    np.testing.assert_allclose(reports[0]["losses"], replicated["losses"], **tolerance)
