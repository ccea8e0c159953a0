import json

import pytest
from accelerate_launch import launch_on_two_processes

from rlcaption.trainer import last_complete_checkpoint


def test_scst_runs_in_two_cpu_processes_with_synchronised_weights(tmp_path):
    result = launch_on_two_processes("two_process_training.py", str(tmp_path / "out"), str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads((tmp_path / "out" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["world_size"] == 2
        assert report["backend"] == "gloo"
        assert report["changed"]
        # every validation image is captioned once, whichever process captioned it
        assert report["eval_num_images"] == 6
    # DDP keeps the replicas identical after the updates
    assert reports[0]["parameter_sum"] == pytest.approx(reports[1]["parameter_sum"], rel=0, abs=1e-9)


# slow: resuming every auxiliary phase is tested on one process in each objective's tests; here on two
@pytest.mark.slow
def test_auxiliary_network_phases_and_set_reward_survive_a_kill_on_two_processes(tmp_path):
    cache = str(tmp_path / "cache")
    straight = launch_on_two_processes("two_process_resume.py", str(tmp_path / "straight"), cache)
    assert straight.returncode == 0, straight.stderr[-4000:]
    # killed at the end of step 3, in joint training, after the critic's pretraining phase (steps 1-2)
    killed = launch_on_two_processes("two_process_resume.py", str(tmp_path / "killed"), cache, "3")
    assert killed.returncode != 0
    assert not (tmp_path / "killed" / "rank0.json").exists()
    assert last_complete_checkpoint(str(tmp_path / "killed")).endswith("checkpoint-2")
    resumed = launch_on_two_processes("two_process_resume.py", str(tmp_path / "killed"), cache)
    assert resumed.returncode == 0, resumed.stderr[-4000:]

    expected = [json.loads((tmp_path / "straight" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    actual = [json.loads((tmp_path / "killed" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert all(report["world_size"] == 2 for report in expected + actual)
    assert all(report["resumed"] for report in actual)
    # each process's set-level reward saw its 2 images with their 2 samples each, every image once
    assert expected[0]["group_sizes"] == [[2, 2]]
    for part in ("captioner", "critic", "optimizer"):
        assert expected[0][part] == expected[1][part], f"{part}: replicas differ"
        assert actual[0][part] == actual[1][part], f"{part}: replicas differ after the resume"
        assert actual[0][part] == expected[0][part], f"{part}: the resumed run differs from the uninterrupted one"


@pytest.mark.slow
def test_recorded_metrics_are_averaged_over_processes(tmp_path):
    result = launch_on_two_processes("two_process_metrics.py", str(tmp_path / "out"), str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        report = json.loads((tmp_path / "out" / f"rank{rank}.json").read_text())
        assert report["world_size"] == 2
        # one training log per step, on every process: the mean of the two processes' indices
        assert report["process_index"] == [0.5, 0.5]
        # a metric one process records is averaged over its values alone, and logged by both
        assert report["only_on_process_1"] == [4.0, 4.0]
        # an undefined (NaN) value is left out of the mean, and a metric with no other value out of the log
        assert report["undefined_on_process_0"] == [6.0, 6.0]
        assert report["undefined_everywhere_logged"] is False
        # evaluation logs in between take no part in the gathering
        assert report["eval_logs"] == 2


@pytest.mark.parametrize(
    ("what_goes_bad", "error"),
    [
        ("reward", "ValueError: Reward function"),
        pytest.param("loss", "RuntimeError: The 'scst' loss is nan", marks=pytest.mark.slow),
    ],
)
def test_a_failure_on_one_process_stops_every_process_with_its_message(what_goes_bad, error, tmp_path):
    result = launch_on_two_processes(
        "two_process_bad_reward.py", str(tmp_path / "out"), str(tmp_path / "cache"), what_goes_bad
    )
    assert result.returncode != 0
    # both processes raise (instead of one waiting in the next all-reduce), each with process 1's message
    stopped = f"Training stopped on every process at step 0: process 1 failed with {error}"
    assert result.stderr.count(stopped) == 2, result.stderr[-4000:]
    if what_goes_bad == "reward":  # the message names the reward and the caption
        assert "'length_unless_on_process_1' returned non-finite values [nan] at image_id" in result.stderr
        assert "completion 0 ('" in result.stderr
