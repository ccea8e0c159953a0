"""The checkpoints shipped in `checkpoints/`: Hub-ready, small, codeless, loadable by folder and by Hub id, and
captioners that see (they name the objects of shapes test images)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file

from rlcaption.cli import main as cli_main
from rlcaption.data import load_shapes
from rlcaption.evaluation import evaluate_model, listener_recall
from rlcaption.models import PolicyValueCaptioner, ShowTellRL, SpeakerListener
from rlcaption.processing import CaptionProcessor
from rlcaption.rewards import get_reward
from rlcaption.shapes.dataset import most_specific_reference

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
# name -> (what its card must say about how it was trained, the beams of its recipe's test decoding)
CAPTIONERS = {
    "show-tell-rl-shapes-xe": ("train_xe.py", 1),
    "show-tell-rl-shapes-spider-pg-cider": ("spider_pg", 3),
    "show-tell-rl-shapes-sle": ("train_sle.py", 5),
    "show-tell-rl-shapes-wtf-rl": ("train_wtf.py", 3),
}
captioners = pytest.mark.parametrize("name", list(CAPTIONERS))
# loading by hub id is the same code for every checkpoint: one in the main suite, the others with the slow tests
captioners_one_in_main_suite = pytest.mark.parametrize(
    "name",
    [name if index == 0 else pytest.param(name, marks=pytest.mark.slow) for index, name in enumerate(CAPTIONERS)],
)


@pytest.fixture(scope="module")
def shapes_test(tmp_path_factory):
    """The first test images of the recipes' shapes dataset (seed 0, 4000 / 200 / 500 images at 48 px)."""
    shapes = load_shapes(4000, 200, 500, image_size=48, seed=0, cache_dir=tmp_path_factory.mktemp("shapes"))
    return shapes["test"].select(range(40))


@pytest.fixture(scope="module")
def shapes_image(shapes_test, tmp_path_factory):
    path = tmp_path_factory.mktemp("images") / "scene.png"
    shapes_test[0]["image"].save(path)
    return path


def offline_hub_cache(tmp_path, hub_id: str, folder: Path) -> dict[str, str]:
    """A Hub cache under `tmp_path` holding `folder` as the snapshot of `hub_id`; returns an offline environment."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = tmp_path / "hub" / f"models--{hub_id.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(revision)
    for file in folder.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    return {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}


def auto_classes_by_hub_id(tmp_path, hub_id: str, folder: Path, auto_class: str) -> list[str]:
    """The classes `transformers.<auto_class>` and `AutoProcessor` load for `hub_id` held in a local Hub cache, in a
    fresh offline process that only imports rlcaption (which registers its models with the Auto classes)."""
    env = offline_hub_cache(tmp_path, hub_id, folder)
    script = textwrap.dedent(
        f"""
        import json
        import rlcaption
        from transformers import {auto_class}, AutoProcessor
        model = {auto_class}.from_pretrained({hub_id!r})
        processor = AutoProcessor.from_pretrained({hub_id!r})
        print(json.dumps([type(model).__name__, type(processor).__name__]))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _caption(model, processor, image_path, num_beams=3):
    from PIL import Image

    inputs = processor(images=Image.open(image_path).convert("RGB"), return_tensors="pt")
    with torch.no_grad():
        sequences = model.generate(pixel_values=inputs["pixel_values"], num_beams=num_beams, max_length=21)
    return processor.batch_decode(sequences, skip_special_tokens=True)[0].strip()


@captioners
def test_checkpoint_folder_is_hub_ready_small_and_codeless(name):
    folder = CHECKPOINTS / name
    names = {path.name for path in folder.iterdir()}
    expected = {"config.json", "model.safetensors", "generation_config.json", "processor_config.json", "README.md"}
    assert expected <= names
    assert "tokenizer.json" in names or "tokenizer_config.json" in names
    assert not {"training_args.bin", "optimizer.pt"} & names  # nothing of the training run
    assert not [path for path in folder.iterdir() if path.suffix == ".py"]  # the installed package has the code
    assert "auto_map" not in json.loads((folder / "config.json").read_text())
    assert sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) < 20 * 2**20
    weights = load_file(str(folder / "model.safetensors"))
    # Liu et al.'s baseline is the spider_pg objective's auxiliary network, kept in training checkpoints only
    assert not any(key.startswith("baseline") for key in weights)


@captioners
def test_checkpoint_card_reports_consensus_and_grounding(name):
    card = ModelCard.load(CHECKPOINTS / name / "README.md")
    scores = {result.metric_name: result.metric_value for result in card.data.eval_results}
    assert {"CIDEr-D", "BLEU-4", "ROUGE-L", "Object F1 (colour+shape)", "Generic captions"} <= set(scores)
    assert 0.0 < scores["CIDEr-D"] and 0.0 <= scores["Generic captions"] <= 1.0
    assert f'ShowTellRL.from_pretrained("rlcaption/{name}")' in card.text
    assert CAPTIONERS[name][0] in card.text


@captioners
def test_checkpoint_sees_the_objects_of_test_images(name, shapes_test):
    model = ShowTellRL.from_pretrained(CHECKPOINTS / name).eval()
    processor = CaptionProcessor.from_pretrained(CHECKPOINTS / name)
    assert model.config.image_attention and model.config.freeze_image_encoder
    assert not any(parameter.requires_grad for parameter in model.image_encoder.parameters())
    scores = evaluate_model(model, processor, shapes_test, metrics=("cider",), num_beams=1, max_length=21)
    # a captioner blind to the image names the right colour-shape pairs by chance only (F1 ~0.03)
    assert scores["object_f1"] > 0.75, scores
    assert scores["generic_share"] < 0.2, scores


@captioners_one_in_main_suite
def test_checkpoint_loads_by_hub_id_through_a_local_hub_cache_offline(name, tmp_path, shapes_image):
    hub_id = f"rlcaption/{name}"
    env = offline_hub_cache(tmp_path, hub_id, CHECKPOINTS / name)
    script = textwrap.dedent(
        f"""
        import json
        from PIL import Image
        from rlcaption import CaptionProcessor, ShowTellRL
        model = ShowTellRL.from_pretrained({hub_id!r}).eval()
        processor = CaptionProcessor.from_pretrained({hub_id!r})
        inputs = processor(images=Image.open({str(shapes_image)!r}).convert("RGB"), return_tensors="pt")
        sequences = model.generate(pixel_values=inputs["pixel_values"], num_beams=3, max_length=21)
        print(json.dumps(processor.batch_decode(sequences, skip_special_tokens=True)[0].strip()))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    from_hub_id = json.loads(result.stdout.strip().splitlines()[-1])
    model = ShowTellRL.from_pretrained(CHECKPOINTS / name).eval()
    assert from_hub_id == _caption(model, CaptionProcessor.from_pretrained(CHECKPOINTS / name), shapes_image)


def test_cli_captions_an_image_with_the_checkpoint(shapes_image, capsys):
    folder = CHECKPOINTS / "show-tell-rl-shapes-spider-pg-cider"
    cli_main(["caption", "--model", str(folder), "--num-beams", "3", str(shapes_image)])
    path, caption = capsys.readouterr().out.strip().split("\t")
    assert path == str(shapes_image)
    model = ShowTellRL.from_pretrained(folder).eval()
    assert caption == _caption(model, CaptionProcessor.from_pretrained(folder), shapes_image)


@pytest.mark.slow
@captioners
def test_checkpoint_reproduces_the_scores_of_its_card(name):
    card = ModelCard.load(CHECKPOINTS / name / "README.md")
    reported = {result.metric_name: result.metric_value for result in card.data.eval_results}
    model = ShowTellRL.from_pretrained(CHECKPOINTS / name).eval()
    processor = CaptionProcessor.from_pretrained(CHECKPOINTS / name)
    shapes = load_shapes()  # the obvious route: the defaults are the shapes benchmark of the recipes and the cards
    # each card scores its recipe's test decoding: greedy for XE, beam search for the RL recipes
    num_beams = CAPTIONERS[name][1]
    scores = evaluate_model(model, processor, shapes["test"], metrics=("cider", "bleu"), num_beams=num_beams)
    assert scores["CIDEr"] == pytest.approx(reported["CIDEr-D"], abs=1e-3)
    assert scores["object_f1"] == pytest.approx(reported["Object F1 (colour+shape)"], abs=1e-3)


SPEAKER_LISTENER = CHECKPOINTS / "speaker-listener-shapes-psst"


def test_speaker_listener_checkpoint_is_hub_ready_and_its_card_reports_the_listener():
    names = {path.name for path in SPEAKER_LISTENER.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "processor_config.json",
        "README.md",
    } <= names
    assert not [path for path in SPEAKER_LISTENER.iterdir() if path.suffix in (".py", ".bin", ".pt")]
    assert sum(path.stat().st_size for path in SPEAKER_LISTENER.rglob("*") if path.is_file()) < 20 * 2**20
    weights = load_file(str(SPEAKER_LISTENER / "model.safetensors"))
    assert any(key.startswith("listener.caption_rnn") for key in weights)  # the trained listener is published
    card = ModelCard.load(SPEAKER_LISTENER / "README.md")
    scores = {result.metric_name: result.metric_value for result in card.data.eval_results}
    assert {"CIDEr-D", "Object F1 (colour+shape)", "Listener R@10 (caption to image)"} <= set(scores)
    assert "train_psst.py" in card.text and "import rlcaption" in card.text


def test_speaker_listener_checkpoint_loads_by_hub_id_and_its_listener_finds_images(tmp_path, shapes_test):
    loaded = auto_classes_by_hub_id(
        tmp_path, "rlcaption/speaker-listener-shapes-psst", SPEAKER_LISTENER, "AutoModelForImageTextToText"
    )
    assert loaded == ["SpeakerListener", "CaptionProcessor"]

    model = SpeakerListener.from_pretrained(SPEAKER_LISTENER).eval()
    processor = CaptionProcessor.from_pretrained(SPEAKER_LISTENER)
    recall = listener_recall(model, processor, shapes_test, ks=(1, 5))
    # among 40 test images, chance is 0.025 at R@1 and 0.125 at R@5
    assert recall["listener_R@5"] > 0.5, recall


EMBEDDING = CHECKPOINTS / "visual-semantic-embedding-shapes"


def test_embedding_checkpoint_is_hub_ready_small_codeless_and_its_card_reports_retrieval():
    names = {path.name for path in EMBEDDING.iterdir()}
    assert {"config.json", "model.safetensors", "processor_config.json", "README.md", "eval_results.json"} <= names
    assert not [path for path in EMBEDDING.iterdir() if path.suffix in (".py", ".bin", ".pt")]
    assert sum(path.stat().st_size for path in EMBEDDING.rglob("*") if path.is_file()) < 20 * 2**20
    config = json.loads((EMBEDDING / "config.json").read_text())
    assert config["model_type"] == "visual_semantic_embedding" and "auto_map" not in config
    card = ModelCard.load(EMBEDDING / "README.md")
    scores = {result.metric_name: result.metric_value for result in card.data.eval_results}
    results = json.loads((EMBEDDING / "eval_results.json").read_text())["test"]
    assert scores["image-to-text R@10"] == round(results["i2t_R@10"], 4) and len(scores) == 6
    assert "examples/train_embedding.py" in card.text
    assert 'get_reward("embedding", model="rlcaption/visual-semantic-embedding-shapes")' in card.text
    model_card = CHECKPOINTS.parent / "model_cards" / "visual-semantic-embedding-shapes.md"
    assert model_card.read_text() == (EMBEDDING / "README.md").read_text()


def test_embedding_checkpoint_loads_by_hub_id_and_its_reward_prefers_a_captions_own_image(tmp_path, shapes_test):
    loaded = auto_classes_by_hub_id(tmp_path, "rlcaption/visual-semantic-embedding-shapes", EMBEDDING, "AutoModel")
    assert loaded == ["VisualSemanticEmbedding", "CaptionProcessor"]

    # the reward reads the XE captioner's words: both have one vocabulary
    xe_vocabulary = CaptionProcessor.from_pretrained(CHECKPOINTS / "show-tell-rl-shapes-xe").tokenizer.get_vocab()
    assert CaptionProcessor.from_pretrained(EMBEDDING).tokenizer.get_vocab() == xe_vocabulary
    reward = get_reward("embedding", model=str(EMBEDDING))
    captions = [most_specific_reference(references) for references in shapes_test["captions"]]
    matching = np.array(reward(completions=captions, image=shapes_test["image"]))
    # each image with the caption of the next one, often a near-duplicate (one attribute changed)
    mismatched = np.array(reward(completions=captions[1:] + captions[:1], image=shapes_test["image"]))
    assert np.mean(matching > mismatched) >= 0.8, (matching, mismatched)


POLICY_VALUE = CHECKPOINTS / "policy-value-shapes-ac"


def test_policy_value_checkpoint_is_hub_ready_and_its_card_reports_lookahead_and_the_value_network():
    names = {path.name for path in POLICY_VALUE.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "processor_config.json"} <= names
    assert not [path for path in POLICY_VALUE.iterdir() if path.suffix in (".py", ".bin", ".pt")]
    assert sum(path.stat().st_size for path in POLICY_VALUE.rglob("*") if path.is_file()) < 20 * 2**20
    weights = load_file(str(POLICY_VALUE / "model.safetensors"))
    assert any(key.startswith("value_network.") for key in weights)  # lookahead needs the trained value network
    card = ModelCard.load(POLICY_VALUE / "README.md")
    scores = {result.metric_name: result.metric_value for result in card.data.eval_results}
    results = json.loads((POLICY_VALUE / "eval_results.json").read_text())["test"]
    assert scores["CIDEr-D"] == round(results["CIDEr"], 4)
    assert any("lookahead" in name for name in scores)
    assert any("explained variance" in name for name in scores)
    assert "train_actor_critic.py" in card.text
    model_card = CHECKPOINTS.parent / "model_cards" / "policy-value-shapes-ac.md"
    assert model_card.read_text() == (POLICY_VALUE / "README.md").read_text()


def test_policy_value_checkpoint_loads_by_hub_id_and_looks_ahead(tmp_path, shapes_test):
    loaded = auto_classes_by_hub_id(
        tmp_path, "rlcaption/policy-value-shapes-ac", POLICY_VALUE, "AutoModelForImageTextToText"
    )
    assert loaded == ["PolicyValueCaptioner", "CaptionProcessor"]

    model = PolicyValueCaptioner.from_pretrained(POLICY_VALUE).eval()
    processor = CaptionProcessor.from_pretrained(POLICY_VALUE)
    plain = evaluate_model(model, processor, shapes_test, metrics=("cider",), num_beams=3)
    lookahead = evaluate_model(model, processor, shapes_test, metrics=("cider",), num_beams=3, lookahead_lambda=0.4)
    # a policy that sees names the right objects with either decoding (blind: F1 ~0.03)
    assert plain["object_f1"] > 0.75 and lookahead["object_f1"] > 0.75, (plain, lookahead)
    # λ = 1 is plain beam search, so the value network is what λ < 1 adds
    same = evaluate_model(model, processor, shapes_test, metrics=("cider",), num_beams=3, lookahead_lambda=1.0)
    assert same["CIDEr"] == pytest.approx(plain["CIDEr"], abs=1e-9)
