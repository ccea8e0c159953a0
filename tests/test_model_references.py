"""A mistyped model path fails in seconds at every entry point, naming the path, where it was looked for and the
offline switch, without one request for a model file; a Hub id loads from the cache when the Hub is out of reach."""

import importlib.util
from pathlib import Path

import huggingface_hub.constants
import pytest
from PIL import Image

from hub_network import refuse_hub_requests
from rlcaption.cli import main
from rlcaption.hub import check_pretrained_reference
from rlcaption.inference import load_captioner
from rlcaption.metrics import load_clip
from rlcaption.processing import CaptionProcessor
from rlcaption.recipes import load_pretrained_captioner
from rlcaption.rewards import get_reward
from tiny_captioners import make_show_tell

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TYPO = "checkpoints/show-tell-rl-shapes-spider-pg-cidr"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_requests(monkeypatch):
    """Every HTTP request made, refused as by a machine without a network (the Hub's address answers nothing)."""
    return refuse_hub_requests(monkeypatch)


@pytest.fixture
def in_a_project(tmp_path, monkeypatch):
    """A working directory with a `checkpoints/` folder, as the repository has."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    return tmp_path


@pytest.fixture(scope="module")
def saved_captioner(tmp_path_factory):
    folder = tmp_path_factory.mktemp("captioner")
    processor = CaptionProcessor.from_captions(["a red circle", "a blue square"], image_size=16)
    make_show_tell(processor, 16, seed=1).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def assert_names_the_typo(error: str, option: str, typo: str, looked_in: Path) -> None:
    assert f"{option} {typo}: no such folder" in error
    assert str(looked_in / typo) in error  # where it was looked for
    assert "HF_HUB_OFFLINE=1" in error


def test_a_mistyped_path_fails_at_every_loader_without_a_request(in_a_project, hub_requests):
    loaders = {
        "model_name_or_path": load_captioner,
        "--model_name_or_path": load_pretrained_captioner,
        "CLIP": load_clip,
    }
    for option, loader in loaders.items():
        with pytest.raises(FileNotFoundError) as raised:
            loader(TYPO)
        assert_names_the_typo(str(raised.value), option, TYPO, in_a_project)
    with pytest.raises(FileNotFoundError, match="CLIP checkpoints/shapes-clip-evaluatr: no such folder"):
        get_reward("clip_score", model="checkpoints/shapes-clip-evaluatr")
    assert hub_requests == []


def test_the_caption_command_names_a_mistyped_model(in_a_project, hub_requests, capsys):
    Image.new("RGB", (16, 16), "white").save(in_a_project / "scene.png")
    assert main(["caption", "--model", TYPO, "scene.png"]) == 1
    assert_names_the_typo(capsys.readouterr().err, "--model", TYPO, in_a_project)
    assert main(["evaluate", "--model", TYPO]) == 1
    assert_names_the_typo(capsys.readouterr().err, "--model", TYPO, in_a_project)
    assert hub_requests == []


def test_a_bare_name_in_a_recipe_fails_before_any_data(in_a_project, hub_requests, monkeypatch):
    spec = importlib.util.spec_from_file_location("train_scst", EXAMPLES / "train_scst.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    monkeypatch.setattr(recipe, "load_recipe_dataset", lambda script_args: pytest.fail("data loaded"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(in_a_project / "empty_cache"))
    with pytest.raises(FileNotFoundError) as raised:
        recipe.main(["--output_dir", "out", "--model_name_or_path", "show-tell-rl-shapes-xee"])
    assert_names_the_typo(str(raised.value), "--model_name_or_path", "show-tell-rl-shapes-xee", in_a_project)
    assert "nor a Hub id" in str(raised.value) and "`org/name`" in str(raised.value)
    assert hub_requests == []


def test_a_hub_id_out_of_reach_fails_after_one_request_naming_the_cause(in_a_project, hub_requests):
    with pytest.raises(FileNotFoundError) as raised:
        load_captioner("rlcaption/show-tell-typo", cache_dir=in_a_project / "cache")
    message = str(raised.value)
    assert "model_name_or_path rlcaption/show-tell-typo: not a local folder" in message
    assert "the Hub cannot be used (ConnectError" in message and "HF_HUB_OFFLINE=1" in message
    assert hub_requests == [huggingface_hub.constants.ENDPOINT]  # one probe, no file, no retry


def test_offline_mode_refuses_an_uncached_hub_id_without_a_request(in_a_project, hub_requests, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match=r"offline mode is on .*unset HF_HUB_OFFLINE to download it"):
        check_pretrained_reference("rlcaption/show-tell-typo", cache_dir=in_a_project / "cache")
    assert hub_requests == []


def test_a_cached_hub_id_loads_from_the_cache_when_the_hub_is_out_of_reach(
    saved_captioner, in_a_project, hub_requests
):
    cache = in_a_project / "cache"
    snapshot = cache / "models--rlcaption--show-tell" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for file in saved_captioner.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (cache / "models--rlcaption--show-tell" / "refs").mkdir()
    (cache / "models--rlcaption--show-tell" / "refs" / "main").write_text(COMMIT)

    model, processor = load_captioner("rlcaption/show-tell", cache_dir=cache)
    assert type(model).__name__ == "ShowTellRL" and processor.tokenizer.decode([]) == ""
    assert hub_requests[0] == huggingface_hub.constants.ENDPOINT  # the probe
    assert not [url for url in hub_requests if "show-tell" in url]  # no model file asked for


def test_a_local_folder_and_a_reachable_hub_id_pass(saved_captioner, monkeypatch):
    assert check_pretrained_reference(saved_captioner) is False
    monkeypatch.setattr("rlcaption.hub.references.hub_unreachable_reason", lambda: None)
    assert check_pretrained_reference("org/name") is False  # left to from_pretrained
