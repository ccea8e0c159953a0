"""
Where one optimizer step of every objective reads tensor values on the host.

On a GPU each read waits for the device to finish everything queued before it, and an RL step of a small captioner
is bound by the host launching kernels: a read in the middle of the step leaves the device idle while the host goes
on. CI has no GPU, so these tests list every place a step may read, with the reason, and fail at a new one.
"""

from __future__ import annotations

import pytest
import torch
from host_reads import HostReads
from objective_steps import CASES, case_id, make_step_trainer
from transformers import TrainerCallback

# `file:function` of the place that reads -> why it must, or why a GPU does not wait there
READS_ALLOWED = {
    "rlcaption/trainer/rl_trainer.py:training_step": "the loss's check, once a step, before the optimizer step",
    # decoding step by step, as on the CPU; a GPU replays these loops as CUDA graphs, which read nothing
    "rlcaption/generation/step_decoding.py:_decode_steps": "whether every caption has ended, every few tokens",
    "rlcaption/generation/step_decoding.py:_trim_after_last_end": "the longest caption's end (graphs' are untrimmed)",
    "rlcaption/objectives/spider_pg.py:_steps_dropping_finished_rows": "the rollouts still running",
    "rlcaption/models/show_tell_rl/state_show_tell_rl.py:select": "the rollouts' states still running",
    "rlcaption/objectives/spider_pg.py:rollout_prefixes": "how many rollouts the samples' lengths need",
    "rlcaption/models/show_tell_rl/modeling_show_tell_rl.py:_run_lstm": "which LSTM call the padding allows",
    "rlcaption/models/show_tell_rl/modeling_show_tell_rl.py:_is_right_padded": "which LSTM call the padding allows",
    "rlcaption/models/visual_semantic_embedding/modeling_visual_semantic_embedding.py:embed_word_vectors": (
        "the captions' lengths, which a packed GRU takes on the host"
    ),
    "rlcaption/models/visual_semantic_embedding/modeling_visual_semantic_embedding.py:get_text_features": (
        "the captions' lengths, which a packed GRU takes on the host"
    ),
    "rlcaption/models/shapes_clip/modeling_shapes_clip.py:forward": "the texts' lengths, for a packed GRU",
    "rlcaption/rewards/contrastive.py:decoupled_contrastive_rewards": "one bounds check of the texts' image rows",
    "rlcaption/objectives/wtf.py:_ground_truth": "a CPU generator's draws, and the width of the chosen references",
    # WTF's beam-searched baseline captions, through transformers' `generate`
    "transformers/generation/utils.py:generate": "transformers' beam search",
    "transformers/generation/utils.py:_prepare_special_tokens": "transformers' beam search",
    "transformers/generation/utils.py:_get_logits_processor": "transformers' beam search",
    "transformers/generation/utils.py:_beam_search": "transformers' beam search",
    "transformers/generation/utils.py:_tensor_or_none": "transformers' beam search (its special tokens, copied)",
    # made from Python ints once per device and model, at its first step: every later step finds them
    "rlcaption/models/show_tell_rl/modeling_show_tell_rl.py:never_predicted_ids": "the never-predicted ids, once",
    # the speaker's decoding for the listener passes words step by step, with gradients: no graph
    "rlcaption/objectives/word_passing.py:decode_with_word_passing": "whether all captions ended, every few tokens",
    "rlcaption/objectives/word_passing.py:_pass_words": "F.one_hot checks the ids' range (on the CPU only)",
}
# what the steps of XE, SCST and SLE may read: on a GPU, where decoding replays as graphs, the loss's check and,
# for XE, the padding's layout
DECODING_ON_THE_HOST = {
    "rlcaption/generation/step_decoding.py:_decode_steps",
    "rlcaption/generation/step_decoding.py:_trim_after_last_end",
}
CHECK_ONLY = {
    "rlcaption/trainer/rl_trainer.py:training_step",
    "rlcaption/models/show_tell_rl/modeling_show_tell_rl.py:never_predicted_ids",  # the first step's, once
}
PADDING = {
    "rlcaption/models/show_tell_rl/modeling_show_tell_rl.py:_run_lstm",
    "rlcaption/models/show_tell_rl/modeling_show_tell_rl.py:_is_right_padded",
}
READS_OF = {"xe": CHECK_ONLY | PADDING}
READS_OF |= {objective: CHECK_ONLY | DECODING_ON_THE_HOST for objective in ("scst", "sle")}


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
    places = {place for _, place in watching.watch.seen}
    assert "rlcaption/trainer/rl_trainer.py:training_step" in places  # the watch saw the step
    assert places <= READS_ALLOWED.keys(), f"new reads: {sorted(places - READS_ALLOWED.keys())}"
    if objective in READS_OF:
        assert places <= READS_OF[objective], f"{objective} reads at {sorted(places - READS_OF[objective])}"
    # the loss is read once
    assert watching.watch.seen["_local_scalar_dense", "rlcaption/trainer/rl_trainer.py:training_step"] == 1
