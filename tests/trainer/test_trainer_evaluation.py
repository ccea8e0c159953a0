"""RLCaptionTrainer's evaluation and prediction: eval_loss, diversity and CLIP metrics, predict(), best-model
selection, and the checks that run before any training time is spent."""

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_rl_trainer import logged, make_trainer
from tiny_training import IMAGE_SIZE, make_tiny_model
from transformers import GenerationConfig

from rlcaption.data import CaptionCollator
from rlcaption.evaluation import caption_set_scores, caption_sets
from rlcaption.generation.decoding import generate_captions
from rlcaption.metrics import clip_retrieval, clip_score, load_clip, self_bleu, set_diversity
from rlcaption.metrics.tokenization import normalize_caption
from rlcaption.trainer import RLCaptionConfig
from tiny_clips import make_shapes_clip

DIVERSITY = ["div_1", "div_2", "mbleu_4", "self_bleu", "distinct_captions"]


def beam_captions(model, processor, split, num_beams, max_new_tokens):
    """The `num_beams` best beams of every image of `split`, by hand."""
    pixel_values = CaptionCollator(processor, tokenize_references=False)(list(split))["pixel_values"]
    beam_search = GenerationConfig(
        do_sample=False, num_beams=num_beams, num_return_sequences=num_beams, max_new_tokens=max_new_tokens
    )
    texts = generate_captions(model, processor, {"pixel_values": pixel_values}, beam_search).texts
    return [texts[row * num_beams : (row + 1) * num_beams] for row in range(split.num_rows)]


def test_eval_loss_is_the_xe_loss_of_every_reference(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    # xe_captions_per_image draws references for XE steps; evaluation scores all of them, in batches of 3
    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="xe", xe_captions_per_image=1,
        per_device_eval_batch_size=3, max_caption_length=40,
    )  # fmt: skip
    metrics = trainer.evaluate()
    batch = CaptionCollator(tiny_processor)(list(tiny_shapes["validation"]))  # one batch, every reference
    with torch.no_grad():
        expected = float(trainer.objective.compute_loss(tiny_model.eval(), batch))
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)
    assert trainer.evaluate()["eval_loss"] == metrics["eval_loss"]
    assert logged(trainer, "eval_loss") == [metrics["eval_loss"]] * 2


def test_evaluation_reports_the_diversity_metrics(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="xe", eval_num_beams=3,
        eval_metrics=["cider", *DIVERSITY],
    )  # fmt: skip
    metrics = trainer.evaluate()
    beams = beam_captions(tiny_model, tiny_processor, tiny_shapes["validation"], 3, trainer.args.max_caption_length)
    set_scores, _ = set_diversity(dict(enumerate(beams)), normalize=True)
    best = [image_beams[0] for image_beams in beams]
    for key in ("Div-1", "Div-2", "mBLEU-4"):
        assert metrics[f"eval_{key}"] == pytest.approx(set_scores[key]), key
    assert metrics["eval_Self-BLEU"] == pytest.approx(self_bleu(best, normalize=True))
    assert metrics["eval_distinct_captions"] == len({normalize_caption(caption) for caption in best})
    assert "eval_CIDEr" in metrics and "eval_Bleu_4" not in metrics


def test_evaluation_scores_caption_sets_as_seed_002s_table_4(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    trainer = make_trainer(
        tiny_model, tiny_processor, tiny_shapes, tmp_path, objective="xe", eval_caption_sets=["sample", "beam"],
        eval_caption_set_size=3, per_device_eval_batch_size=3, seed=11,
    )  # fmt: skip
    metrics = trainer.evaluate()
    split = tiny_shapes["validation"]
    for decoding in ("sample", "beam"):
        sets, references = caption_sets(
            tiny_model, tiny_processor, split, decoding, set_size=3, max_new_tokens=trainer.args.max_caption_length,
            batch_size=3, seed=11,
        )  # fmt: skip
        expected = caption_set_scores(sets, references, split)
        assert {name: metrics[f"eval_{decoding}3_{name}"] for name in expected} == pytest.approx(expected, nan_ok=True)
    # seeded: the next evaluation draws the same samples
    assert trainer.evaluate()["eval_sample3_Div-2"] == metrics["eval_sample3_Div-2"]


@pytest.mark.parametrize(("sets", "size", "message"), [(["greedy"], 5, "unknown decoding"), (["sample"], 1, ">= 2")])
def test_caption_set_options_are_checked(sets, size, message):
    with pytest.raises(ValueError, match=message):
        RLCaptionConfig(output_dir="unused", eval_caption_sets=sets, eval_caption_set_size=size)


def test_an_evaluator_clip_adds_clip_s_and_retrieval_recall(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    folder = tmp_path / "evaluator"
    make_shapes_clip(tiny_processor, image_size=IMAGE_SIZE).save_pretrained(folder)
    tiny_processor.save_pretrained(folder)
    trainer = make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, eval_clip=str(folder))
    metrics = trainer.evaluate()
    split = tiny_shapes["validation"]
    captions = trainer.predict(split).predictions
    clip = load_clip(str(folder))
    assert metrics["eval_CLIP-S"] == pytest.approx(clip_score(list(split["image"]), captions, clip)[0])
    for key, value in clip_retrieval(list(split["image"]), captions, clip).items():
        assert metrics[f"eval_{key}"] == pytest.approx(value), key


def test_an_evaluator_clip_needs_the_images(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    folder = tmp_path / "evaluator"
    make_shapes_clip(tiny_processor, image_size=IMAGE_SIZE).save_pretrained(folder)
    tiny_processor.save_pretrained(folder)
    shapes = {"train": tiny_shapes["train"], "validation": tiny_shapes["validation"].rename_column("image", "picture")}
    with pytest.raises(ValueError, match="eval_clip.*`image` column"):
        make_trainer(tiny_model, tiny_processor, shapes, tmp_path, eval_clip=str(folder))
    with pytest.raises(OSError):
        make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, eval_clip=str(tmp_path / "missing"))


@pytest.mark.parametrize("metric", ["meteor", "spice", "spider"])
def test_java_metrics_without_java_fail_when_the_trainer_is_built(
    metric, tiny_model, tiny_processor, tiny_shapes, tmp_path, monkeypatch
):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no `java` there
    with pytest.raises(RuntimeError, match=rf"eval_metrics.*'{metric}'.*No Java runtime found"):
        make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, eval_metrics=["cider", metric])


def test_predict_returns_the_captions_of_every_row(tiny_model, tiny_processor, tiny_shapes, tmp_path):
    trainer = make_trainer(tiny_model, tiny_processor, tiny_shapes, tmp_path, eval_num_beams=2)
    split = tiny_shapes["test"]
    output = trainer.predict(split)
    beams = beam_captions(tiny_model, tiny_processor, split, 2, trainer.args.max_caption_length)
    assert output.predictions == [image_beams[0] for image_beams in beams]
    assert output.label_ids == list(split["captions"])
    assert math.isfinite(output.metrics["test_CIDEr"]) and math.isfinite(output.metrics["test_loss"])
    assert output.metrics["test_num_images"] == split.num_rows
    assert not logged(trainer, "test_CIDEr")  # predict() logs nothing, as the Trainer's


@pytest.mark.parametrize("metric_for_best_model", [None, "CIDEr"])
def test_load_best_model_at_end_selects_by_loss_or_by_a_caption_metric(
    metric_for_best_model, tiny_processor, tiny_shapes, tmp_path
):
    model = make_tiny_model(tiny_processor, seed=2)
    trainer = make_trainer(
        model, tiny_processor, tiny_shapes, tmp_path, objective="xe", max_steps=3, learning_rate=5e-2,
        eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1, load_best_model_at_end=True,
        metric_for_best_model=metric_for_best_model, eval_num_beams=1,
    )  # fmt: skip
    trainer.train()
    key = "eval_loss" if metric_for_best_model is None else "eval_CIDEr"
    values = logged(trainer, key)
    assert len(values) == 3
    best_step = 1 + int(np.argmin(values) if metric_for_best_model is None else np.argmax(values))
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")
    best = load_file(f"{trainer.state.best_model_checkpoint}/model.safetensors")
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.detach(), best[name], msg=name)
