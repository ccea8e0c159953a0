"""The `transformers` Auto classes and the `image-text-to-text` pipeline on rlcaption checkpoints: the published
folders (read-only) and tiny models saved here, codeless by default and loadable without rlcaption when their
classes are registered for `trust_remote_code`."""

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from PIL import Image, ImageDraw
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForImageTextToText,
    AutoProcessor,
    pipeline,
)

from rlcaption.models import ShowTellRL, ShowTellRLConfig
from rlcaption.processing import CaptionProcessor
from tiny_captioners import make_show_tell

CHECKPOINTS = Path(__file__).resolve().parents[2] / "checkpoints"
PUBLISHED = CHECKPOINTS / "show-tell-rl-shapes-xe"
SRC = Path(__file__).resolve().parents[2] / "src"
CAPTIONS = ["a red circle", "a blue square left of a red circle", "two shapes on a white background"]


def shapes_image() -> Image.Image:
    image = Image.new("RGB", (48, 48), "white")
    draw = ImageDraw.Draw(image)
    draw.ellipse((4, 16, 20, 32), fill="red")
    draw.rectangle((28, 16, 44, 32), fill="blue")
    return image


def caption_by_generate(model, processor, image: Image.Image, **generation_kwargs) -> str:
    pixel_values = processor(images=image, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return processor.batch_decode(model.generate(pixel_values=pixel_values, **generation_kwargs))[0]


def absolute_imports(code: str) -> set[str]:
    """The top-level packages a module's code imports, wherever the import statement is."""
    modules = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module)
    return {module.split(".")[0] for module in modules}


@pytest.fixture
def tiny_checkpoint(tmp_path):
    processor = CaptionProcessor.from_captions(CAPTIONS, image_size=16)
    model = make_show_tell(processor, image_size=16, image_attention=True).eval()
    model.save_pretrained(tmp_path / "tiny")
    processor.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny", model, processor


@pytest.mark.parametrize("folder", ["published", "tiny"])
def test_every_auto_class_resolves_a_saved_checkpoint(folder, tiny_checkpoint):
    path = PUBLISHED if folder == "published" else tiny_checkpoint[0]
    assert type(AutoConfig.from_pretrained(path)) is ShowTellRLConfig
    assert type(AutoModel.from_pretrained(path)) is ShowTellRL
    assert type(AutoModelForImageTextToText.from_pretrained(path)) is ShowTellRL
    assert type(AutoProcessor.from_pretrained(path)) is CaptionProcessor


def test_pipeline_captions_with_the_published_checkpoint():
    # transformers 5 answers the former `image-to-text` task with `image-text-to-text`, which takes a text prompt:
    # an empty one asks for a whole caption
    captioner = pipeline("image-text-to-text", model=str(PUBLISHED))
    image = shapes_image()
    [output] = captioner(images=image, text="")
    expected = caption_by_generate(captioner.model, captioner.processor, image)
    assert expected and output["generated_text"] == expected


@pytest.mark.parametrize("name", sorted(card.parent.name for card in CHECKPOINTS.glob("*/README.md")))
def test_each_published_card_tags_the_pipeline_that_runs_its_checkpoint(name):
    card = ModelCard.load(CHECKPOINTS / name / "README.md")
    captions = type(AutoConfig.from_pretrained(CHECKPOINTS / name)) in AutoModelForImageTextToText._model_mapping
    # the captioners run in transformers 5's `image-text-to-text` pipeline (it has no `image-to-text` any more); the
    # CLIPs and the embedding score captions against images
    assert card.data.pipeline_tag == ("image-text-to-text" if captions else "zero-shot-image-classification")
    assert "image-to-text" not in card.data.tags


def test_pipeline_continues_a_caption_prompt(tiny_checkpoint):
    path, model, processor = tiny_checkpoint
    captioner = pipeline("image-text-to-text", model=str(path))
    image = shapes_image()
    [output] = captioner(images=image, text="a blue", max_new_tokens=4)
    prompt_ids = processor(text="a blue")["input_ids"][:, :-1]  # <bos> a blue, without <eos>
    pixel_values = processor(images=image)["pixel_values"]
    with torch.no_grad():
        continued = model.generate(pixel_values=pixel_values, input_ids=prompt_ids, max_new_tokens=4)
    assert output["generated_text"] == processor.batch_decode(continued)[0]
    assert output["generated_text"].startswith("a blue")


def test_generate_continues_each_prompt_of_a_padded_batch(tiny_checkpoint):
    _, model, processor = tiny_checkpoint
    images = [shapes_image(), shapes_image().transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    prompts = ["a red circle", "two"]
    inputs = processor(images=images, text=prompts)  # each prompt ends with <eos>, the shorter one is padded
    with torch.no_grad():
        batched = model.generate(**inputs, max_new_tokens=5)
    for row, prompt in enumerate(prompts):
        prompt_ids = processor(text=prompt)["input_ids"][:, :-1]
        with torch.no_grad():
            alone = model.generate(
                pixel_values=inputs["pixel_values"][row : row + 1], input_ids=prompt_ids, max_new_tokens=5
            )
        assert processor.batch_decode(batched[row : row + 1]) == processor.batch_decode(alone)
        assert processor.decode(batched[row]).startswith(prompt)


def test_a_saved_processor_carries_no_code_by_default(tiny_checkpoint):
    path = tiny_checkpoint[0]
    assert not list(path.glob("*.py"))
    for name in ("processor_config.json", "tokenizer_config.json", "config.json"):
        assert "auto_map" not in json.loads((path / name).read_text()), name


@pytest.fixture
def registered_for_remote_code():
    ShowTellRLConfig.register_for_auto_class("AutoConfig")
    ShowTellRL.register_for_auto_class("AutoModelForImageTextToText")
    CaptionProcessor.register_for_auto_class("AutoProcessor")
    yield
    ShowTellRLConfig._auto_class = None
    ShowTellRL._auto_class = None
    CaptionProcessor._auto_class = None


def test_checkpoint_registered_for_remote_code_captions_without_rlcaption(tmp_path, registered_for_remote_code):
    processor = CaptionProcessor.from_captions(CAPTIONS, image_size=16)
    model = make_show_tell(processor, image_size=16, image_attention=True).eval()
    model.save_pretrained(tmp_path / "saved")
    processor.save_pretrained(tmp_path / "saved")
    saved_code = {path.name: path.read_text() for path in (tmp_path / "saved").glob("*.py")}
    assert {"processing.py", "modeling_show_tell_rl.py", "encoders.py"} <= set(saved_code)
    for name, code in saved_code.items():
        # imports of the package would fail for users without it (transformers checks every import first)
        assert "rlcaption" not in absolute_imports(code), name
    image = shapes_image()
    image.save(tmp_path / "image.png")
    # `-I` keeps the working directory and PYTHON* variables off the path; the editable install's entry for src/ is
    # dropped by hand, so the package cannot be imported at all, as for a user who never installed it
    script = textwrap.dedent(
        """
        import importlib.util, json, sys
        from pathlib import Path
        sys.path = [entry for entry in sys.path if Path(entry or ".").resolve() != Path("{src}")]
        assert importlib.util.find_spec("rlcaption") is None, "rlcaption is importable"
        from PIL import Image
        from transformers import AutoProcessor, pipeline
        processor = AutoProcessor.from_pretrained("{saved}", trust_remote_code=True)
        assert type(processor).__name__ == "CaptionProcessor", type(processor)
        assert type(processor).__module__.startswith("transformers_modules"), type(processor).__module__
        captioner = pipeline("image-text-to-text", model="{saved}", trust_remote_code=True)
        [output] = captioner(images=Image.open("{image}"), text="", max_new_tokens=6)
        encoded = processor(text="A red, circle!")["input_ids"].tolist()
        print(json.dumps({{"caption": output["generated_text"], "encoded": encoded}}))
        """
    ).format(src=SRC, saved=tmp_path / "saved", image=tmp_path / "image.png")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-I", "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    assert remote["caption"] == caption_by_generate(model, processor, image, max_new_tokens=6)
    assert remote["encoded"] == processor(text="A red, circle!")["input_ids"].tolist()
