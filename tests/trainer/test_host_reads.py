"""
Where one optimizer step of every objective reads tensor values on the host.

On a GPU each read waits for the device to finish everything queued before it, and an RL step of a small captioner
is bound by the host launching kernels: a read in the middle of the step leaves the device idle while the host goes
on. CI has no GPU, so these tests count the reads of one step of each objective, and fail at a new one.
"""

from __future__ import annotations

import pytest
import torch
from host_reads import HostReads
from objective_steps import CASES, case_id, make_step_trainer
from transformers import TrainerCallback

# The most host reads one optimizer step of each objective makes (tiny models, captions of at most a few words): the
# loss's check once a step; for the objectives that decode, whether every caption has ended, every few tokens, for the
# samples and for a greedy baseline (a GPU replays these loops as CUDA graphs, which read nothing); for spider_pg the
# rollouts still running at each prefix; for wtf the beam-searched baseline captions of transformers' `generate` and
# the ground-truth draws; for psst the word-passing decoding, step by step with gradients (no graph); for actor_critic
# the value network's padding. A new read fails here; a read removed lowers its objective's number.
READ_BUDGET = {
    "xe": 4,
    "scst": 8,
    "sle": 8,
    "spider_pg": 43,
    "wtf": 35,
    "psst": 29,
    "actor_critic": 8,
}


class WatchOneStep(TrainerCallback):
    """Watches the last optimizer step of the run: the step after a pretraining phase's, when there is one."""

    def __init__(self):
        self.watch = HostReads()

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == args.max_steps - 1:
            self.watch.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == args.max_steps:
            self.watch.__exit__(None, None, None)


def test_the_watch_sees_a_scalar_read_and_a_boolean_selection_but_not_an_integer_index():
    values = torch.arange(6.0)
    with HostReads() as watch:
        float(values.sum())
        values[values > 2]
        values[torch.tensor([0, 5])]
        values.repeat_interleave(2)
        torch.tensor([1, 2]).repeat_interleave(torch.tensor([2, 1]), output_size=3)
        torch.as_tensor([1.0, 2.0], device=values.device)  # a copy from the host on a GPU
        torch.as_tensor(values, device=values.device)  # already a tensor: no copy from the host
    assert sorted(name for name, _ in watch.seen) == ["_local_scalar_dense", "copy_from_host", "index"]
    assert sum(watch.seen.values()) == 3
    assert torch.as_tensor.__module__ == "torch"  # given back


@pytest.mark.parametrize(
    ("objective", "fields", "kind"),
    [pytest.param(*case, kinds[0], id=case_id(*case, kinds[0])) for *case, kinds in CASES],
)
def test_a_step_reads_the_device_only_where_it_must(
    objective, fields, kind, tiny_processor, tiny_shapes, reward_clip, embedding_model, tmp_path
):
    trainer = make_step_trainer(
        objective, fields, kind, tiny_processor, tiny_shapes, tmp_path, reward_clip, embedding_model,
        logging_steps=1000,  # the log reads the recorded metrics, all at once: not at every step
    )  # fmt: skip
    watching = WatchOneStep()
    trainer.add_callback(watching)
    trainer.train()
    reads = sum(watching.watch.seen.values())
    assert reads > 0, "the watch saw no step"  # at least the loss's check
    where = "\n".join(f"{count} x {operator} at {place}" for (operator, place), count in watching.watch.seen.items())
    budget = READ_BUDGET[objective]
    assert reads <= budget, f"{objective} reads {reads} times, above its {budget}:\n{where}"
