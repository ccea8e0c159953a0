"""actor_critic, psst and wtf train, through RLCaptionTrainer, on region features whose count varies per image: the
collator pads them and the value network, the listener and the captioner read them through the mask."""

import math

import numpy as np
import pytest
import torch

from rlcaption.models import PolicyValueCaptioner, ShowTellRL, ShowTellRLConfig, SpeakerListener
from rlcaption.objectives.wtf import MINED_NEIGHBOURS_NAME
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_clips import save_reward_clip

FEATURE_SIZE = 12
MAX_LENGTH = 8


@pytest.fixture(scope="module")
def regions_dataset(shapes):
    """The tiny shapes training split with 1 to 5 random regions per image (`image_features`, `(N_i, 12)`); its
    images are kept for the wtf reward CLIP, which mines neighbours in its own image space."""
    generator = np.random.default_rng(0)
    counts = [1 + index % 5 for index in range(shapes["train"].num_rows)]
    regions = [generator.normal(size=(count, FEATURE_SIZE)).astype(np.float32).tolist() for count in counts]
    return shapes["train"].add_column("image_features", regions)


def regions_captioner(processor, seed: int = 0) -> ShowTellRL:
    torch.manual_seed(seed)
    tokenizer = processor.tokenizer
    config = ShowTellRLConfig(
        vocab_size=len(tokenizer), hidden_size=16, word_embedding_size=16, dropout=0.0, encoder_type="features",
        image_feature_size=FEATURE_SIZE, image_feature_layout="grid", image_attention=True,
        max_caption_length=MAX_LENGTH, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return ShowTellRL(config)


def make_trainer(model, processor, dataset, output_dir, objective, **fields) -> RLCaptionTrainer:
    args = RLCaptionConfig(
        output_dir=str(output_dir), use_cpu=True, objective=objective, per_device_train_batch_size=4, max_steps=2,
        learning_rate=1e-2, save_strategy="no", logging_steps=1, disable_tqdm=True, max_caption_length=MAX_LENGTH,
        seed=0, **fields,
    )  # fmt: skip
    reward_funcs = [word_count_reward] if objective == "actor_critic" else None
    return RLCaptionTrainer(
        model=model, args=args, processing_class=processor, train_dataset=dataset, reward_funcs=reward_funcs
    )


def word_count_reward(completions, **columns):
    return [0.1 * len(completion.split()) for completion in completions]


def parameters_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().clone() for name, parameter in module.named_parameters()}


def changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(before[name], parameter) for name, parameter in module.named_parameters())


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def one_image_padded(dataset) -> tuple[dict, dict]:
    """The first image of `dataset` alone, and with 3 extra padded regions of large noise."""
    regions = torch.tensor(dataset[0]["image_features"])[None]  # (1, N, D)
    padding = 100 * torch.randn(1, 3, FEATURE_SIZE, generator=torch.Generator().manual_seed(5))
    mask = torch.cat([torch.ones(1, regions.shape[1]), torch.zeros(1, 3)], dim=1).long()
    return {"image_features": regions}, {
        "image_features": torch.cat([regions, padding], 1),
        "image_feature_mask": mask,
    }


def test_actor_critic_trains_the_policy_and_value_network_on_regions(processor, regions_dataset, tmp_path):
    model = PolicyValueCaptioner.from_policy(
        regions_captioner(processor), value_word_embedding_size=8, value_hidden_size=8, value_mlp_hidden_size=8
    )
    policy, value_network = parameters_of(model.policy), parameters_of(model.value_network)
    trainer = make_trainer(
        model, processor, regions_dataset.remove_columns("image"), tmp_path, "actor_critic",
        num_samples_per_image=2, value_learning_rate=5e-3,
    )  # fmt: skip
    trainer.train()
    assert changed(policy, model.policy) and changed(value_network, model.value_network)
    assert all(math.isfinite(value) for value in logged(trainer, "loss")) and len(logged(trainer, "loss")) == 2
    alone, padded = one_image_padded(regions_dataset)
    caption = torch.tensor([[processor.tokenizer.bos_token_id, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(model.value(input_ids=caption, **padded), model.value(input_ids=caption, **alone))


def test_psst_trains_the_speaker_and_listener_on_regions(processor, regions_dataset, tmp_path):
    model = SpeakerListener.from_speaker(regions_captioner(processor), listener_hidden_size=8, joint_embedding_size=8)
    speaker, listener = parameters_of(model.speaker), parameters_of(model.listener)
    trainer = make_trainer(
        model, processor, regions_dataset.remove_columns("image"), tmp_path, "psst", num_samples_per_image=2
    )
    trainer.train()
    assert changed(speaker, model.speaker) and changed(listener, model.listener)
    assert all(math.isfinite(value) for value in logged(trainer, "loss")) and len(logged(trainer, "loss")) == 2
    alone, padded = one_image_padded(regions_dataset)
    with torch.no_grad():
        torch.testing.assert_close(model.embed_images(**padded), model.embed_images(**alone))


def test_wtf_trains_a_regions_captioner_and_its_discriminator(processor, shapes, regions_dataset, tmp_path):
    captions = [caption for references in shapes["train"]["captions"] for caption in references]
    reward_clip = save_reward_clip(tmp_path / "reward-clip", captions)
    model = regions_captioner(processor)
    captioner = parameters_of(model)
    trainer = make_trainer(
        model, processor, regions_dataset, tmp_path / "run", "wtf", reward_clip=reward_clip, wtf_num_beams=2,
        num_mined_neighbours=2, discriminator_learning_rate=1e-2,
    )  # fmt: skip
    discriminator = parameters_of(trainer.objective.discriminator)
    trainer.train()
    assert changed(captioner, model) and changed(discriminator, trainer.objective.discriminator)
    for key in ("loss", "discriminator_loss", "reward/beam", "reward/ground_truth"):
        assert all(math.isfinite(value) for value in logged(trainer, key)) and len(logged(trainer, key)) == 2, key
    assert (tmp_path / "run" / MINED_NEIGHBOURS_NAME).is_file()
    alone, padded = one_image_padded(regions_dataset)
    with torch.no_grad():
        torch.testing.assert_close(model.generate(**padded, num_beams=2), model.generate(**alone, num_beams=2))
