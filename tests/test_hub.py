import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file

from rlcaption.cli import main as cli_main
from rlcaption.data import load_shapes
from rlcaption.hub import caption_eval_results, publish_folder, render_model_card
from rlcaption.models import ShowTellRL, ShowTellRLConfig
from rlcaption.processing import CaptionProcessor

REPO_ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO_ROOT / "checkpoints" / "show-tell-rl-shapes-spider-pg-cider"
HUB_ID = "rlcaption/show-tell-rl-shapes-spider-pg-cider"
SCORES = {"CIDEr": 1.25, "Bleu_4": 0.5, "ROUGE_L": 0.625, "METEOR": 0.375}


def tiny_model() -> ShowTellRL:
    torch.manual_seed(0)
    config = ShowTellRLConfig(
        vocab_size=30,
        hidden_size=16,
        word_embedding_size=16,
        image_size=16,
        cnn_channels=[4, 8],
        baseline_hidden_size=8,
    )
    return ShowTellRL(config)


def render(**overrides):
    fields = dict(
        repo_id="org/show-tell-rl-test",
        scores=SCORES,
        dataset_type="shapes",
        dataset_name="shapes",
        model_summary="A test captioner.",
        training_summary="Trained for a test.",
        training_settings={"objective": "`spider_pg`", "rollouts per prefix (K)": 3},
        evaluation_summary="Beam search on the test split.",
        limitations="None known.",
    )
    fields.update(overrides)
    return render_model_card(tiny_model(), **fields)


# ---------------------------------------------------------------- model cards


def test_model_card_carries_the_scores_in_its_metadata_and_its_table(tmp_path):
    render().save(tmp_path / "README.md")
    card = ModelCard.load(tmp_path / "README.md")  # what the Hub parses
    results = {result.metric_name: result for result in card.data.eval_results}
    assert {name: result.metric_value for name, result in results.items()} == {
        "CIDEr-D": 1.25, "BLEU-4": 0.5, "ROUGE-L": 0.625, "METEOR": 0.375,
    }  # fmt: skip
    assert results["CIDEr-D"].metric_type == "cider" and results["BLEU-4"].metric_type == "bleu"
    assert all(result.dataset_split == "test" and result.task_type == "image-to-text" for result in results.values())
    assert card.data.model_name == "show-tell-rl-test"
    assert card.data.pipeline_tag == "image-to-text" and card.data.library_name == "rlcaption"
    for row in ("| CIDEr-D | 1.250 |", "| BLEU-4 | 0.500 |", "| rollouts per prefix (K) | 3 |"):
        assert row in card.text, row
    assert 'ShowTellRL.from_pretrained("org/show-tell-rl-test")' in card.text
    parameters = sum(parameter.numel() for parameter in tiny_model().parameters())
    assert f"{parameters / 1e3:.0f}k parameters" in card.text


def test_eval_results_reject_unknown_metric_keys():
    with pytest.raises(ValueError, match=r"\['CIDEr-D'\].*Bleu_4"):
        caption_eval_results({"CIDEr-D": 1.0}, dataset_type="shapes", dataset_name="shapes")


def test_scene_grounding_scores_reach_the_card_and_supports_do_not(tmp_path):
    scores = {**SCORES, "object_f1": 0.875, "generic_share": 0.125, "relation_accuracy": float("nan"),
              "num_captions": 500.0, "color_precision": 0.9}  # fmt: skip
    render(scores=scores).save(tmp_path / "README.md")
    card = ModelCard.load(tmp_path / "README.md")
    values = {result.metric_name: result.metric_value for result in card.data.eval_results}
    assert values["Object F1 (colour+shape)"] == 0.875 and values["Generic captions"] == 0.125
    # nan (nothing to count) and support counts are not results
    assert "Relation accuracy" not in values and not any("500" in str(value) for value in values.values())
    assert "| Object F1 (colour+shape) | 0.875 |" in card.text


def test_a_custom_template_is_filled(tmp_path):
    template = tmp_path / "card.md"
    rows = "{% for name, value in scores.items() %}{{ name }}={{ value }};{% endfor %}"
    template.write_text("---\n{{ card_data }}\n---\n\n# {{ model_name }}\n" + rows + "\n")
    card = render(template_path=template)
    assert "# show-tell-rl-test" in card.content
    # in the COCO evaluation code's order
    assert "BLEU-4=0.5;METEOR=0.375;ROUGE-L=0.625;CIDEr-D=1.25;" in card.content


def test_publish_folder_needs_a_saved_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        publish_folder(tmp_path, "org/name")


# ---------------------------------------------------------------- the published checkpoint


@pytest.fixture(scope="module")
def shapes_image(tmp_path_factory):
    """A test-split image of the shapes dataset at the checkpoint's resolution, as a PNG file, and its references."""
    config = ShowTellRLConfig.from_pretrained(CHECKPOINT)
    shapes = load_shapes(8, 4, 4, image_size=config.image_size, seed=123, cache_dir=tmp_path_factory.mktemp("shapes"))
    path = tmp_path_factory.mktemp("images") / "scene.png"
    shapes["test"][0]["image"].save(path)
    return path


def test_checkpoint_folder_is_hub_ready_and_small():
    names = {path.name for path in CHECKPOINT.iterdir()}
    expected = {"config.json", "model.safetensors", "generation_config.json", "processor_config.json", "README.md"}
    assert expected <= names
    assert "tokenizer.json" in names or "tokenizer_config.json" in names
    assert not {"training_args.bin", "optimizer.pt"} & names  # nothing of the training run
    size = sum(path.stat().st_size for path in CHECKPOINT.rglob("*") if path.is_file())
    assert size < 20 * 2**20
    weights = load_file(str(CHECKPOINT / "model.safetensors"))
    assert any(name.startswith("baseline_head") for name in weights)  # the seed 000 baseline is part of the model


def test_checkpoint_card_reports_its_evaluation():
    card = ModelCard.load(CHECKPOINT / "README.md")
    scores = {result.metric_name: result.metric_value for result in card.data.eval_results}
    assert {"CIDEr-D", "BLEU-4", "ROUGE-L", "METEOR"} <= set(scores)
    assert all(0.0 < value for value in scores.values())
    assert f'ShowTellRL.from_pretrained("{HUB_ID}")' in card.text
    assert "spider_pg" in card.text and "cider" in card.text


def _caption(model, processor, image_path, num_beams=3):
    from PIL import Image

    inputs = processor(images=Image.open(image_path).convert("RGB"), return_tensors="pt")
    with torch.no_grad():
        sequences = model.generate(pixel_values=inputs["pixel_values"], num_beams=num_beams, max_length=21)
    return processor.batch_decode(sequences, skip_special_tokens=True)[0].strip()


def test_checkpoint_loads_from_its_folder_and_captions_shapes(shapes_image):
    model = ShowTellRL.from_pretrained(CHECKPOINT).eval()
    processor = CaptionProcessor.from_pretrained(CHECKPOINT)
    caption = _caption(model, processor, shapes_image)
    words = caption.split()
    vocabulary = processor.tokenizer.get_vocab()
    assert 2 <= len(words) <= 20 and all(word in vocabulary for word in words)
    # a trained captioner names a shape of the dataset
    assert {"circle", "square", "triangle", "shape", "shapes", "star", "diamond"} & set(words), caption


def test_checkpoint_loads_by_hub_id_through_a_local_hub_cache_offline(tmp_path, shapes_image):
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = tmp_path / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(revision)
    for file in CHECKPOINT.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    script = textwrap.dedent(
        f"""
        import json
        from PIL import Image
        from rlcaption import CaptionProcessor, ShowTellRL
        model = ShowTellRL.from_pretrained({HUB_ID!r}).eval()
        processor = CaptionProcessor.from_pretrained({HUB_ID!r})
        inputs = processor(images=Image.open({str(shapes_image)!r}).convert("RGB"), return_tensors="pt")
        sequences = model.generate(pixel_values=inputs["pixel_values"], num_beams=3, max_length=21)
        print(json.dumps(processor.batch_decode(sequences, skip_special_tokens=True)[0].strip()))
        """
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    from_hub_id = json.loads(result.stdout.strip().splitlines()[-1])
    model = ShowTellRL.from_pretrained(CHECKPOINT).eval()
    assert from_hub_id == _caption(model, CaptionProcessor.from_pretrained(CHECKPOINT), shapes_image)


def test_cli_captions_an_image_with_the_checkpoint(shapes_image, capsys):
    cli_main(["caption", "--model", str(CHECKPOINT), "--num-beams", "3", str(shapes_image)])
    path, caption = capsys.readouterr().out.strip().split("\t")
    assert path == str(shapes_image)
    model = ShowTellRL.from_pretrained(CHECKPOINT).eval()
    assert caption == _caption(model, CaptionProcessor.from_pretrained(CHECKPOINT), shapes_image)


@pytest.mark.slow
def test_checkpoint_reproduces_the_cider_of_its_card():
    from rlcaption.evaluation import evaluate_model

    card = ModelCard.load(CHECKPOINT / "README.md")
    reported = {result.metric_name: result.metric_value for result in card.data.eval_results}
    model = ShowTellRL.from_pretrained(CHECKPOINT).eval()
    processor = CaptionProcessor.from_pretrained(CHECKPOINT)
    # the recipe's defaults: shapes seed 0, 4000 / 200 / 500 images
    shapes = load_shapes(4000, 200, 500, image_size=model.config.image_size, seed=0)
    scores = evaluate_model(model, processor, shapes["test"], metrics=("cider", "bleu"), num_beams=3, max_length=21)
    assert scores["CIDEr"] == pytest.approx(reported["CIDEr-D"], abs=1e-3)
    assert scores["Bleu_4"] == pytest.approx(reported["BLEU-4"], abs=1e-3)
