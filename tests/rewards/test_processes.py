"""Rewards computed in worker processes (`RewardMix.use_processes`): the same values as in the training process, only
for the rewards that score each caption on its own, and errors that name the problem as they would in process."""

import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from rlcaption.data import load_shapes
from rlcaption.rewards import CiderReward, RewardMix


def process_id(*, completions, references, **columns):
    """Where each row was scored."""
    return [float(os.getpid())] * len(completions)


process_id.scores_captions_independently = True


def process_id_of_pixels(*, completions, references, pixel_values=None, **columns):
    return [float(os.getpid())] * len(completions)


process_id_of_pixels.scores_captions_independently = True


def rows_in_call(*, completions, references, **columns):
    """How many rows the call that scored each row had."""
    return [float(len(completions))] * len(completions)


rows_in_call.scores_captions_independently = True


def opened_gate(*, completions, references, gate, **columns):
    """1.0 for every row if the training process opened the `gate` file while the call waited for it (a minute)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [float(os.path.exists(gate))] * len(completions)


opened_gate.scores_captions_independently = True


class SlowToCopy:
    """`process_id`, whose copy takes a worker process two seconds to read: the processes start late."""

    scores_captions_independently = True

    def __call__(self, *, completions, references, **columns):
        return process_id(completions=completions, references=references)

    def __reduce__(self):
        return _arrive_late, (2.0,)


def _arrive_late(seconds):
    time.sleep(seconds)
    return SlowToCopy()


class UnreadableInProcesses:
    """`process_id`, whose copy a worker process cannot read: the processes fail to start."""

    scores_captions_independently = True

    def __call__(self, *, completions, references, **columns):
        return process_id(completions=completions, references=references)

    def __reduce__(self):
        return _refuse_to_load, ()


def _refuse_to_load():
    raise ImportError("no module named 'reward_dependency'")


def caption_length(*, completions, references, **columns):
    return [float(len(completion.split())) for completion in completions]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    train = load_shapes(
        num_train=48, num_validation=4, num_test=4, image_size=48, cache_dir=tmp_path_factory.mktemp("shapes")
    )["train"]
    references = train["captions"][:40]
    generator = np.random.default_rng(0)
    # each image's captions: some of its references, others', cut short, and one empty; 8 different ones, so that no
    # reward is computed once for several rows (see test_mix.py) and the 320 rows are split over the processes
    pool = [caption for captions in references for caption in captions]
    completions = []
    for captions in references:
        picks = [pool[int(generator.integers(len(pool)))] for _ in range(4)]
        candidates = [captions[0], picks[0], " ".join(captions[1].split()[:3]), "", *picks[1:], captions[2]]
        group = list(dict.fromkeys(candidates))  # a pick may be one of the image's own captions
        completions.append(group + [f"{captions[3]} {count}" for count in range(8 - len(group))])
    return train, completions, references, list(range(40))


@pytest.fixture(scope="module")
def mixes(batch):
    """The same prepared mix twice: one scoring in process, one with two worker processes."""
    train = batch[0]
    funcs = ["cider", "bleu", "rouge_l", process_id, process_id_of_pixels, rows_in_call, caption_length]
    in_process, in_processes = RewardMix(funcs), RewardMix(funcs)
    for mix in (in_process, in_processes):
        mix.prepare(train)
    chosen = in_processes.use_processes(2)
    assert in_processes.wait_for_processes(timeout=120)
    yield in_process, in_processes, chosen
    in_processes.close()


def test_only_rewards_that_score_each_caption_on_their_own_are_split(mixes):
    _, _, chosen = mixes
    assert chosen == ["cider", "bleu_4", "rouge_l", "process_id", "process_id_of_pixels", "rows_in_call"]
    # CIDEr-D with document frequencies from each call's references depends on the other rows of the call
    assert RewardMix([CiderReward()]).use_processes(2) == []


def test_processes_give_the_same_rewards_in_the_same_order(mixes, batch):
    in_process, in_processes, _ = mixes
    _, completions, references, image_ids = batch
    expected_total, expected = in_process.score_groups(
        completions=completions, references=references, image_id=image_ids
    )
    total, components = in_processes.score_groups(completions=completions, references=references, image_id=image_ids)
    for name in ("cider", "bleu_4", "rouge_l", "caption_length"):
        np.testing.assert_array_equal(components[name], expected[name])
    assert components["cider"].std() > 0.1  # the rewards differ from row to row: the order is checked
    # the 320 rows were split in two calls, scored in the worker processes, none here
    assert set(components["rows_in_call"]) == {160.0} and set(expected["rows_in_call"]) == {320.0}
    assert os.getpid() not in components["process_id"]
    assert os.getpid() not in components["process_id_of_pixels"]
    changed = ("process_id", "process_id_of_pixels", "rows_in_call")
    np.testing.assert_allclose(
        total - sum(components[name] for name in changed), expected_total - sum(expected[name] for name in changed)
    )


def test_calls_before_the_processes_have_started_are_scored_here(batch):
    _, completions, references, image_ids = batch
    mix = RewardMix([SlowToCopy()])
    assert mix.use_processes(2) == ["SlowToCopy"]
    try:
        # training goes on while the processes read their copy of the reward
        _, components = mix.score_groups(completions=completions, references=references, image_id=image_ids)
        assert set(components["SlowToCopy"]) == {float(os.getpid())}
        assert mix.wait_for_processes(timeout=120)
        _, components = mix.score_groups(completions=completions, references=references, image_id=image_ids)
        assert os.getpid() not in components["SlowToCopy"]
    finally:
        mix.close()
    for worker in set(components["SlowToCopy"]):  # closing ended the processes
        with pytest.raises(ProcessLookupError):
            os.kill(int(worker), 0)


def test_rewards_in_processes_run_on_while_the_caller_goes_on(batch, tmp_path):
    _, completions, references, image_ids = batch
    mix = RewardMix([opened_gate])
    mix.use_processes(2)
    gate = tmp_path / "gate"
    try:
        assert mix.wait_for_processes(timeout=120)
        pending = mix.submit_groups(completions=completions, references=references, image_id=image_ids, gate=str(gate))
        gate.touch()  # reached while the processes wait for it, only if submitting did not wait for them
        _, components = pending.result()
    finally:
        mix.close()
    assert set(components["opened_gate"]) == {1.0}


def test_processes_that_could_not_start_are_named_at_the_next_call(batch):
    _, completions, references, image_ids = batch
    mix = RewardMix([UnreadableInProcesses()])
    mix.use_processes(2)
    try:
        assert mix.wait_for_processes(timeout=120)
        with pytest.raises(RuntimeError, match="reward 'UnreadableInProcesses' stopped or could not start"):
            mix.score_groups(completions=completions[:1], references=references[:1], image_id=image_ids[:1])
    finally:
        mix.close()


def test_processes_are_refused_to_a_worker_process_still_starting(monkeypatch):
    # what a worker sees while it imports a training script that lacks the main guard
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match='needs the `if __name__ == "__main__":` guard'):
        RewardMix(["bleu"]).use_processes(2)


@pytest.mark.slow
def test_a_script_without_the_main_guard_trains_in_one_process_only(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import os\n"
        "from rlcaption.rewards import BleuReward, RewardProcesses\n"
        "processes = RewardProcesses([BleuReward()], 1)\n"
        "processes.wait_started(120)\n"
        "print('training in', os.getpid(), flush=True)\n"
        "processes.submit(0, ['a dog'], [['a dog runs']]).result()\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert result.stdout.count("training in") == 1
    assert 'needs the `if __name__ == "__main__":` guard' in result.stderr
    assert "reward 'bleu_4' stopped or could not start" in result.stderr


def test_a_reward_that_reads_an_image_tensor_stays_in_the_training_process(mixes, batch):
    _, in_processes, _ = mixes
    _, completions, references, image_ids = batch
    pixel_values = torch.zeros(len(references), 3, 2, 2)
    _, components = in_processes.score_groups(
        completions=completions, references=references, image_id=image_ids, pixel_values=pixel_values
    )
    assert set(components["process_id_of_pixels"]) == {float(os.getpid())}
    assert os.getpid() not in components["process_id"]


def test_a_call_too_small_to_gain_from_processes_is_scored_here(mixes, batch):
    _, in_processes, _ = mixes
    _, completions, references, image_ids = batch
    _, components = in_processes.score_groups(
        completions=completions[:10], references=references[:10], image_id=image_ids[:10]
    )
    assert set(components["process_id"]) == {float(os.getpid())} and set(components["rows_in_call"]) == {80.0}


def test_a_reward_error_in_a_process_names_the_problem_as_in_process(mixes, batch):
    in_process, in_processes, _ = mixes
    _, completions, references, image_ids = batch
    bad_references = [list(captions) for captions in references]
    bad_references[-1][0] = 7
    with pytest.raises(ValueError) as in_process_error:
        in_process.score_groups(completions=completions, references=bad_references, image_id=image_ids)
    with pytest.raises(ValueError) as in_processes_error:
        in_processes.score_groups(completions=completions, references=bad_references, image_id=image_ids)
    assert str(in_processes_error.value) == str(in_process_error.value)


def test_a_reward_that_cannot_be_copied_into_processes_is_named():
    def local_reward(*, completions, references, **columns):
        return [0.0] * len(completions)

    local_reward.scores_captions_independently = True
    with pytest.raises(ValueError, match="'local_reward' cannot be copied into worker processes"):
        RewardMix([local_reward]).use_processes(2)
