import math

import pytest
import torch
from transformers import GenerationConfig, TrainerCallback

import rlcaption.objectives.psst  # noqa: F401  (registers the `psst` objective)
from rlcaption.data import CaptionCollator
from rlcaption.evaluation import caption_dataset, listener_recall
from rlcaption.metrics import clip_retrieval, evaluate_captions
from rlcaption.models import SpeakerListener
from rlcaption.objectives.psst import (
    annealed_gumbel_temperature,
    vse_hardest_negative_losses,
    vse_mean_violation_losses,
)
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import make_show_tell
from tiny_clips import make_shapes_clip

IMAGE_SIZE = 48
MAX_LENGTH = 8
WORD_PASSING_MODES = ["st", "psst", "gumbel", "st_gumbel", "psst_gumbel", "reinforce"]


def make_speaker_listener(processor, seed: int = 0) -> SpeakerListener:
    speaker = make_show_tell(processor, IMAGE_SIZE, seed=seed)
    return SpeakerListener.from_speaker(speaker, listener_hidden_size=16, joint_embedding_size=16)


def make_trainer(processor, shapes, output_dir, model=None, **fields) -> RLCaptionTrainer:
    fields = {"max_steps": 3, **fields}
    args = RLCaptionConfig(
        output_dir=str(output_dir), use_cpu=True, objective="psst", per_device_train_batch_size=4,
        learning_rate=1e-2, save_strategy="no", logging_steps=1, disable_tqdm=True, num_samples_per_image=2,
        max_caption_length=MAX_LENGTH, **fields,
    )  # fmt: skip
    model = make_speaker_listener(processor) if model is None else model
    return RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=shapes["train"])


def gradient_size(module: torch.nn.Module) -> float:
    return sum(float(p.grad.abs().sum()) for p in module.parameters() if p.grad is not None)


def test_vse_loss_matches_a_hand_computation():
    # rows are captions, columns images; caption i describes image i
    similarities = torch.tensor(
        [
            [0.9, -0.2, -0.5],
            [0.1, 0.4, 0.3],
            [-0.6, 0.7, 0.8],
        ],
        requires_grad=True,
    )
    losses = vse_hardest_negative_losses(similarities)
    # caption 0: hardest other caption of image 0 is caption 1 (0.1): 1 - 0.9 + 0.1 = 0.2; hardest other image of
    #            caption 0 is image 1 (-0.2): 1 - 0.9 - 0.2 < 0, no loss
    # caption 1: caption 2 for image 1 (0.7): 1 - 0.4 + 0.7 = 1.3; image 2 for caption 1 (0.3): 0.9
    # caption 2: caption 1 for image 2 (0.3): 1 - 0.8 + 0.3 = 0.5; image 1 for caption 2 (0.7): 0.9
    torch.testing.assert_close(losses, torch.tensor([0.2, 2.2, 1.4]))
    # only the positives and the hardest negatives of active hinges get a gradient
    losses.sum().backward()
    expected_gradient = torch.tensor(
        [
            [-1.0, 0.0, 0.0],
            [1.0, -2.0, 2.0],
            [0.0, 2.0, -2.0],
        ]
    )
    torch.testing.assert_close(similarities.grad, expected_gradient)


def test_mean_violation_loss_matches_a_hand_computation():
    similarities = torch.tensor([[0.9, -0.2, -0.5], [0.1, 0.4, 0.3], [-0.6, 0.7, 0.8]])
    # caption k's loss: its hinges against the other images (row k) plus image k's against the other captions
    # (column k), over the 2 negatives of each:
    #   row 0: 0 + 0; row 1: (1 - 0.4 + 0.1) + (1 - 0.4 + 0.3) = 1.6; row 2: 0 + (1 - 0.8 + 0.7) = 0.9
    #   column 0: (1 - 0.9 + 0.1) + 0 = 0.2; column 1: (1 - 0.4 - 0.2) + (1 - 0.4 + 0.7) = 1.7; column 2: 0 + 0.5
    torch.testing.assert_close(vse_mean_violation_losses(similarities), torch.tensor([0.1, 1.65, 0.7]))
    assert vse_mean_violation_losses(torch.tensor([[0.3]])).tolist() == [0.0]


def test_listener_pretraining_trains_the_listener_alone_then_both_learn(processor, shapes, tmp_path):
    pretraining = make_trainer(processor, shapes, tmp_path / "a", listener_pretraining_steps=2, max_steps=2)
    speaker_before = {name: tensor.clone() for name, tensor in pretraining.model.speaker.state_dict().items()}
    listener_before = {name: tensor.clone() for name, tensor in pretraining.model.listener.state_dict().items()}
    pretraining.train()
    assert all(torch.equal(speaker_before[name], t) for name, t in pretraining.model.speaker.state_dict().items())
    listener_after = pretraining.model.listener.state_dict()
    assert any(not torch.equal(listener_before[name], tensor) for name, tensor in listener_after.items())
    phases = {entry["objective_phase"] for entry in pretraining.state.log_history if "objective_phase" in entry}
    assert phases == {0}  # listener_pretraining, the first phase

    joint = make_trainer(processor, shapes, tmp_path / "b", listener_pretraining_steps=2, max_steps=3)
    joint.train()
    changed = [
        name for name, t in joint.model.speaker.state_dict().items() if not torch.equal(speaker_before[name], t)
    ]
    assert any(name.startswith("lstm") for name in changed)


def test_a_fixed_pretrained_speaker_encoder_becomes_the_listeners_fixed_encoder(processor, tmp_path):
    speaker = make_show_tell(processor, IMAGE_SIZE, seed=3)
    speaker.freeze_image_encoder(True)
    model = SpeakerListener.from_speaker(speaker, listener_hidden_size=16, joint_embedding_size=16)
    assert model.config.freeze_listener_image_encoder
    for name, tensor in speaker.image_encoder.state_dict().items():
        assert torch.equal(model.listener.image_encoder.state_dict()[name], tensor)
    assert not any(p.requires_grad for p in model.listener.image_encoder.parameters())
    assert all(p.requires_grad for p in model.listener.caption_rnn.parameters())
    model.save_pretrained(tmp_path / "saved")
    loaded = SpeakerListener.from_pretrained(tmp_path / "saved")
    assert not any(p.requires_grad for p in loaded.listener.image_encoder.parameters())
    # a trainable speaker encoder is no pretrained feature extractor: the listener learns its own
    fresh = SpeakerListener.from_speaker(make_show_tell(processor, IMAGE_SIZE, seed=3), joint_embedding_size=16)
    assert not fresh.config.freeze_listener_image_encoder
    assert all(p.requires_grad for p in fresh.listener.image_encoder.parameters())


def test_vse_loss_of_a_batch_of_one_is_zero_with_a_finite_gradient():
    similarity = torch.tensor([[0.3]], requires_grad=True)
    loss = vse_hardest_negative_losses(similarity)
    loss.sum().backward()
    assert loss.tolist() == [0.0]
    assert similarity.grad.tolist() == [[0.0]]


@pytest.mark.parametrize("mode", WORD_PASSING_MODES)
def test_listener_loss_reaches_the_speaker_through_the_words_except_in_reinforce(processor, shapes, tmp_path, mode):
    trainer = make_trainer(processor, shapes, tmp_path, psst_lambda=1.0, psst_mode=mode)
    model = trainer.model.train()
    batch = trainer.data_collator(list(shapes["train"].select(range(4))))
    torch.manual_seed(0)
    terms = trainer.objective.discriminability_terms(model, batch)
    assert terms.listener_losses.shape == (4,)
    terms.listener_losses.mean().backward()
    speaker = model.speaker
    # the listener trains in every mode
    assert gradient_size(model.listener) > 0
    if mode == "reinforce":
        # REINFORCE trains the speaker by its reward alone: the listener's loss reaches no speaker parameter
        assert all(p.grad is None or not p.grad.any() for p in speaker.parameters())
    else:
        # through the passed words, and through the word embeddings the listener reads
        for part in (speaker.lstm, speaker.lm_head, speaker.image_encoder, speaker.word_embeddings):
            assert gradient_size(part) > 0
        assert terms.speaker_policy_loss is None
        return
    # REINFORCE with the negated listener loss as reward is the speaker's only way to learn from the listener
    model.zero_grad()
    terms.speaker_policy_loss.backward()
    assert gradient_size(speaker.lstm) > 0 and gradient_size(speaker.lm_head) > 0


class ParameterSnapshots(TrainerCallback):
    """The speaker's and the listener's parameters after every optimizer step."""

    def __init__(self, model):
        self.model = model
        self.snapshots = [self.snapshot()]

    def snapshot(self):
        return {
            part: {name: tensor.clone() for name, tensor in getattr(self.model, part).state_dict().items()}
            for part in ("speaker", "listener")
        }

    def on_step_end(self, args, state, control, **kwargs):
        self.snapshots.append(self.snapshot())

    def changed(self, step: int) -> set[str]:
        """The networks whose parameters optimizer step `step` (1-based) changed."""
        before, after = self.snapshots[step - 1], self.snapshots[step]
        return {
            part
            for part in ("speaker", "listener")
            if any(not torch.equal(before[part][name], after[part][name]) for name in before[part])
        }


@pytest.mark.parametrize("mode", ["psst", "reinforce"])
def test_alternating_schedule_trains_only_the_network_whose_turn_it_is(processor, shapes, tmp_path, mode):
    trainer = make_trainer(
        processor, shapes, tmp_path, psst_lambda=0.5, psst_mode=mode, psst_schedule="alternating",
        alternating_listener_steps=1, alternating_speaker_steps=2, max_steps=4,
    )  # fmt: skip
    snapshots = ParameterSnapshots(trainer.model)
    trainer.add_callback(snapshots)
    trainer.train()
    turns = [snapshots.changed(step) for step in range(1, 5)]
    assert turns == [{"listener"}, {"speaker"}, {"speaker"}, {"listener"}]
    logged = [entry["speaker_turn"] for entry in trainer.state.log_history if "speaker_turn" in entry]
    assert logged == [0.0, 1.0, 1.0, 0.0]


def test_joint_schedule_trains_both_networks_in_every_step(processor, shapes, tmp_path):
    trainer = make_trainer(processor, shapes, tmp_path, psst_lambda=0.5, psst_mode="psst", max_steps=2)
    snapshots = ParameterSnapshots(trainer.model)
    trainer.add_callback(snapshots)
    trainer.train()
    assert [snapshots.changed(step) for step in (1, 2)] == [{"speaker", "listener"}] * 2


def test_annealed_gumbel_temperature_follows_jang_et_al_schedule():
    # τ = max(0.5, exp(−r t)), updated every N steps
    assert annealed_gumbel_temperature(0, rate=1e-3, interval=100) == 1.0
    assert annealed_gumbel_temperature(99, rate=1e-3, interval=100) == 1.0
    assert annealed_gumbel_temperature(100, rate=1e-3, interval=100) == pytest.approx(math.exp(-0.1))
    assert annealed_gumbel_temperature(250, rate=1e-3, interval=100) == pytest.approx(math.exp(-0.2))
    assert annealed_gumbel_temperature(10_000, rate=1e-3, interval=100) == 0.5
    assert annealed_gumbel_temperature(0, initial_temperature=2.0, min_temperature=0.1) == 2.0


def test_training_logs_the_annealed_gumbel_temperature_of_every_step(processor, shapes, tmp_path):
    trainer = make_trainer(
        processor, shapes, tmp_path, psst_lambda=0.5, psst_mode="st_gumbel", gumbel_temperature_schedule="annealed",
        gumbel_annealing_rate=0.3, gumbel_annealing_interval=1, gumbel_min_temperature=0.6, max_steps=3,
    )  # fmt: skip
    trainer.train()
    logged = [entry["gumbel_temperature"] for entry in trainer.state.log_history if "gumbel_temperature" in entry]
    assert logged == pytest.approx([1.0, math.exp(-0.3), 0.6])


def test_constant_gumbel_temperature_stays(processor, shapes, tmp_path):
    trainer = make_trainer(processor, shapes, tmp_path, psst_lambda=0.5, psst_mode="gumbel", gumbel_temperature=0.7)
    trainer.state.global_step = 10_000
    assert trainer.objective.gumbel_temperature() == 0.7


def test_psst_mode_passes_the_full_distribution_at_about_rho_of_the_steps(processor, shapes, tmp_path):
    trainer = make_trainer(processor, shapes, tmp_path, psst_lambda=1.0, psst_mode="psst", psst_rho=0.5)
    batch = trainer.data_collator(list(shapes["train"].select(range(8))))
    torch.manual_seed(0)
    share = trainer.objective.discriminability_terms(trainer.model, batch).soft_step_share
    assert 0.25 < share < 0.75


@pytest.mark.parametrize("mode", ["psst", "reinforce"])
def test_training_changes_the_speaker_and_the_listener_and_saves_the_listener(processor, shapes, tmp_path, mode):
    trainer = make_trainer(processor, shapes, tmp_path / "run", psst_lambda=0.5, psst_mode=mode)
    model = trainer.model
    listener = model.listener
    # the listener is trained in its own optimizer group, never in the model's
    assert not {id(p) for p in listener.parameters()} & {id(p) for p in model.parameters()}
    speaker_before = {name: tensor.clone() for name, tensor in model.speaker.state_dict().items()}
    listener_before = {name: tensor.clone() for name, tensor in listener.state_dict().items()}
    output = trainer.train()
    assert math.isfinite(output.training_loss)

    speaker_after = model.speaker.state_dict()
    changed = [name for name, tensor in speaker_after.items() if not torch.equal(speaker_before[name], tensor)]
    assert any(name.startswith("lstm") for name in changed) and any(name.startswith("lm_head") for name in changed)
    assert all(not torch.equal(listener_before[name], tensor) for name, tensor in listener.state_dict().items())
    [listener_group] = [group for group in trainer.optimizer.param_groups if group.get("name") == "auxiliary/listener"]
    assert listener_group["initial_lr"] == trainer.args.listener_learning_rate
    logged = trainer.state.log_history[0]
    for name in ("listener_loss", "listener_batch_R@1", "soft_step_share", "reward", "loss_psst"):
        assert math.isfinite(logged[name]), name

    # the final save holds the trained listener, as the trainer's checkpoints of it do
    trainer.save_model(str(tmp_path / "final"))
    saved = SpeakerListener.from_pretrained(tmp_path / "final")
    for name, tensor in trainer.auxiliary_state_dict().items():
        assert torch.equal(saved.listener.state_dict()[name.removeprefix("listener.")], tensor)


def test_psst_refuses_a_captioner_without_a_listener(processor, shapes, tmp_path):
    with pytest.raises(ValueError, match="SpeakerListener.from_speaker"):
        make_trainer(processor, shapes, tmp_path, model=make_show_tell(processor, IMAGE_SIZE))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(psst_lambda=1.5), "psst_lambda"),
        (dict(psst_mode="straight_through"), "psst_mode"),
        (dict(psst_rho=-0.1), "psst_rho"),
        (dict(gumbel_temperature=0.0), "gumbel_temperature"),
        (dict(listener_learning_rate=0.0), "listener_learning_rate"),
        (dict(gumbel_temperature_schedule="linear"), "gumbel_temperature_schedule"),
        (dict(gumbel_annealing_interval=0), "gumbel_annealing_interval"),
        (dict(gumbel_min_temperature=2.0), "gumbel_min_temperature"),
        (dict(psst_schedule="turns"), "psst_schedule"),
        (dict(psst_schedule="alternating", psst_lambda=0.0), "psst_lambda"),
        (dict(alternating_speaker_steps=0), "alternating_speaker_steps"),
    ],
)
def test_config_rejects_bad_psst_fields(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, objective="psst", **fields)


def test_rank_images_agrees_with_listener_recall_on_a_split(processor, shapes):
    model = make_speaker_listener(processor).eval()
    split = shapes["validation"]
    ks = tuple(range(1, len(split)))  # every cut-off: the whole distribution of ranks must agree
    clip = (make_shapes_clip(processor, image_size=IMAGE_SIZE), processor)
    scores = listener_recall(model, processor, split, ks=ks, clip=clip, batch_size=3)

    batch = CaptionCollator(processor, tokenize_references=False)(list(split))
    with torch.no_grad():
        captions = model.generate(pixel_values=batch["pixel_values"], do_sample=False)  # greedy, the speaker's length
        similarities = model.rank_images(captions, batch["pixel_values"])  # (N, N)
    own = similarities.diagonal()
    ranks = (similarities >= own[:, None]).sum(dim=1) - 1  # other images at least as similar: ties count against
    for k in ks:
        assert scores[f"listener_R@{k}"] == pytest.approx(float((ranks < k).float().mean()))

    texts = [text.strip() for text in processor.batch_decode(captions, skip_special_tokens=True)]
    clip_scores = clip_retrieval(list(split["image"]), texts, clip, ks=ks)
    for k in ks:
        assert scores[f"clip_R@{k}"] == pytest.approx(clip_scores[f"t2i_R@{k}"])


def test_listener_recall_ranks_the_captions_whose_cider_the_trainer_reports(processor, shapes, tmp_path):
    trainer = make_trainer(processor, shapes, tmp_path, eval_num_beams=3, eval_metrics=["cider"])
    model = trainer.model.eval()
    split = shapes["validation"]
    ks = tuple(range(1, len(split)))
    reported = trainer.evaluate(split, metric_key_prefix="test")
    beam = listener_recall(
        model, processor, split, ks=ks, num_beams=3, max_new_tokens=MAX_LENGTH, caption_metrics=["cider"]
    )
    # the same beam-3 captions on both axes: their CIDEr-D is the trainer's, their recall is theirs
    assert beam["CIDEr"] == pytest.approx(reported["test_CIDEr"])
    batch = CaptionCollator(processor, tokenize_references=False)(list(split))
    with torch.no_grad():
        captions = model.generate(pixel_values=batch["pixel_values"], num_beams=3, do_sample=False,
                                  max_new_tokens=MAX_LENGTH)  # fmt: skip
        similarities = model.rank_images(captions, batch["pixel_values"])  # (N, N)
    texts = [text.strip() for text in processor.batch_decode(captions, skip_special_tokens=True)]
    trainer_captions, _ = trainer.caption_dataset(split)
    assert texts == [trainer_captions[image_id] for image_id in split["image_id"]]
    ranks = (similarities >= similarities.diagonal()[:, None]).sum(dim=1) - 1
    for k in ks:
        assert beam[f"listener_R@{k}"] == pytest.approx(float((ranks < k).float().mean()))

    greedy = listener_recall(
        model, processor, split, num_beams=1, max_new_tokens=MAX_LENGTH, caption_metrics=["cider"]
    )
    greedy_captions, references = caption_dataset(
        model, processor, split, generation_config=GenerationConfig(do_sample=False, max_new_tokens=MAX_LENGTH)
    )
    assert greedy["CIDEr"] == pytest.approx(evaluate_captions(greedy_captions, references, ["cider"])["CIDEr"])
