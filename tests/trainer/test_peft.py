"""
LoRA adapters through peft (`use_peft`, or a `PeftModel` passed in): only the adapters train and sit in the optimizer,
checkpoints hold them and resume exactly after a kill, the saved folder reloads with `PeftModel.from_pretrained`, the
merged weights load without peft, and `push_to_hub` pushes the adapter with a card naming its base model.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers.trainer
from lora_run import MAX_STEPS, lora_trainer
from peft import LoraConfig, PeftModel, get_peft_model
from tiny_training import IMAGE_SIZE
from transformers import AutoModelForImageTextToText, BlipForConditionalGeneration

from rlcaption.generation.captioners import captioner_for
from rlcaption.generation.decoding import generate_captions
from rlcaption.recipes import parse_recipe_arguments, recipe_model_card
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer, last_complete_checkpoint
from tiny_captioners import make_foreign_captioner

HERE = Path(__file__).parent
GREEDY = transformers.GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=8)


@pytest.fixture(scope="module")
def train_captions(tiny_shapes):
    return [caption for captions in tiny_shapes["train"]["captions"] for caption in captions]


def make_trainer(model, processor, shapes, output_dir, **overrides):
    settings = dict(
        output_dir=str(output_dir), use_cpu=True, objective="scst", per_device_train_batch_size=4, max_steps=2,
        learning_rate=5e-2, save_strategy="no", logging_steps=1, disable_tqdm=True, max_caption_length=8,
        num_samples_per_image=2, seed=0, log_completions=False, lora_r=4,
    )  # fmt: skip
    settings.update(overrides)
    return RLCaptionTrainer(
        model=model, args=RLCaptionConfig(**settings), processing_class=processor, train_dataset=shapes["train"]
    )


def greedy_captions(model, processor, shapes) -> list[str]:
    pixel_values = processor(images=shapes["validation"]["image"][:4], return_tensors="pt")["pixel_values"]
    return generate_captions(model, processor, {"pixel_values": pixel_values}, GREEDY).texts


@pytest.mark.parametrize("kind", ["vit_gpt2", "blip", "git"])
@pytest.mark.parametrize("objective", ["xe", "scst"])
def test_only_the_adapters_train_and_sit_in_the_optimizer(kind, objective, tiny_shapes, train_captions, tmp_path):
    model, processor = make_foreign_captioner(kind, train_captions, IMAGE_SIZE)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    trainer = make_trainer(model, processor, tiny_shapes, tmp_path, objective=objective, use_peft=True)
    trainer.train()
    peft_model = trainer.model
    assert isinstance(peft_model, PeftModel)
    adapters = {name: p for name, p in peft_model.named_parameters() if "lora_" in name}
    assert adapters and all(p.requires_grad for p in adapters.values())
    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in adapters.values()}
    # the base weights did not move; the adapters did (lora_B starts at 0)
    for name, parameter in peft_model.get_base_model().named_parameters():
        if "lora_" not in name:
            assert torch.equal(parameter, before[name.replace(".base_layer", "")]), name
    assert any(p.abs().sum() > 0 for name, p in adapters.items() if "lora_B" in name)


def test_a_peft_model_passed_in_trains_and_is_not_wrapped_twice(tiny_shapes, train_captions, tmp_path):
    model, processor = make_foreign_captioner("git", train_captions, IMAGE_SIZE)
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["query", "value"]))
    # the PeftModel's forward(*args, **kwargs) hides the image inputs: the base model's family is found through it
    assert type(captioner_for(peft_model)).__name__ == "GitCaptioner"
    trainer = make_trainer(peft_model, processor, tiny_shapes, tmp_path)
    trainer.train()
    assert trainer.model is peft_model
    with pytest.raises(ValueError, match="already: it trains its own adapters"):
        make_trainer(peft_model, processor, tiny_shapes, tmp_path, use_peft=True)


def test_unknown_target_modules_are_named(tiny_shapes, train_captions, tmp_path):
    model, processor = make_foreign_captioner("blip", train_captions, IMAGE_SIZE)
    with pytest.raises(ValueError, match=r"lora_target_modules=\['no_such_layer'\]"):
        make_trainer(model, processor, tiny_shapes, tmp_path, use_peft=True, lora_target_modules=["no_such_layer"])


def test_saved_adapter_and_merged_model_reload_and_caption_identically(tiny_shapes, train_captions, tmp_path):
    model, processor = make_foreign_captioner("blip", train_captions, IMAGE_SIZE)
    trainer = make_trainer(model, processor, tiny_shapes, tmp_path, use_peft=True, save_merged_model=True)
    trainer.train()
    trainer.save_model()
    trained = greedy_captions(trainer.model, processor, tiny_shapes)
    # the folder holds the adapter, not the captioner's weights
    assert (tmp_path / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "model.safetensors").exists()
    base, _ = make_foreign_captioner("blip", train_captions, IMAGE_SIZE)
    base_captions = greedy_captions(base, processor, tiny_shapes)
    reloaded = PeftModel.from_pretrained(base, str(tmp_path))
    assert greedy_captions(reloaded, processor, tiny_shapes) == trained
    merged = BlipForConditionalGeneration.from_pretrained(tmp_path / "merged")
    assert greedy_captions(merged, processor, tiny_shapes) == trained
    assert trained != base_captions  # the adapters changed what the captioner says
    with pytest.raises(ValueError, match="save_merged_model=True merges LoRA adapters"):
        RLCaptionConfig(output_dir=str(tmp_path), save_merged_model=True)


def test_resume_after_a_kill_gives_the_adapter_of_an_uninterrupted_run(tmp_path):
    cache = str(tmp_path / "shapes")
    killed_dir = str(tmp_path / "killed")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]), "OMP_NUM_THREADS": "1"}
    killed = subprocess.run(
        [sys.executable, str(HERE / "lora_run.py"), killed_dir, cache, "3"], env=env, capture_output=True, timeout=300
    )
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    checkpoint = last_complete_checkpoint(killed_dir)
    assert os.path.isfile(os.path.join(checkpoint, "adapter_model.safetensors"))
    assert not os.path.exists(os.path.join(checkpoint, "model.safetensors"))
    resumed = lora_trainer(killed_dir, cache)
    resumed.train(resume_from_checkpoint=True)
    uninterrupted = lora_trainer(str(tmp_path / "uninterrupted"), cache)
    uninterrupted.train()
    assert resumed.state.global_step == uninterrupted.state.global_step == MAX_STEPS
    for (name, actual), (_, expected) in zip(
        resumed.model.named_parameters(), uninterrupted.model.named_parameters(), strict=True
    ):
        assert torch.equal(actual, expected), name


def test_push_to_hub_pushes_the_adapter_with_a_card_naming_its_base(
    tiny_shapes, train_captions, tmp_path, monkeypatch
):
    model, processor = make_foreign_captioner("blip", train_captions, IMAGE_SIZE)
    base_folder = tmp_path / "tiny-blip-base"
    model.save_pretrained(base_folder)
    model = AutoModelForImageTextToText.from_pretrained(base_folder)
    pushed = {}

    class OfflineHub:
        def upload_folder(self, repo_id, folder_path, **kwargs):
            pushed["repo_id"] = repo_id
            pushed["files"] = {
                path.name: path.read_text() if path.suffix == ".md" else None for path in Path(folder_path).iterdir()
            }

    monkeypatch.setattr(transformers.trainer, "hf_api", OfflineHub)
    monkeypatch.setattr(RLCaptionTrainer, "init_hf_repo", lambda self, **kwargs: setattr(self, "hub_model_id", "me/x"))
    trainer = make_trainer(model, processor, tiny_shapes, tmp_path / "out", use_peft=True, max_steps=1)
    trainer.train()
    trainer.push_to_hub()
    assert pushed["repo_id"] == "me/x"
    assert "adapter_model.safetensors" in pushed["files"] and "model.safetensors" not in pushed["files"]
    card = pushed["files"]["README.md"]
    assert f"base_model: {base_folder}" in card
    assert "library_name: peft" in card


@pytest.mark.parametrize("recipe", ["train_scst", "train_sle", "train_wtf"])
def test_recipes_take_lora_the_kl_leash_and_checkpointing(recipe, tmp_path):
    spec = importlib.util.spec_from_file_location(recipe, HERE.parent.parent / "examples" / f"{recipe}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config_classes = getattr(module, "CONFIG_CLASSES", None) or [
        module.SCSTConfig if recipe == "train_scst" else module.WTFConfig
    ]
    argv = [
        "--output_dir", str(tmp_path), "--use_peft", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0.1",
        "--lora_target_modules", "query", "value", "--beta", "0.04", "--gradient_checkpointing", "--save_merged_model",
    ]  # fmt: skip
    _, training_args = parse_recipe_arguments(module.ScriptArguments, module.RECIPE_DEFAULTS, argv, config_classes)
    assert training_args.use_peft and training_args.gradient_checkpointing and training_args.save_merged_model
    assert (training_args.lora_r, training_args.lora_alpha, training_args.lora_dropout) == (8, 16, 0.1)
    assert training_args.lora_target_modules == ["query", "value"]
    assert training_args.beta == 0.04


def test_a_recipe_card_of_adapters_names_their_base_model(tiny_shapes, train_captions, tmp_path):
    spec = importlib.util.spec_from_file_location("train_scst", HERE.parent.parent / "examples" / "train_scst.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["--output_dir", str(tmp_path), "--use_peft", "--model_name_or_path", "org/base-captioner"]
    script_args, training_args = parse_recipe_arguments(
        module.ScriptArguments, module.RECIPE_DEFAULTS, argv, [module.SCSTConfig]
    )
    model, _ = make_foreign_captioner("blip", train_captions, IMAGE_SIZE)
    card = recipe_model_card(model, training_args, script_args, {"CIDEr": 0.5}, 4, "Summary.", "train_scst.py", {})
    assert card.data.base_model == "org/base-captioner" and card.data.library_name == "peft"
    assert f'PeftModel.from_pretrained(base, "{tmp_path}")' in card.content
