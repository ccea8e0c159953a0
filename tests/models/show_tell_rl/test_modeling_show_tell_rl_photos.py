"""A ShowTellRL trained on precomputed features captions photos: given `pixel_values` from its processor, it runs the
backbone its config records (`image_feature_extractor`), loaded once and never saved with it, in `generate`, in
transformers' `image-text-to-text` pipeline and with `trust_remote_code` where rlcaption is not installed."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from transformers import AutoModel, AutoProcessor, ConvNextImageProcessor, ResNetConfig, ResNetModel, pipeline

from rlcaption.data.features import extract_features
from rlcaption.inference import caption_image_files, load_captioner
from rlcaption.models import ShowTellRL, ShowTellRLConfig
from rlcaption.processing import CaptionProcessor, image_processor_of_extractor

CAPTIONS = ["a red square", "a blue square on grey", "a green box", "two yellow boxes"]
SRC = Path(__file__).resolve().parents[3] / "src"


def photo(seed: int) -> Image.Image:
    """A 40x30 photo, not square (the backbone's processor resizes its shortest edge)."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
    pixels[6:20, 10:24] = (30, 40, 220)
    return Image.fromarray(pixels)


@pytest.fixture(scope="module")
def backbone_folder(tmp_path_factory) -> Path:
    """A tiny ResNet (width 12) saved with its image processor, as a Hub checkpoint is."""
    folder = tmp_path_factory.mktemp("resnet")
    torch.manual_seed(0)
    ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8, 12], depths=[1, 1])).save_pretrained(folder)
    ConvNextImageProcessor(size={"shortest_edge": 32}, image_mean=[0.4, 0.5, 0.6]).save_pretrained(folder)
    return folder


def extractor_record(backbone_folder: Path, pooling: str) -> dict:
    """The record `rlcaption extract-features` writes in its manifest and `train_xe.py` copies into the config."""
    image_processor = ConvNextImageProcessor.from_pretrained(backbone_folder)
    return {
        "model": str(backbone_folder),
        "image_processor": json.loads(image_processor.to_json_string()),
        "pooling": pooling,
        "layout": "grid" if pooling == "none" else "pooled",
    }


def features_captioner(backbone_folder: Path, pooling: str, with_record: bool = True) -> ShowTellRL:
    torch.manual_seed(0)
    config = ShowTellRLConfig(
        vocab_size=len(CaptionProcessor.from_captions(CAPTIONS).tokenizer), hidden_size=16, word_embedding_size=8,
        max_caption_length=6, encoder_type="features", image_feature_size=12,
        image_feature_layout="grid" if pooling == "none" else "pooled", image_attention=pooling == "none",
        image_feature_extractor=extractor_record(backbone_folder, pooling) if with_record else None,
    )  # fmt: skip
    return ShowTellRL(config).eval()


def features_by_the_backbone(backbone_folder: Path, image: Image.Image, pooling: str) -> torch.Tensor:
    """What `rlcaption extract-features` stores for `image`, computed here with the backbone's own classes."""
    backbone = ResNetModel.from_pretrained(backbone_folder).eval()
    pixel_values = ConvNextImageProcessor.from_pretrained(backbone_folder)(images=image, return_tensors="pt")
    with torch.no_grad():
        outputs = backbone(**pixel_values)
    if pooling == "none":
        return outputs.last_hidden_state.flatten(2).transpose(1, 2)  # (1, H * W, 12)
    return outputs.pooler_output.flatten(1)  # (1, 12)


def save_features_captioner(folder: Path, model: ShowTellRL, backbone_folder: Path) -> CaptionProcessor:
    """Saves `model` with a processor carrying the backbone's image processor, as `train_xe.py` does."""
    processor = CaptionProcessor.from_captions(CAPTIONS)
    processor.image_processor = image_processor_of_extractor(model.config.image_feature_extractor)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return processor


@pytest.mark.parametrize("pooling", ["none", "auto"])
def test_the_pipeline_captions_a_photo_as_the_backbones_features_do(backbone_folder, tmp_path, pooling):
    model = features_captioner(backbone_folder, pooling)
    save_features_captioner(tmp_path / "captioner", model, backbone_folder)
    image = photo(seed=1)
    image.save(tmp_path / "photo.png")
    features = features_by_the_backbone(backbone_folder, image, pooling)
    with torch.no_grad():
        expected_tokens = model.generate(image_features=features, max_new_tokens=5)
    processor = CaptionProcessor.from_pretrained(tmp_path / "captioner")
    expected = processor.batch_decode(expected_tokens)[0]
    assert expected  # a caption of words, not only special tokens

    pixel_values = processor(images=image)["pixel_values"]
    torch.testing.assert_close(model.image_encoder.features_of_pixels(pixel_values), features)
    captioner = pipeline("image-text-to-text", model=str(tmp_path / "captioner"))
    [output] = captioner(images=image, text="", generate_kwargs={"max_new_tokens": 5})
    assert output["generated_text"] == expected
    loaded, loaded_processor = load_captioner(str(tmp_path / "captioner"))
    captions = caption_image_files(loaded, loaded_processor, [str(tmp_path / "photo.png")], max_new_tokens=5)
    assert captions == [expected]


def test_the_backbone_is_loaded_once_and_never_saved(backbone_folder, tmp_path, monkeypatch):
    model = features_captioner(backbone_folder, "none")
    saved_without_backbone = set(model.state_dict())
    loads = []
    load = AutoModel.from_pretrained
    monkeypatch.setattr(
        AutoModel, "from_pretrained", lambda *args, **kwargs: loads.append(args) or load(*args, **kwargs)
    )
    processor = save_features_captioner(tmp_path / "before", model, backbone_folder)
    pixel_values = processor(images=[photo(seed=1), photo(seed=2)])["pixel_values"]
    with torch.no_grad():
        model.generate(pixel_values=pixel_values, num_beams=2)
        model.generate(pixel_values=pixel_values[:1])
    assert loads == [(str(backbone_folder),)]
    assert set(model.state_dict()) == saved_without_backbone
    model.save_pretrained(tmp_path / "after")
    with safe_open(tmp_path / "after" / "model.safetensors", "pt") as saved:
        assert set(saved.keys()) == saved_without_backbone
    # the backbone's weights are in neither file: saved before and after it ran, the captioner is the same size
    before, after = ((tmp_path / name / "model.safetensors").stat().st_size for name in ("before", "after"))
    assert before == after


def test_precomputed_features_are_read_as_before_without_running_the_backbone(backbone_folder, monkeypatch):
    model = features_captioner(backbone_folder, "none")
    before = features_captioner(backbone_folder, "none", with_record=False)  # a model of an older version
    before.load_state_dict(model.state_dict())
    monkeypatch.setattr(AutoModel, "from_pretrained", pytest.fail)  # the backbone must not be loaded
    features = torch.randn(2, 4, 12)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    ids = torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0]])
    with torch.no_grad():
        logits = model(input_ids=ids, image_features=features, image_feature_mask=mask).logits
        # pixel_values a batch carries beside its features (the images a CLIP reward reads) are not read
        with_pixels = model(input_ids=ids, image_features=features, pixel_values=torch.zeros(2, 3, 32, 32)).logits
        torch.testing.assert_close(
            logits, before(input_ids=ids, image_features=features, image_feature_mask=mask).logits
        )
        torch.testing.assert_close(with_pixels, before(input_ids=ids, image_features=features).logits)


def test_a_checkpoint_of_an_older_version_captions_photos_and_features(backbone_folder, tmp_path):
    # the processor saved beside it holds the captioner's own image processor: a 64x64 square the backbone never saw
    model = features_captioner(backbone_folder, "auto")
    model.save_pretrained(tmp_path / "older")
    CaptionProcessor.from_captions(CAPTIONS).save_pretrained(tmp_path / "older")
    recorded = model.config.image_feature_extractor["image_processor"]
    for processor in (
        CaptionProcessor.from_pretrained(tmp_path / "older"),
        AutoProcessor.from_pretrained(tmp_path / "older"),
    ):
        assert json.loads(processor.image_processor.to_json_string()) == recorded
    features = features_by_the_backbone(backbone_folder, photo(seed=3), "auto")
    loaded, processor = load_captioner(str(tmp_path / "older"))
    with torch.no_grad():
        from_features = loaded.generate(image_features=features, min_new_tokens=2)
        from_photo = loaded.generate(pixel_values=processor(images=photo(seed=3))["pixel_values"], min_new_tokens=2)
    assert torch.equal(from_features, from_photo)
    # a record of an older manifest, without the image processor's settings: the backbone's own one
    older_record = {
        key: value for key, value in model.config.image_feature_extractor.items() if key != "image_processor"
    }
    assert (
        image_processor_of_extractor(older_record).to_dict()
        == image_processor_of_extractor(model.config.image_feature_extractor).to_dict()
    )


def test_pixel_values_with_a_region_mask_are_refused(backbone_folder):
    model = features_captioner(backbone_folder, "none")
    with pytest.raises(ValueError, match="image_feature_mask without the image_features it masks"):
        model.generate(pixel_values=torch.zeros(1, 3, 32, 32), image_feature_mask=torch.ones(1, 4))


@pytest.mark.slow  # a fresh interpreter imports torch and transformers: about 7 s
def test_a_features_checkpoint_registered_for_remote_code_captions_photos_without_rlcaption(backbone_folder, tmp_path):
    model = features_captioner(backbone_folder, "none")
    classes = (ShowTellRLConfig, ShowTellRL, CaptionProcessor)
    auto_classes = ("AutoConfig", "AutoModelForImageTextToText", "AutoProcessor")
    for auto_class, registered in zip(auto_classes, classes, strict=True):
        registered.register_for_auto_class(auto_class)
    try:
        processor = save_features_captioner(tmp_path / "saved", model, backbone_folder)
    finally:
        for registered in classes:
            registered._auto_class = None
    image = photo(seed=4)
    image.save(tmp_path / "photo.png")
    with torch.no_grad():
        tokens = model.generate(
            image_features=features_by_the_backbone(backbone_folder, image, "none"), max_new_tokens=5
        )
    # `-I` and the dropped editable-install entry: rlcaption cannot be imported (as in tests/models/test_auto.py)
    script = textwrap.dedent(
        """
        import importlib.util, sys
        from pathlib import Path
        sys.path = [entry for entry in sys.path if Path(entry or ".").resolve() != Path("{src}")]
        assert importlib.util.find_spec("rlcaption") is None, "rlcaption is importable"
        from PIL import Image
        from transformers import pipeline
        captioner = pipeline("image-text-to-text", model="{saved}", trust_remote_code=True)
        [output] = captioner(images=Image.open("{image}"), text="", generate_kwargs={{"max_new_tokens": 5}})
        print(output["generated_text"])
        """
    ).format(src=SRC, saved=tmp_path / "saved", image=tmp_path / "photo.png")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-I", "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == processor.batch_decode(tokens)[0]


def test_a_large_photo_reaches_the_backbone_as_extraction_gave_it(backbone_folder, tmp_path):
    # 400x300 is over 4 times the backbone's 32-pixel side: both paths box-reduce it (by 2) before the processor
    pixels = np.random.default_rng(3).integers(0, 256, size=(300, 400, 3), dtype=np.uint8)
    large_photo = Image.fromarray(pixels)
    photos = datasets.Dataset.from_dict(
        {"image": [large_photo], "captions": [["a red square"]]}, features=datasets.Features(
            {"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string"))}
        ),
    )  # fmt: skip
    extracted = extract_features(
        datasets.DatasetDict({"test": photos}), str(backbone_folder), tmp_path / "features", pooling="none"
    )
    stored = torch.tensor(np.asarray(extracted["test"][0]["image_features"], dtype=np.float32))[None]

    model = features_captioner(backbone_folder, "none")
    processor = save_features_captioner(tmp_path / "captioner", model, backbone_folder)
    at_captioning = model.image_encoder.features_of_pixels(processor(images=large_photo)["pixel_values"])
    torch.testing.assert_close(at_captioning, stored)
    # the reduction is what both paths share: from full resolution the backbone sees other pixels
    assert not torch.allclose(features_by_the_backbone(backbone_folder, large_photo, "none"), stored, atol=1e-3)
