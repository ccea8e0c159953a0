"""The shipped shapes CLIPs (reward and evaluator): Hub-ready folders, cards, loading by folder and by hub id, and
retrieval on test images."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import ModelCard
from transformers import AutoConfig, AutoModel, AutoProcessor

from rlcaption.data import load_shapes
from rlcaption.metrics import clip_retrieval, clip_score
from rlcaption.models import ShapesCLIPModel
from rlcaption.processing import CaptionProcessor
from rlcaption.shapes.dataset import most_specific_reference

REPO_ROOT = Path(__file__).resolve().parents[1]
NAMES = ("shapes-clip-reward", "shapes-clip-evaluator")
CHECKPOINTS = {name: REPO_ROOT / "checkpoints" / name for name in NAMES}
NUM_RANKED = 40  # test images ranked by the cheap tests


@pytest.fixture(scope="module")
def test_split(tmp_path_factory):
    """The CLIPs' test split (1,000 images rendered at 64 px, as `examples/train_clip.py` scores them): it is generated
    first, so it does not depend on the sizes of the other splits."""
    shapes = load_shapes(
        num_train=1, num_validation=1, num_test=1000, image_size=64, cache_dir=tmp_path_factory.mktemp("shapes")
    )
    return shapes["test"]


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_folder_is_hub_ready_small_and_codeless(name):
    folder = CHECKPOINTS[name]
    names = {path.name for path in folder.iterdir()}
    assert {"config.json", "model.safetensors", "processor_config.json", "tokenizer.json", "README.md"} <= names
    assert not [file for file in names if file.endswith(".py") or file in {"training_args.bin", "optimizer.pt"}]
    assert sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) < 20 * 2**20
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "shapes_clip" and "auto_map" not in config  # loads through the installed package


@pytest.mark.parametrize("name", NAMES)
def test_card_reports_the_retrieval_target_and_is_copied_to_model_cards(name):
    card = ModelCard.load(CHECKPOINTS[name] / "README.md")
    scores = {result.metric_name: result.metric_value for result in card.data.eval_results}
    assert scores["text-to-image R@1"] >= 0.85
    assert {"image-to-text R@1", "text-to-image R@5", "image-to-text R@10"} <= set(scores)
    assert f'AutoModel.from_pretrained("rlcaption/{name}")' in card.text
    assert (REPO_ROOT / "model_cards" / f"{name}.md").read_text() == (CHECKPOINTS[name] / "README.md").read_text()


def test_the_two_clips_have_different_image_towers():
    reward, evaluator = (AutoConfig.from_pretrained(CHECKPOINTS[name]) for name in NAMES)
    assert (reward.encoder_type, reward.cnn_channels) != (evaluator.encoder_type, evaluator.cnn_channels)


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_loads_with_the_auto_classes_and_ranks_test_images(name, test_split):
    model = AutoModel.from_pretrained(CHECKPOINTS[name])
    processor = AutoProcessor.from_pretrained(CHECKPOINTS[name])
    assert type(model) is ShapesCLIPModel and type(processor) is CaptionProcessor
    rows = test_split.select(range(NUM_RANKED))  # near-duplicate families included
    queries = [most_specific_reference(captions) for captions in rows["captions"]]
    recalls = clip_retrieval(rows["image"], queries, model=(model, processor))
    assert recalls["t2i_R@1"] >= 0.9 and recalls["i2t_R@1"] >= 0.9, recalls
    # a matching caption scores higher than a caption of another image
    matching = clip_score(rows["image"], queries, model=(model, processor))[1]
    shifted = clip_score(rows["image"], queries[1:] + queries[:1], model=(model, processor))[1]
    assert np.mean(np.array(matching) > np.array(shifted)) >= 0.9


def test_the_reward_clip_loads_by_hub_id_through_a_local_hub_cache_offline(tmp_path, test_split):
    name, revision = "shapes-clip-reward", "0123456789abcdef0123456789abcdef01234567"
    hub_id = f"rlcaption/{name}"
    repo = tmp_path / "hub" / f"models--rlcaption--{name}"
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for file in CHECKPOINTS[name].iterdir():
        (repo / "snapshots" / revision / file.name).write_bytes(file.read_bytes())
    rows = test_split.select(range(4))
    queries = [most_specific_reference(captions) for captions in rows["captions"]]
    np.save(tmp_path / "images.npy", np.stack([np.asarray(image) for image in rows["image"]]))
    script = textwrap.dedent(
        f"""
        import json
        import numpy as np
        from rlcaption.metrics import clip_score
        images = list(np.load({str(tmp_path / "images.npy")!r}))
        print(json.dumps(clip_score(images, {queries!r}, model={hub_id!r})[1]))
        """
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    from_hub_id = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(from_hub_id, clip_score(rows["image"], queries, model=CHECKPOINTS[name])[1], atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_reproduces_the_retrieval_of_its_card(name, test_split):
    card = ModelCard.load(CHECKPOINTS[name] / "README.md")
    reported = {result.metric_name: result.metric_value for result in card.data.eval_results}
    queries = [most_specific_reference(captions) for captions in test_split["captions"]]
    recalls = clip_retrieval(test_split["image"], queries, model=CHECKPOINTS[name])
    assert recalls["t2i_R@1"] == pytest.approx(reported["text-to-image R@1"], abs=1e-3)
    assert recalls["i2t_R@1"] == pytest.approx(reported["image-to-text R@1"], abs=1e-3)
