"""The COCO path of docs/coco.md walked on a handful of JPEGs: a Karpathy split file, a local backbone,
`rlcaption extract-features`, `train_xe.py --image_features`, `rlcaption caption` and transformers'
`image-text-to-text` pipeline on a photo outside the dataset, and `rlcaption evaluate --dataset <features folder>`,
with the commands the page gives."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset, DatasetDict
from PIL import Image
from transformers import AutoImageProcessor, ConvNextImageProcessor, ResNetConfig, ResNetModel, pipeline

from rlcaption import ShowTellRL
from rlcaption.cli import _warn_if_captions_are_mostly_empty, main
from rlcaption.data import load_karpathy
from rlcaption.data.loading import save_dataset_referencing_images
from rlcaption.inference import caption_image_files, load_captioner
from rlcaption.processing import CaptionProcessor
from rlcaption.recipes import (
    check_features_match_model,
    load_features_dataset,
    new_image_encoder_fields,
    new_show_tell_rl,
    warn_if_most_words_are_unknown,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30)}


def _train_xe_main():
    spec = importlib.util.spec_from_file_location("train_xe", EXAMPLES / "train_xe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _photo(path: Path, colour: str, seed: int) -> None:
    """A 40x32 JPEG: a coloured square on a noisy grey background, as a camera's file is (JPEG, not square)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(90, 140, size=(32, 40, 3), dtype=np.uint8)
    pixels[8:24, 10:26] = COLOURS[colour]
    Image.fromarray(pixels).save(path, format="JPEG", quality=90)


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    """`dataset_coco.json` over 8 JPEGs in `coco/val2014` (4 train, 2 val, 2 test), a tiny ResNet saved with its
    image processor as a Hub checkpoint is, and a photo outside the dataset."""
    root = tmp_path_factory.mktemp("walk")
    (root / "coco" / "val2014").mkdir(parents=True)
    entries = []
    for index, (colour, split) in enumerate(
        zip(
            ["red", "green", "blue", "yellow", "red", "blue", "green", "yellow"],
            ["train"] * 4 + ["val"] * 2 + ["test"] * 2,
            strict=True,
        )
    ):
        name = f"COCO_val2014_{index:012d}.jpg"
        _photo(root / "coco" / "val2014" / name, colour, seed=index)
        sentences = [{"raw": f"a {colour} square on a grey background."}, {"raw": f"A {colour.upper()} box."}]
        entries.append(
            {"filepath": "val2014", "filename": name, "split": split, "cocoid": 100 + index, "sentences": sentences}
        )
    (root / "dataset_coco.json").write_text(json.dumps({"images": entries}))
    torch.manual_seed(0)
    ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8, 12], depths=[1, 1])).save_pretrained(root / "resnet")
    ConvNextImageProcessor(size={"shortest_edge": 32}).save_pretrained(root / "resnet")
    _photo(root / "new_photo.jpg", "blue", seed=99)
    return root


def test_from_a_karpathy_file_to_captions_of_a_new_photo(coco, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(coco)  # the commands of docs/coco.md, with their relative paths
    save_dataset_referencing_images(load_karpathy("dataset_coco.json", "coco"), "data/coco")
    arguments = ["--dataset", "data/coco", "--model", "resnet", "--pooling", "none"]
    assert main(["extract-features", *arguments, "--output-dir", "features/coco"]) == 0
    # the features once, in `dataset/`, beside references to the JPEGs rather than copies of them
    assert [path.name for path in Path("features/coco/shards").iterdir()] == ["manifest.json"]
    stored = b"".join(path.read_bytes() for path in Path("features/coco").rglob("*.arrow"))
    assert not any(photo.read_bytes() in stored for photo in Path("coco/val2014").iterdir())
    _train_xe_main()(
        ["--image_features", "features/coco", "--output_dir", str(tmp_path / "xe-coco"), "--hidden_size", "16",
         "--max_steps", "3", "--per_device_train_batch_size", "2", "--eval_strategy", "no", "--save_strategy", "no",
         "--use_cpu", "--min_word_count", "1", "--report_to", "none"]
    )  # fmt: skip
    config = json.loads((tmp_path / "xe-coco" / "config.json").read_text())
    assert config["image_feature_extractor"]["model"] == str(coco / "resnet")
    assert config["image_feature_extractor"]["layout"] == "grid"
    capsys.readouterr()

    # a photo that is not in the dataset, captioned through the backbone the features came from
    assert main(["caption", "--model", str(tmp_path / "xe-coco"), "new_photo.jpg", "--num-beams", "2"]) == 0
    printed_caption = capsys.readouterr().out.rstrip("\n").split("\t")[1]
    model = ShowTellRL.from_pretrained(tmp_path / "xe-coco").eval()
    processor = CaptionProcessor.from_pretrained(tmp_path / "xe-coco")
    image_processor = AutoImageProcessor.from_pretrained(coco / "resnet")
    backbone = ResNetModel.from_pretrained(coco / "resnet").eval()
    with torch.no_grad():
        feature_map = backbone(**image_processor(images=Image.open("new_photo.jpg"), return_tensors="pt"))
        grid = feature_map.last_hidden_state.flatten(2).transpose(1, 2)  # (1, H * W, C)
        tokens = model.generate(image_features=grid, num_beams=2, max_length=21)
    assert printed_caption == processor.batch_decode(tokens, skip_special_tokens=True)[0]
    # and through transformers' pipeline, which runs the checkpoint's processor and model as they are saved
    captioner = pipeline("image-text-to-text", model=str(tmp_path / "xe-coco"))
    [output] = captioner(
        images=Image.open("new_photo.jpg"), text="", generate_kwargs={"num_beams": 2, "max_length": 21}
    )
    assert printed_caption and output["generated_text"] == printed_caption

    # the features folder named as the recipes name it
    arguments = ["--model", str(tmp_path / "xe-coco"), "--dataset", "features/coco", "--metrics", "cider", "bleu"]
    saved = tmp_path / "captions.json"
    assert main(["evaluate", *arguments, "--save-captions", str(saved)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert {"CIDEr", "Bleu_4"} <= set(scores)
    scored = json.loads(saved.read_text())
    assert sorted(row["image_id"] for row in scored) == [106, 107]
    assert scored[0]["references"] == load_karpathy("dataset_coco.json", "coco")["test"][0]["captions"]


def test_features_of_another_backbone_or_pooling_are_refused_naming_both(coco, tmp_path, monkeypatch):
    monkeypatch.chdir(coco)
    load_karpathy("dataset_coco.json", "coco").save_to_disk(tmp_path / "data")
    for pooling in ("none", "auto"):
        arguments = ["--dataset", str(tmp_path / "data"), "--model", "resnet", "--pooling", pooling]
        assert main(["extract-features", *arguments, "--output-dir", str(tmp_path / pooling), "--split", "train"]) == 0
    grids, pooled = (load_features_dataset(str(tmp_path / pooling)) for pooling in ("none", "auto"))
    processor = CaptionProcessor.from_captions(grids["train"]["captions"])
    fields = new_image_encoder_fields(str(tmp_path / "none"))
    model = new_show_tell_rl(processor, 32, [8], 16, image_encoder=fields)
    check_features_match_model(model, grids, str(tmp_path / "none"))
    with pytest.raises(ValueError, match=r"trained on grid features \(pooling 'none'\).*holds pooled features"):
        check_features_match_model(model, pooled, str(tmp_path / "auto"))
    # the same width from another backbone is refused too
    model.config.image_feature_extractor = {**fields["image_feature_extractor"], "model": "org/other-backbone"}
    with pytest.raises(ValueError, match="org/other-backbone.*extract-features --model org/other-backbone"):
        check_features_match_model(model, grids, str(tmp_path / "none"))


def test_a_captioner_of_region_features_says_a_detector_is_needed(tmp_path):
    from tiny_captioners import regions_show_tell

    model = regions_show_tell(image_attention=True)
    with pytest.raises(ValueError, match="need an object detector.*image_features=.*image_feature_mask"):
        model.generate(pixel_values=torch.zeros(1, 3, 8, 8))
    photo = tmp_path / "photo.jpg"
    _photo(photo, "red", seed=0)
    processor = CaptionProcessor.from_captions(["a red box"], image_size=8)
    with pytest.raises(ValueError, match="object detector"):
        caption_image_files(model, processor, [str(photo)])


def test_published_checkpoints_without_the_record_still_load_and_caption(tmp_path):
    folder = Path(__file__).resolve().parent.parent / "checkpoints" / "show-tell-rl-shapes-xe"
    model, processor = load_captioner(str(folder))
    assert getattr(model.config, "image_feature_extractor", None) is None
    photo = tmp_path / "photo.jpg"
    _photo(photo, "red", seed=0)
    assert len(caption_image_files(model, processor, [str(photo)], max_length=5)) == 1


def test_a_vocabulary_that_leaves_most_words_unknown_is_warned_of():
    captions = ["a red square", "a blue circle", "a red box", "the green star"]  # "a" and "red" are frequent
    for min_count, expected_unknown in ((1, 0.0), (2, 7 / 12), (4, 12 / 12)):
        processor = CaptionProcessor.from_captions(captions, min_count=min_count)
        if expected_unknown > 0.5:
            with pytest.warns(UserWarning, match=f"leaves {expected_unknown:.0%} of the training captions' words"):
                unknown = warn_if_most_words_are_unknown(processor, captions, min_count)
        else:
            unknown = warn_if_most_words_are_unknown(processor, captions, min_count)
        assert unknown == pytest.approx(expected_unknown)


def test_an_evaluation_of_mostly_empty_captions_is_warned_of(capsys):
    _warn_if_captions_are_mostly_empty({1: "a cat", 2: "", 3: "a dog"})
    assert capsys.readouterr().err == ""
    _warn_if_captions_are_mostly_empty({1: "a cat", 2: "", 3: " "})
    assert "2 of the 3 captions are empty" in capsys.readouterr().err


def test_a_cpu_run_neither_pins_memory_nor_asks_for_copies_that_need_it(tmp_path, caplog):
    from rlcaption import RLCaptionConfig, RLCaptionTrainer

    config = RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert config.dataloader_pin_memory is False and config.accelerator_config.non_blocking is False
    model = ShowTellRL.from_pretrained(
        Path(__file__).resolve().parent.parent / "checkpoints" / "show-tell-rl-shapes-xe"
    )
    processor = CaptionProcessor.from_pretrained(
        Path(__file__).resolve().parent.parent / "checkpoints" / "show-tell-rl-shapes-xe"
    )
    with caplog.at_level("WARNING"):
        RLCaptionTrainer(model=model, args=config, processing_class=processor)
    assert "pin_memory" not in caplog.text


def test_features_of_another_width_name_the_width_the_checkpoint_was_trained_on():
    from tiny_captioners import regions_show_tell

    model = regions_show_tell(image_attention=True)  # trained on regions 6 wide, no extractor recorded
    narrower = DatasetDict({"test": Dataset.from_dict({"image_features": [[[0.5] * 4] * 3], "captions": [["a"]]})})
    with pytest.raises(ValueError, match=r"trained on features with no recorded extractor.*of width 6; .* of width 4"):
        check_features_match_model(model, narrower, None)
