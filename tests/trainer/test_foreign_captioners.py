"""
RLCaptionTrainer trains and evaluates transformers captioners rlcaption did not write — ViT + GPT-2, ViT + BERT, BLIP,
GIT, each with its own processor — as it does ShowTellRL; RL sampling and scoring use the same distribution.
"""

import copy
import math

import pytest
import torch
from tiny_training import IMAGE_SIZE, make_tiny_model
from transformers import GPT2Config, GPT2LMHeadModel

from rlcaption.evaluation import caption_dataset
from rlcaption.objectives import scst as scst_module
from rlcaption.objectives import xe as xe_module
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import FOREIGN_CAPTIONERS, make_foreign_captioner

CAPTIONERS = (*FOREIGN_CAPTIONERS, "show_tell")
OBJECTIVES = {
    "xe": {"objective": "xe"},
    "scst_greedy": {"objective": "scst", "baseline": "greedy"},
    "scst_mean_of_others": {"objective": "scst", "baseline": "mean_of_others"},
}
# float32 forward passes of the same captions, batched differently
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def make_trainer(model, processor, dataset, tmp_path, **overrides):
    settings = {
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "max_steps": 2,
        "learning_rate": 1e-2,
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "max_caption_length": 10,
        "num_samples_per_image": 3,
        "eval_num_beams": 2,
        "eval_metrics": ["cider", "bleu"],
        "seed": 0,
    }
    settings.update(overrides)
    return RLCaptionTrainer(
        model=model,
        args=RLCaptionConfig(**settings),
        processing_class=processor,
        train_dataset=dataset["train"],
        eval_dataset=dataset["validation"],
    )


@pytest.fixture(scope="module")
def train_captions(tiny_shapes):
    return [caption for captions in tiny_shapes["train"]["captions"] for caption in captions]


def build_captioner(kind, tiny_processor, train_captions, dropout: float = 0.0):
    if kind == "show_tell":
        return make_tiny_model(tiny_processor, dropout=dropout), tiny_processor
    return make_foreign_captioner(kind, train_captions, IMAGE_SIZE)


def teacher_forced_log_probs(kind, model, pixel_values, input_ids):
    """
    `log p(input_ids[:, t + 1] | input_ids[:, :t + 1], image)` by each family's own forward pass, written out here
    independently of rlcaption's adapters: `(N, T - 1)`.
    """
    if kind == "show_tell":
        logits = model(input_ids=input_ids, pixel_values=pixel_values, use_cache=False).logits
    elif kind in ("vit_gpt2", "vit_bert"):
        logits = model(pixel_values=pixel_values, decoder_input_ids=input_ids).logits
    elif kind == "blip":
        logits = model(pixel_values=pixel_values, input_ids=input_ids).logits
    else:  # GIT: one sequence of image tokens, then the caption; its own loss skips the image positions so
        num_image_tokens = model.git.encoder.layer[0].attention.self.image_patch_tokens
        logits = model(pixel_values=pixel_values, input_ids=input_ids).logits[:, num_image_tokens:]
    log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return log_probs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def start_and_end_tokens(kind, model) -> tuple[int, int]:
    """The tokens each family starts and ends its captions with, as its `generate` does."""
    if kind == "blip":  # BLIP's generate starts with the text decoder's bos and stops at its sep token
        return model.config.text_config.bos_token_id, model.config.text_config.sep_token_id
    generation_config = model.generation_config
    start = generation_config.decoder_start_token_id if kind.startswith("vit") else generation_config.bos_token_id
    return start, generation_config.eos_token_id


class LossInputs:
    """Records what the objective's loss function is given: the log-probabilities (or logits) it uses."""

    def __init__(self, function):
        self.function = function
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append(args)
        return self.function(*args, **kwargs)


def record_samples(trainer):
    """The sampled sequences of every sampling call (with its greedy baseline or without)."""
    recorded = []
    sample_captions, sample_and_greedy_captions = trainer.sample_captions, trainer.sample_and_greedy_captions

    def recording(*args, **kwargs):
        samples = sample_captions(*args, **kwargs)
        recorded.append(samples.sequences)
        return samples

    def recording_with_greedy(*args, **kwargs):
        samples, greedy = sample_and_greedy_captions(*args, **kwargs)
        recorded.append(samples.sequences)
        return samples, greedy

    trainer.sample_captions, trainer.sample_and_greedy_captions = recording, recording_with_greedy
    return recorded


def parameters_of(model):
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


def objective_log_probs_match_teacher_forcing(kind, trainer, model, monkeypatch):
    """Checks one batch: the log-probabilities the objective's loss uses equal a teacher-forced forward pass."""
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    model.train()
    if trainer.args.objective == "xe":
        loss_inputs = LossInputs(xe_module.label_smoothed_cross_entropy)
        monkeypatch.setattr(xe_module, "label_smoothed_cross_entropy", loss_inputs)
        trainer.compute_loss(model, batch)
        logits, targets = loss_inputs.calls[0]
        input_ids, index = batch["caption_input_ids"], batch["caption_image_index"]
        # every reference starts with the model's start token and ends with its end token
        start, end = start_and_end_tokens(kind, model)
        lengths = batch["caption_attention_mask"].sum(dim=1)
        assert input_ids[:, 0].eq(start).all()
        assert input_ids.gather(1, (lengths - 1)[:, None]).eq(end).all()
        scored = targets != -100
        used = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    else:
        loss_inputs = LossInputs(scst_module.policy_gradient_loss)
        monkeypatch.setattr(scst_module, "policy_gradient_loss", loss_inputs)
        sampled = record_samples(trainer)
        trainer.compute_loss(model, batch)
        used, mask = loss_inputs.calls[0][:2]
        input_ids = sampled[0]
        index = torch.arange(len(batch["references"])).repeat_interleave(trainer.args.num_samples_per_image)
        scored = mask.bool()
        model.eval()  # the distribution that sampled the captions
    assert used.shape == (input_ids.size(0), input_ids.size(1) - 1)  # caption tokens only (no image positions)
    with torch.no_grad():
        expected = teacher_forced_log_probs(kind, model, batch["pixel_values"][index], input_ids)
    torch.testing.assert_close(used.detach()[scored], expected[scored], **TOLERANCE)


@pytest.mark.parametrize("objective", list(OBJECTIVES))
@pytest.mark.parametrize("kind", CAPTIONERS)
def test_captioner_trains_and_evaluates(
    kind, objective, tiny_processor, train_captions, tiny_shapes, tmp_path, monkeypatch
):
    model, processor = build_captioner(kind, tiny_processor, train_captions)
    trainer = make_trainer(model, processor, tiny_shapes, tmp_path, **OBJECTIVES[objective])

    with monkeypatch.context() as patch:
        objective_log_probs_match_teacher_forcing(kind, trainer, model, patch)

    before = parameters_of(model)
    trainer.train()
    losses = [entry[f"loss_{trainer.args.objective}"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert [name for name, parameter in model.named_parameters() if not torch.equal(before[name], parameter)]

    metrics = trainer.evaluate()
    assert metrics["eval_num_images"] == tiny_shapes["validation"].num_rows
    assert math.isfinite(metrics["eval_CIDEr"]) and 0.0 <= metrics["eval_Bleu_4"] <= 1.0


def test_mixed_precision_covers_sampling_and_scoring_of_a_foreign_captioner(
    tiny_processor, train_captions, tiny_shapes, tmp_path
):
    model, processor = build_captioner("blip", tiny_processor, train_captions)
    trainer = make_trainer(model, processor, tiny_shapes, tmp_path, objective="scst", bf16=True, max_steps=1)
    # of a linear layer's output: autocast computes it in bf16 (a layer norm's in float32)
    vision_output_dtypes, text_output_dtypes = [], []
    model.vision_model.encoder.layers[0].mlp.fc1.register_forward_hook(
        lambda module, args, output: vision_output_dtypes.append(output.dtype)
    )
    model.text_decoder.bert.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda module, args, output: text_output_dtypes.append(output.dtype)
    )
    trainer.train()
    # the images encoded once for the samples and the greedy baseline (the decoding loop calls the vision model
    # directly), then once for the scoring pass
    assert len(vision_output_dtypes) == 2
    assert set(vision_output_dtypes) == {torch.bfloat16}
    # every decoding step of the samples and the baseline, and the scoring pass
    assert len(text_output_dtypes) > 3
    assert set(text_output_dtypes) == {torch.bfloat16}


def test_scst_scores_samples_under_the_distribution_that_sampled_them(
    tiny_processor, tiny_shapes, tmp_path, monkeypatch
):
    # heavy dropout: a scoring pass in another network state than sampling gives other log-probabilities
    model = make_tiny_model(tiny_processor, dropout=0.5)
    trainer = make_trainer(model, tiny_processor, tiny_shapes, tmp_path, objective="scst", baseline="mean_of_others")
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    # the logits each sampled token was drawn from (temperature 1, no top-k/top-p: the model's distribution), as the
    # decoding loop reads them step by step
    step_logits, samples = [], []
    step, sample_captions = model.step, trainer.sample_captions

    def recording_step(*args, **kwargs):
        logits, top_hidden, state = step(*args, **kwargs)
        step_logits.append(logits)
        return logits, top_hidden, state

    def recording_sample_captions(*args, **kwargs):
        step_logits.clear()
        samples.append(sample_captions(*args, **kwargs))
        return samples[-1]

    monkeypatch.setattr(model, "step", recording_step)
    monkeypatch.setattr(trainer, "sample_captions", recording_sample_captions)
    loss_inputs = LossInputs(scst_module.policy_gradient_loss)
    monkeypatch.setattr(scst_module, "policy_gradient_loss", loss_inputs)
    model.train()  # as during training
    trainer.compute_loss(model, batch)

    (generated,) = samples
    sequences = generated.sequences
    used, mask = loss_inputs.calls[0][:2]
    length = sequences.shape[1] - 1  # the loop may decode a few steps past the end of the last caption
    sampling_log_probs = torch.log_softmax(torch.stack(step_logits[:length], dim=1).float(), dim=-1)
    sampled = sampling_log_probs.gather(-1, sequences[:, 1:, None]).squeeze(-1)
    assert mask.sum() > 0
    torch.testing.assert_close(used.detach()[mask.bool()], sampled[mask.bool()], **TOLERANCE)
    assert model.training  # the training mode is restored after sampling and scoring


def test_rl_sampling_ignores_the_checkpoint_generation_settings(tiny_processor, train_captions, tiny_shapes, tmp_path):
    model, processor = make_foreign_captioner("vit_gpt2", train_captions, IMAGE_SIZE)
    reference = copy.deepcopy(model)
    # settings a Hub checkpoint may carry for its own demo; RL must sample the policy itself
    hub_settings = {
        "repetition_penalty": 3.0, "no_repeat_ngram_size": 1, "min_new_tokens": 5, "max_new_tokens": 2,
        "bad_words_ids": [[5], [6]], "forced_eos_token_id": 7, "suppress_tokens": [8, 9], "top_k": 3,
        "temperature": 0.3, "num_beams": 4,
    }  # fmt: skip
    for name, value in hub_settings.items():
        setattr(model.generation_config, name, value)
    pixel_values = {"pixel_values": torch.randn(3, 3, IMAGE_SIZE, IMAGE_SIZE)}
    results = []
    for captioner in (model, reference):
        trainer = make_trainer(captioner, processor, tiny_shapes, tmp_path, objective="scst", max_caption_length=8)
        torch.manual_seed(4)
        sampled = trainer.sample_captions(pixel_values, num_return_sequences=2).sequences
        greedy = trainer.greedy_captions(pixel_values).sequences
        results.append((sampled, greedy))
    for ours, plain in zip(*results, strict=True):
        assert torch.equal(ours, plain)
    assert results[0][0].size(1) > 3  # max_caption_length=8 won over the checkpoint's max_new_tokens=2


def test_rl_top_k_and_top_p_restrict_sampling(tiny_processor, tiny_shapes, tmp_path):
    model = make_tiny_model(tiny_processor, seed=2)
    pixel_values = {"pixel_values": torch.randn(4, 3, IMAGE_SIZE, IMAGE_SIZE)}
    greedy = make_trainer(model, tiny_processor, tiny_shapes, tmp_path, objective="scst").greedy_captions(pixel_values)
    for settings in ({"top_k": 1}, {"top_p": 1e-6}):
        trainer = make_trainer(model, tiny_processor, tiny_shapes, tmp_path, objective="scst", **settings)
        sampled = trainer.sample_captions(pixel_values, num_return_sequences=3)
        # keeping only the most likely token samples the greedy caption, three times
        assert sampled.texts == [text for text in greedy.texts for _ in range(3)], settings


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"top_k": -1}, "top_k must be >= 0"), ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"), ({"top_p": 1.5}, "top_p")],
)
def test_rl_sampling_settings_are_validated(settings, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, **settings)


def test_evaluation_without_an_image_id_column_scores_every_image(tiny_processor, tiny_shapes, tmp_path):
    model = make_tiny_model(tiny_processor)
    split = tiny_shapes["validation"].remove_columns(["image_id", "scene"])
    trainer = make_trainer(model, tiny_processor, tiny_shapes, tmp_path, per_device_eval_batch_size=3)
    metrics = trainer.evaluate(split)
    assert metrics["eval_num_images"] == split.num_rows
    predictions, references = caption_dataset(model, tiny_processor, split, batch_size=3, max_new_tokens=6)
    assert len(predictions) == len(references) == split.num_rows
    assert [references[key] for key in sorted(references)] == split["captions"]


def test_a_model_without_a_known_caption_layout_is_refused(tiny_processor, tiny_shapes, tmp_path):
    text_only = GPT2LMHeadModel(GPT2Config(vocab_size=20, n_embd=8, n_layer=1, n_head=2, n_positions=16))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*no image input"):
        make_trainer(text_only, tiny_processor, tiny_shapes, tmp_path)
