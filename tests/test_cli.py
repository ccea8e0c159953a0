import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from rlcaption.cli import build_parser, main
from rlcaption.data import load_shapes
from rlcaption.evaluation import caption_set_scores, caption_sets
from rlcaption.generation.decoding import generate_captions
from rlcaption.models import PolicyValueCaptioner
from rlcaption.processing import CaptionProcessor
from tiny_captioners import make_show_tell

IMAGE_SIZE = 32


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    processor = CaptionProcessor.from_captions(["a red circle", "a blue square", "two shapes"], image_size=IMAGE_SIZE)
    model = make_show_tell(processor, IMAGE_SIZE, seed=4)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder, model.eval(), processor


def test_caption_command_prints_the_models_beam_search_caption(saved_model, tmp_path, capsys):
    folder, model, processor = saved_model
    image_path = tmp_path / "picture.png"
    Image.new("RGBA", (50, 40), (200, 30, 30, 128)).save(image_path)  # RGBA and another size: converted

    assert main(["caption", "--model", str(folder), "--num-beams", "2", str(image_path)]) == 0
    printed = capsys.readouterr().out.strip().split("\n")

    pixel_values = processor(images=[Image.open(image_path)], return_tensors="pt")["pixel_values"]
    expected = generate_captions(model, processor, {"pixel_values": pixel_values}, num_beams=2, max_length=21).texts
    assert printed == [f"{image_path}\t{expected[0]}"]


def test_caption_command_reports_a_missing_image_without_traceback(saved_model, tmp_path, capsys):
    folder, _, _ = saved_model
    assert main(["caption", "--model", str(folder), str(tmp_path / "nope.png")]) == 1
    error = capsys.readouterr().err
    assert "rlcaption caption: error:" in error and "nope.png" in error


def test_evaluate_command_rejects_a_wrong_dataset_path(saved_model, tmp_path, capsys):
    folder, _, _ = saved_model
    assert main(["evaluate", "--model", str(folder), "--dataset", str(tmp_path / "missing")]) == 1
    assert "save_to_disk" in capsys.readouterr().err


def test_evaluate_command_scores_the_shapes_test_split_the_recipes_and_model_cards_use(
    saved_model, monkeypatch, capsys
):
    import rlcaption.data.loading
    from rlcaption.recipes import RecipeArguments, load_recipe_dataset

    folder, _, _ = saved_model
    requested = []

    def small_shapes(**kwargs):  # records the settings, renders 4 test images at the requested size
        requested.append(kwargs)
        return load_shapes(**{**kwargs, "num_train": 2, "num_validation": 2, "num_test": 4})

    monkeypatch.setattr(rlcaption.data.loading, "load_shapes", small_shapes)
    assert main(["evaluate", "--model", str(folder), "--dataset", "shapes", "--metrics", "cider"]) == 0
    assert json.loads(capsys.readouterr().out)["num_captions"] == 4
    load_recipe_dataset(RecipeArguments())  # what every recipe, benchmark and card is trained and scored on
    assert requested[0] == requested[1] and requested[0]["image_size"] == 48, requested


def test_saved_model_generates_identically_after_reload(saved_model):
    folder, model, processor = saved_model
    reloaded = type(model).from_pretrained(folder).eval()
    pixel_values = torch.randn(2, 3, IMAGE_SIZE, IMAGE_SIZE)
    first = generate_captions(model, processor, {"pixel_values": pixel_values}, num_beams=2, max_length=10)
    second = generate_captions(reloaded, processor, {"pixel_values": pixel_values}, num_beams=2, max_length=10)
    assert torch.equal(first.sequences, second.sequences)


def test_evaluate_command_scores_caption_sets_as_the_library_does(saved_model, tmp_path, capsys):
    folder, model, processor = saved_model
    shapes = load_shapes(num_train=4, num_validation=2, num_test=4, image_size=48, seed=2)
    shapes.save_to_disk(tmp_path / "shapes")
    arguments = ["evaluate", "--model", str(folder), "--dataset", str(tmp_path / "shapes"), "--metrics", "cider"]
    assert main([*arguments, "--caption-sets", "sample", "beam", "--set-size", "3", "--max-length", "8"]) == 0
    printed = json.loads(capsys.readouterr().out)
    for decoding in ("sample", "beam"):
        sets, references = caption_sets(model, processor, shapes["test"], decoding, set_size=3, max_new_tokens=7)
        expected = caption_set_scores(sets, references, shapes["test"])
        assert {name: printed[f"{decoding}3_{name}"] for name in expected} == pytest.approx(expected, nan_ok=True)
    assert "CIDEr" in printed and "sample3_object_f1" in printed


# ---------------------------------------------------------------- lookahead beam search (Ren et al. 2017)


@pytest.fixture(scope="module")
def saved_policy_value(tmp_path_factory):
    folder = tmp_path_factory.mktemp("policy_value")
    processor = CaptionProcessor.from_captions(["a red circle", "a blue square", "two shapes"], image_size=IMAGE_SIZE)
    torch.manual_seed(0)
    model = PolicyValueCaptioner.from_policy(
        make_show_tell(processor, IMAGE_SIZE, seed=4),
        value_word_embedding_size=8, value_hidden_size=8, value_mlp_hidden_size=8,
    )  # fmt: skip
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder, model.eval(), processor


@pytest.fixture(scope="module")
def image_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    paths = []
    for index, color in enumerate([(200, 30, 30), (30, 30, 200), (30, 160, 30)]):
        paths.append(folder / f"picture{index}.png")
        Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), color).save(paths[-1])
    return [str(path) for path in paths]


def caption_with_cli(capsys, folder, image_files, *options) -> list[str]:
    assert main(["caption", "--model", str(folder), "--num-beams", "3", *options, *image_files]) == 0
    # a caption may be empty (a random policy may end at once): only the line ends are stripped
    return [line.split("\t", 1)[1] for line in capsys.readouterr().out.rstrip("\n").split("\n")]


def test_caption_command_decodes_with_the_value_network_when_given_a_lookahead_lambda(
    saved_policy_value, image_files, capsys
):
    folder, model, processor = saved_policy_value
    plain = caption_with_cli(capsys, folder, image_files)
    # λ = 1 weighs the policy alone: plain beam search
    assert caption_with_cli(capsys, folder, image_files, "--lookahead-lambda", "1") == plain
    # λ = 0 ranks by the value network alone: the library's lookahead decoding, which here differs from the policy's
    by_value = caption_with_cli(capsys, folder, image_files, "--lookahead-lambda", "0")
    pixel_values = processor(images=[Image.open(path) for path in image_files], return_tensors="pt")["pixel_values"]
    expected = generate_captions(
        model, processor, {"pixel_values": pixel_values}, num_beams=3, max_length=21, lookahead_lambda=0.0
    ).texts
    assert by_value == expected and by_value != plain


def test_evaluate_command_with_lookahead_lambda_1_scores_plain_beam_search(
    saved_policy_value, tmp_path, capsys, monkeypatch
):
    folder, _, _ = saved_policy_value
    shapes = load_shapes(num_train=4, num_validation=2, num_test=4, image_size=48, seed=2)
    shapes.save_to_disk(tmp_path / "shapes")
    arguments = ["evaluate", "--model", str(folder), "--dataset", str(tmp_path / "shapes"), "--metrics", "cider"]
    lambdas = []
    generate = PolicyValueCaptioner.generate

    def recording_generate(self, *args, **kwargs):
        lambdas.append(kwargs.get("lookahead_lambda"))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(PolicyValueCaptioner, "generate", recording_generate)
    assert main([*arguments, "--max-length", "8"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*arguments, "--max-length", "8", "--lookahead-lambda", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == plain
    assert lambdas == [None, 1.0]  # one batch each: the option reaches the model's generate


@pytest.mark.parametrize("command", ["caption", "evaluate"])
def test_lookahead_lambda_is_refused_for_a_model_without_a_value_network(
    saved_model, saved_policy_value, image_files, command, capsys
):
    inputs = image_files if command == "caption" else ["--dataset", "/nowhere"]  # fails before the dataset loads
    folder = saved_model[0]
    assert main([command, "--model", str(folder), "--lookahead-lambda", "0.4", *inputs]) == 1
    error = capsys.readouterr().err
    assert f"rlcaption {command}: error: --lookahead-lambda needs a model with a value network" in error
    assert "ShowTellRL" in error
    # a beam search needs beams
    folder = saved_policy_value[0]
    assert main([command, "--model", str(folder), "--lookahead-lambda", "0.4", "--num-beams", "1", *inputs]) == 1
    assert "--num-beams >= 2" in capsys.readouterr().err


def _console_command() -> str:
    return str(Path(sys.executable).with_name("rlcaption"))


def _imported_modules(stderr: str) -> set[str]:
    """The modules `python -X importtime` (PYTHONPROFILEIMPORTTIME) reports as imported."""
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize(
    "command",
    [
        [_console_command(), "--help"],
        [_console_command(), "caption", "--num-beams", "two"],
        [sys.executable, "-m", "rlcaption", "evaluate", "--help"],
    ],
    ids=["help", "argument error", "python -m"],
)
def test_help_and_argument_errors_answer_without_importing_torch(command):
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}, timeout=60
    )
    assert result.returncode in (0, 2) and "usage: rlcaption" in result.stdout + result.stderr
    imported = _imported_modules(result.stderr)
    assert "rlcaption.cli" in imported
    assert not {module for module in imported if module.split(".")[0] in ("torch", "transformers", "datasets")}


def test_console_command_runs_a_subcommand_and_import_rlcaption_registers_the_auto_classes(saved_model, tmp_path):
    folder, model, processor = saved_model
    image = tmp_path / "photo.png"
    Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), "red").save(image)
    captioned = subprocess.run(
        [_console_command(), "caption", "--model", str(folder), str(image)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert captioned.returncode == 0, captioned.stderr
    pixel_values = processor(images=[Image.open(image)], return_tensors="pt")["pixel_values"]
    expected = generate_captions(model, processor, {"pixel_values": pixel_values}, num_beams=3, max_length=21).texts
    assert captioned.stdout.strip() == f"{image}\t{expected[0]}"
    registered = subprocess.run(
        [sys.executable, "-c", "import rlcaption, transformers\n"
         "print(type(transformers.AutoConfig.for_model('show_tell_rl')).__name__)"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert registered.stdout.strip() == "ShowTellRLConfig", registered.stderr


def test_extract_features_offers_the_poolings_the_encoders_know():
    from rlcaption.models.show_tell_rl.encoders import POOLING_MODES

    subcommands = next(action for action in build_parser()._actions if action.dest == "command").choices
    pooling = next(action for action in subcommands["extract-features"]._actions if action.dest == "pooling")
    assert tuple(pooling.choices) == POOLING_MODES
