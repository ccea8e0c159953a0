"""
A tiny objective that uses every extension point of the trainer at once: an auxiliary network (a critic) with its own
learning rate, a pretraining phase for it, and a set-level reward. Importing this module registers it.
"""

import torch
from torch import nn

from rlcaption.generation.decoding import caption_token_mask, image_inputs_of, selective_log_softmax
from rlcaption.objectives import (
    AuxiliaryNetwork,
    CaptionObjective,
    TrainingPhase,
    policy_gradient_loss,
    register_objective,
)

CRITIC_PRETRAINING_STEPS = 2


class GroupNovelty:
    """Set-level reward: the share of a caption's words that no other caption of the same image uses."""

    __name__ = "group_novelty"

    def __init__(self):
        self.calls = []  # group sizes of every call, for the tests

    def score_groups(self, *, completions, references, **image_columns):
        self.calls.append([len(group) for group in completions])
        rewards = []
        for group in completions:
            words = [set(caption.split()) for caption in group]
            group_rewards = []
            for index, own in enumerate(words):
                others = set().union(*(other for position, other in enumerate(words) if position != index))
                group_rewards.append(len(own - others) / max(len(own), 1))
            rewards.append(group_rewards)
        return rewards

    def __call__(self, *, completions, references, **columns):
        raise TypeError("group_novelty needs the groups: call score_groups.")


@register_objective
class CriticObjective(CaptionObjective):
    """REINFORCE with a learned critic of the image's value as the baseline; the critic is pretrained first."""

    name = "test_critic"

    def __init__(self, trainer):
        super().__init__(trainer)
        hidden_size = trainer.unwrap_model(trainer.model).config.hidden_size
        self.critic = nn.Sequential(nn.Linear(hidden_size, 8), nn.Tanh(), nn.Linear(8, 1))

    def auxiliary_networks(self):
        return {"critic": AuxiliaryNetwork(self.critic, learning_rate=3e-2)}

    def phases(self):
        return [TrainingPhase("critic_pretraining", CRITIC_PRETRAINING_STEPS), TrainingPhase("joint")]

    def compute_loss(self, model, inputs):
        trainer = self.trainer
        image_inputs = image_inputs_of(inputs)
        num_images = len(inputs["references"])
        samples = trainer.sample_captions(image_inputs, num_return_sequences=2)
        image_index = torch.arange(num_images).repeat_interleave(2)
        rewards = torch.as_tensor(
            trainer.compute_rewards(samples.texts, inputs, image_index.tolist()), dtype=torch.float32
        )
        pretraining = self.current_phase().name == "critic_pretraining"
        policy = trainer.unwrap_model(model)
        with torch.no_grad() if pretraining else torch.enable_grad():
            outputs = (policy if pretraining else model)(
                **image_inputs, input_ids=samples.sequences, image_index=image_index, use_cache=False,
                output_hidden_states=True,
            )  # fmt: skip
        values = trainer.auxiliary_network("critic")(outputs.hidden_states[:, 0].detach()).squeeze(-1)  # (N,)
        critic_loss = (values - rewards).pow(2).mean()
        trainer.record_metric("critic_loss", float(critic_loss.detach()))
        if pretraining:
            return critic_loss
        token_log_probs = selective_log_softmax(outputs.logits[:, :-1], samples.sequences[:, 1:])
        mask = caption_token_mask(samples.sequences, trainer.eos_token_id)
        return policy_gradient_loss(token_log_probs, mask, rewards - values.detach(), "token") + critic_loss
