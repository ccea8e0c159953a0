"""RL training with the captioner fully sharded by accelerate's FSDP2, on two CPU processes (gloo)."""

import json
from pathlib import Path

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


# scst samples, scores and updates the sharded model; xe's teacher forcing is the same forward without sampling
@pytest.mark.parametrize("objective", [pytest.param("xe", marks=pytest.mark.slow), "scst"])
def test_objectives_train_a_fully_sharded_captioner_on_two_cpu_processes(tmp_path, objective):
    result = launch_fsdp(tmp_path / "out", tmp_path / "cache", objective)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_trained_fully_sharded(reports_of(tmp_path / "out"))


@pytest.mark.slow
def test_a_fully_sharded_scst_run_killed_after_a_checkpoint_resumes_as_if_never_stopped(tmp_path):
    cache = tmp_path / "cache"
    straight = launch_fsdp(tmp_path / "straight", cache, "scst")
    assert straight.returncode == 0, straight.stderr[-4000:]
    # killed at the end of step 2, before its checkpoint: the newest complete one is step 1's
    killed = launch_fsdp(tmp_path / "killed", cache, "scst", "2")
    assert killed.returncode != 0
    assert not (tmp_path / "killed" / "rank0.json").exists()
    assert last_complete_checkpoint(str(tmp_path / "killed")).endswith("checkpoint-1")
    resumed = launch_fsdp(tmp_path / "killed", cache, "scst")
    assert resumed.returncode == 0, resumed.stderr[-4000:]

    expected, actual = reports_of(tmp_path / "straight"), reports_of(tmp_path / "killed")
    assert_trained_fully_sharded(actual)
    assert all(report["resumed"] for report in actual)
    assert actual[0]["captioner"] == expected[0]["captioner"]
    assert actual[0]["losses"] == expected[0]["losses"]


@pytest.mark.slow  # the refusal itself is tested without launching in test_rl_trainer.py
def test_an_objective_with_an_auxiliary_network_is_refused_under_fsdp_on_two_processes(tmp_path):
    result = launch_fsdp(tmp_path / "out", tmp_path / "cache", "test_critic")
    assert result.returncode != 0
    assert "The 'test_critic' objective trains the auxiliary networks ['critic']" in result.stderr, result.stderr[
        -4000:
    ]
    assert "Train this objective with DDP" in result.stderr
