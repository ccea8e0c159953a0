"""
Every objective runs on the small interface it declares ([`TrainerInterface`]), without a trainer: a fake one decodes
with the library's decoding, rewards captions by their length, and records what the objective logs.
"""

from __future__ import annotations

import collections
import math

import pytest
import torch
from transformers import GenerationConfig, TrainerState

from rlcaption.data import CaptionCollator
from rlcaption.generation.decoding import generate_captions
from rlcaption.models import PolicyValueCaptioner, SpeakerListener
from rlcaption.objectives import (
    ActorCriticConfig,
    ActorCriticObjective,
    PSSTConfig,
    PSSTObjective,
    SCSTConfig,
    SCSTObjective,
    SLEConfig,
    SLEObjective,
    SpiderPGConfig,
    SpiderPGObjective,
    TrainerInterface,
    WTFConfig,
    WTFObjective,
    XEObjective,
)
from rlcaption.rewards import Pending
from rlcaption.rl_config import RLCaptionConfig
from tiny_captioners import make_show_tell
from tiny_clips import save_reward_clip

IMAGE_SIZE = 48  # the shapes fixture's (conftest.py)
MAX_LENGTH = 8


class FakeTrainer:
    """[`TrainerInterface`] with no Trainer behind it: one process, no wrapper, a word-count reward."""

    def __init__(self, args, model, processor, dataset):
        self.args = args
        self.state = TrainerState(global_step=0)
        self.model = model
        self.processing_class = processor
        self.eos_token_id = processor.tokenizer.eos_token_id
        self.train_dataset = dataset
        self.data_collator = CaptionCollator(processor, max_length=args.max_caption_length + 1)
        self.metrics = collections.defaultdict(list)
        self.objective = None

    def unwrap_model(self, model):
        return model

    def _decode(self, image_inputs, **settings):
        config = GenerationConfig(max_new_tokens=self.args.max_caption_length, **settings)
        return generate_captions(self.model, self.processing_class, image_inputs, config)

    def sample_captions(self, image_inputs, num_return_sequences, trim=True):  # trims always, as step-by-step decoding
        return self._decode(image_inputs, do_sample=True, num_return_sequences=num_return_sequences)

    def greedy_captions(self, image_inputs):
        return self._decode(image_inputs, do_sample=False)

    def sample_and_greedy_captions(self, image_inputs, num_return_sequences, trim=True):
        return self.sample_captions(image_inputs, num_return_sequences), self.greedy_captions(image_inputs)

    def beam_search_captions(self, image_inputs, num_beams):
        return self._decode(image_inputs, do_sample=False, num_beams=num_beams)

    def compute_rewards(self, completions, inputs, row_index, log_prefix="reward"):
        rewards = torch.tensor([0.1 * len(text.split()) for text in completions], dtype=torch.float64).numpy()
        self.record_metric(log_prefix, float(rewards.mean()))
        return rewards

    def start_rewards(self, completions, inputs, row_index, log_prefix="reward", completion_ids=None):
        # computed and logged only when the objective asks for the result, as rewards in worker processes are
        return Pending(lambda: self.compute_rewards(completions, inputs, row_index, log_prefix))

    def record_metric(self, name, value):
        self.metrics[name].append(value)

    def reference_token_log_probs(self, image_inputs, sequences, image_index=None):  # the KL penalty's: beta is 0 here
        raise NotImplementedError

    def auxiliary_network(self, name):
        return self.objective.auxiliary_networks()[name].module


def test_the_fake_trainer_has_the_whole_interface():
    members = {name for name in dir(TrainerInterface) if not name.startswith("_")} | set(
        TrainerInterface.__annotations__
    )
    assert members <= set(dir(FakeTrainer)) | set(FakeTrainer.__init__.__code__.co_names)


@pytest.fixture(scope="module")
def reward_clip(tmp_path_factory, shapes):
    captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
    return save_reward_clip(tmp_path_factory.mktemp("reward-clip"), captions)


def show_tell(processor):
    return make_show_tell(processor, IMAGE_SIZE, dropout=0.2)


# objective class, config class, fields, model, the metrics its step must record
CASES = {
    "xe": (XEObjective, RLCaptionConfig, {}, show_tell, set()),
    "scst": (
        SCSTObjective, SCSTConfig, {"entropy_bonus_weight": 0.01}, show_tell,
        {"reward", "greedy", "advantage_std", "entropy"},
    ),
    "sle": (SLEObjective, SLEConfig, {}, show_tell, {"reward", "greedy", "pairwise_distance"}),
    "spider_pg": (
        SpiderPGObjective, SpiderPGConfig, {"num_rollouts": 2}, show_tell,
        {"reward", "rollout", "policy_loss", "baseline_loss"},
    ),
    "wtf": (WTFObjective, WTFConfig, {"wtf_num_beams": 2, "num_mined_neighbours": 2}, show_tell, set()),
    "psst": (
        PSSTObjective, PSSTConfig, {"psst_lambda": 0.5}, lambda processor: SpeakerListener.from_speaker(
            show_tell(processor), listener_hidden_size=8, joint_embedding_size=8
        ), {"listener_loss", "listener_batch_R@1", "reward", "greedy"},
    ),
    "actor_critic": (
        ActorCriticObjective, ActorCriticConfig, {}, lambda processor: PolicyValueCaptioner.from_policy(
            show_tell(processor), value_word_embedding_size=8, value_hidden_size=8, value_mlp_hidden_size=8
        ), {"reward", "value_loss", "policy_loss"},
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_an_objective_computes_a_loss_that_trains_the_captioner_without_a_trainer(
    name, shapes, processor, reward_clip, tmp_path
):
    objective_class, config_class, fields, build_model, expected_metrics = CASES[name]
    if name == "wtf":
        fields = {**fields, "reward_clip": reward_clip}
    args = config_class(
        output_dir=str(tmp_path), use_cpu=True, objective=name, max_caption_length=MAX_LENGTH,
        num_samples_per_image=2, report_to="none", **fields,
    )  # fmt: skip
    assert type(args) is config_class and objective_class.config_class is config_class
    torch.manual_seed(0)
    model = build_model(processor).train()
    trainer = FakeTrainer(args, model, processor, shapes["train"])
    trainer.objective = objective = objective_class(trainer)
    batch = trainer.data_collator([shapes["train"][index] for index in range(4)])

    loss = objective.compute_loss(model, batch)

    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    captioner = getattr(model, "speaker", None) or getattr(model, "policy", None) or model
    assert captioner.lm_head.weight.grad is not None and captioner.lm_head.weight.grad.abs().sum() > 0
    assert expected_metrics <= set(trainer.metrics)
    for network in objective.auxiliary_networks().values():  # trained by the same loss
        assert any(parameter.grad is not None for parameter in network.module.parameters())
