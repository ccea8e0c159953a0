"""
An objective in the manner of Vered et al. 2019 (PSST) built from the trainer's parts only: the speaker decodes with
differentiable word passing inside its wrapper's forward (`forward_through`), a listener is an auxiliary network, and
the listener's loss trains both.
"""

import pytest
import torch
from tiny_training import IMAGE_SIZE, make_tiny_model
from torch import nn

from rlcaption.generation.decoding import forward_through, image_inputs_of
from rlcaption.models.captions import soft_word_embeddings
from rlcaption.objectives import AuxiliaryNetwork, CaptionObjective, register_objective
from rlcaption.objectives.word_passing import decode_with_word_passing
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer


class TinyListener(nn.Module):
    """Embeds soft words (through the speaker's word embeddings) and images into one space."""

    def __init__(self, word_size: int, image_size: int, joint_size: int = 16):
        super().__init__()
        self.caption_rnn = nn.GRU(word_size, joint_size, batch_first=True)
        self.image_map = nn.Linear(image_size, joint_size)

    def forward(self, word_embeddings, pixel_values):
        _, caption = self.caption_rnn(word_embeddings)
        images = self.image_map(pixel_values.flatten(1))
        return nn.functional.normalize(caption[0], dim=-1), nn.functional.normalize(images, dim=-1)


@register_objective
class ListenerObjective(CaptionObjective):
    name = "test_listener"
    uses_rewards = False

    def __init__(self, trainer):
        super().__init__(trainer)
        config = trainer.unwrap_model(trainer.model).config
        self.listener = TinyListener(config.word_embedding_size, 3 * IMAGE_SIZE * IMAGE_SIZE)

    def auxiliary_networks(self):
        return {"listener": AuxiliaryNetwork(self.listener, learning_rate=1e-2)}

    def compute_loss(self, model, inputs):
        pixel_values = image_inputs_of(inputs)["pixel_values"]
        passed = forward_through(
            model, decode_with_word_passing, pixel_values=pixel_values, mode=self.args.word_passing, max_length=6
        )
        speaker = self.trainer.unwrap_model(model)
        words = soft_word_embeddings(passed.words, speaker.word_embeddings.weight)
        captions, images = self.trainer.auxiliary_network("listener")(words, pixel_values)
        similarities = captions @ images.T  # (B, B): each caption should pick its own image
        return nn.functional.cross_entropy(similarities / 0.1, torch.arange(len(similarities)))


@pytest.mark.parametrize("mode", ["st", "psst", "gumbel", "reinforce"])
def test_listener_loss_trains_the_speaker_through_the_passed_words(tiny_processor, tiny_shapes, tmp_path, mode):
    model = make_tiny_model(tiny_processor)
    args = RLCaptionConfig(
        output_dir=str(tmp_path), use_cpu=True, objective="test_listener", per_device_train_batch_size=4,
        max_steps=2, learning_rate=1e-2, save_strategy="no", logging_steps=1, disable_tqdm=True,
    )  # fmt: skip
    args.word_passing = mode
    trainer = RLCaptionTrainer(
        model=model, args=args, processing_class=tiny_processor, train_dataset=tiny_shapes["train"]
    )
    speaker_before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    listener_before = {name: tensor.clone() for name, tensor in trainer.auxiliary_state_dict().items()}
    trainer.train()
    # the speaker learns only through the words it passed: its LSTM and vocabulary projection changed, except with
    # REINFORCE's plain one-hots, which carry no gradient
    changed = [name for name, weights in model.named_parameters() if not torch.equal(speaker_before[name], weights)]
    learned = any(name.startswith("lm_head") for name in changed) and any(name.startswith("lstm") for name in changed)
    assert learned == (mode != "reinforce")
    listener_after = trainer.auxiliary_state_dict()
    assert all(not torch.equal(listener_before[name], listener_after[name]) for name in listener_after)
