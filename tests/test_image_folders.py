"""Folders of images: `rlcaption caption <folder>` captions each image and skips, naming it, one that cannot be read;
a folder with captions in `metadata.jsonl` is a dataset for the recipes and `rlcaption evaluate`."""

import json

import pytest
import torch
from PIL import Image

from rlcaption.cli import main
from rlcaption.data import load_caption_imagefolder
from rlcaption.evaluation import evaluate_model
from rlcaption.inference import caption_image_files
from rlcaption.processing import CaptionProcessor
from rlcaption.recipes import RecipeArguments, load_recipe_dataset
from tiny_captioners import make_show_tell

IMAGE_SIZE = 16
COLORS = {"red": (200, 30, 30), "blue": (30, 30, 200), "green": (30, 160, 30)}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    processor = CaptionProcessor.from_captions([f"a {color} square" for color in COLORS], image_size=IMAGE_SIZE)
    torch.manual_seed(0)
    model = make_show_tell(processor, IMAGE_SIZE, seed=4)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder, model.eval(), processor


@pytest.fixture
def image_folder(tmp_path):
    """Three images, a caption file that is no image, and a subfolder (not searched)."""
    folder = tmp_path / "photos"
    (folder / "more").mkdir(parents=True)
    for color, rgb in COLORS.items():
        Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), rgb).save(folder / f"{color}.png")
    Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE)).save(folder / "more" / "nested.png")
    (folder / "notes.txt").write_text("not an image")
    return folder


def printed_captions(capsys) -> dict[str, str]:
    lines = capsys.readouterr().out.rstrip("\n").split("\n")
    return dict(line.split("\t", 1) for line in lines)


def test_caption_captions_every_image_of_a_folder(saved_model, image_folder, capsys):
    folder, model, processor = saved_model
    assert main(["caption", "--model", str(folder), "--num-beams", "2", str(image_folder)]) == 0
    printed = printed_captions(capsys)
    expected_files = [str(image_folder / f"{color}.png") for color in sorted(COLORS)]
    assert list(printed) == expected_files
    assert list(printed.values()) == caption_image_files(model, processor, expected_files, num_beams=2, max_length=21)


def test_caption_skips_an_unreadable_image_naming_it(saved_model, image_folder, capsys):
    folder, model, processor = saved_model
    (image_folder / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    images = [str(image_folder / name) for name in ("red.png", "broken.jpg", "blue.png")]
    assert main(["caption", "--model", str(folder), "--num-beams", "2", *images]) == 0
    output = capsys.readouterr()
    assert f"rlcaption caption: warning: skipped {images[1]}, which cannot be read" in output.err
    captioned = dict(line.split("\t", 1) for line in output.out.rstrip("\n").split("\n"))
    readable = [images[0], images[2]]
    assert captioned == dict(zip(readable, caption_image_files(model, processor, readable, num_beams=2), strict=True))


def test_caption_names_a_folder_without_images(saved_model, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["caption", "--model", str(saved_model[0]), str(tmp_path / "empty")]) == 1
    assert f"Folder {tmp_path / 'empty'} has no image files" in capsys.readouterr().err


@pytest.fixture
def captioned_folder(image_folder):
    """The image folder as a dataset: captions of its test split in `test/metadata.jsonl`."""
    test_folder = image_folder / "test"
    test_folder.mkdir()
    with open(test_folder / "metadata.jsonl", "w", encoding="utf-8") as metadata:
        for color in COLORS:
            (image_folder / f"{color}.png").rename(test_folder / f"{color}.png")
            metadata.write(json.dumps({"file_name": f"{color}.png", "captions": [f"a {color} square"]}) + "\n")
    return image_folder


def test_a_recipe_loads_a_folder_with_captions(captioned_folder):
    dataset = load_recipe_dataset(RecipeArguments(dataset=str(captioned_folder)))
    expected = load_caption_imagefolder(captioned_folder)
    assert list(dataset) == ["test"]
    assert dataset["test"]["captions"] == expected["test"]["captions"] == [[f"a {c} square"] for c in COLORS]


def test_a_recipe_names_what_a_folder_without_captions_lacks(image_folder):
    with pytest.raises(FileNotFoundError, match=r"not a folder written by `save_to_disk`.*No metadata\.jsonl in"):
        load_recipe_dataset(RecipeArguments(dataset=str(image_folder)))


def test_evaluate_scores_a_folder_with_captions(saved_model, captioned_folder, capsys):
    folder, model, processor = saved_model
    arguments = ["evaluate", "--model", str(folder), "--dataset", str(captioned_folder), "--metrics", "cider", "bleu"]
    assert main(arguments) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = evaluate_model(
        model, processor, load_caption_imagefolder(captioned_folder)["test"], metrics=["cider", "bleu"], num_beams=3
    )
    assert printed == pytest.approx(expected)
