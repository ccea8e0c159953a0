import json

import pytest
import torch
from PIL import Image

from rlcaption.cli import main
from rlcaption.data import load_shapes
from rlcaption.decoding import generate_captions
from rlcaption.evaluation import caption_set_scores, caption_sets
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
