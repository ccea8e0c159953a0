"""The shared steps of the recipes: arguments, resuming, paths, publishing offline."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import datasets
import huggingface_hub.constants
import pytest
import torch

from rlcaption import recipe_arguments
from rlcaption.hub import publish_folder
from rlcaption.models import PolicyValueCaptioner
from rlcaption.objectives import ActorCriticConfig, SCSTConfig
from rlcaption.recipes import (
    RecipeArguments,
    check_pretrained_reference,
    check_the_captioner_gets_steps,
    dataloader_workers_for_images,
    parse_recipe_arguments,
    resolve_resume_from_checkpoint,
)
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_recipe(name: str):
    """The recipe `examples/<name>.py` imported as a module, registered as an import registers it."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def write_checkpoint(output_dir: Path, step: int, complete: bool = True) -> Path:
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if complete:
        (folder / "trainer_state.json").write_text("{}")
    return folder


# ------------------------------------------------------------------ resuming


def test_an_unset_flag_resumes_from_the_newest_complete_checkpoint_unless_overwriting(tmp_path):
    assert resolve_resume_from_checkpoint(None, str(tmp_path / "new")) is None
    write_checkpoint(tmp_path, 2)
    newest = write_checkpoint(tmp_path, 4)
    write_checkpoint(tmp_path, 6, complete=False)  # a save killed midway is never resumed from
    assert resolve_resume_from_checkpoint(None, str(tmp_path)) == str(newest)
    assert resolve_resume_from_checkpoint(None, str(tmp_path), overwrite_output_dir=True) is None


@pytest.mark.parametrize("value", ["true", "True", True, "last"])
def test_true_resumes_from_the_newest_complete_checkpoint(tmp_path, value):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        resolve_resume_from_checkpoint(value, str(tmp_path))
    newest = write_checkpoint(tmp_path, 3)
    assert resolve_resume_from_checkpoint(value, str(tmp_path)) == str(newest)


def test_false_starts_afresh_and_a_missing_folder_fails_at_once(tmp_path):
    write_checkpoint(tmp_path, 3)
    assert resolve_resume_from_checkpoint("false", str(tmp_path)) is None
    assert resolve_resume_from_checkpoint(False, str(tmp_path)) is None
    with pytest.raises(FileNotFoundError, match="checkpoint-9: no such checkpoint folder"):
        resolve_resume_from_checkpoint(str(tmp_path / "checkpoint-9"), str(tmp_path))
    chosen = write_checkpoint(tmp_path / "elsewhere", 1)
    assert resolve_resume_from_checkpoint(str(chosen), str(tmp_path)) == str(chosen)


@pytest.mark.parametrize("after", [[], ["--use_cpu"]])
def test_the_resume_flag_without_a_value_means_the_newest_checkpoint(tmp_path, after):
    newest = write_checkpoint(tmp_path, 5)
    recipe = load_recipe("train_scst")
    _, training_args = parse_recipe_arguments(
        recipe.ScriptArguments,
        recipe.RECIPE_DEFAULTS,
        ["--output_dir", str(tmp_path), "--resume_from_checkpoint", *after],
        [SCSTConfig],
    )
    assert training_args.resume_from_checkpoint == str(newest)


# ------------------------------------------------------------------ defaults and objectives


def test_recipe_defaults_reach_the_training_arguments(tmp_path):
    _, xe_args = parse_recipe_arguments(
        load_recipe("train_xe").ScriptArguments,
        load_recipe("train_xe").RECIPE_DEFAULTS,
        ["--output_dir", str(tmp_path)],
    )
    assert (xe_args.objective, xe_args.learning_rate, xe_args.num_train_epochs) == ("xe", 2e-3, 6.0)
    assert (xe_args.per_device_train_batch_size, xe_args.eval_num_beams) == (32, 1)
    scst = load_recipe("train_scst")
    script_args, scst_args = parse_recipe_arguments(
        scst.ScriptArguments, scst.RECIPE_DEFAULTS, ["--output_dir", "x"], [SCSTConfig]
    )
    assert (scst_args.objective, scst_args.reward_funcs, scst_args.learning_rate) == ("scst", ["cider"], 5e-4)
    assert scst_args.num_samples_per_image == 5 and script_args.dataset == "shapes"
    # a command-line value wins over the recipe's default
    _, scst_args = parse_recipe_arguments(
        scst.ScriptArguments, scst.RECIPE_DEFAULTS, ["--output_dir", "x", "--learning_rate", "1e-5"], [SCSTConfig]
    )
    assert scst_args.learning_rate == 1e-5


@pytest.mark.parametrize(
    ("recipe", "objective"), [("train_xe", "scst"), ("train_scst", "xe"), ("train_spider", "xe"), ("train_sle", "wtf")]
)
def test_a_recipe_refuses_another_objective_instead_of_replacing_it(tmp_path, recipe, objective):
    with pytest.raises(ValueError, match=f"--objective {objective} belongs to another recipe"):
        load_recipe(recipe).main(["--output_dir", str(tmp_path), "--objective", objective, "--reward_funcs", "cider"])


@pytest.mark.parametrize(
    ("recipe", "arguments", "message"),
    [
        ("train_xe", ["--learning_rate", "-0.1"], "learning_rate must be > 0, got -0.1"),
        ("train_spider", ["--reward_funcs", "cidr"], "unknown reward 'cidr'; built-in rewards: .*'cider'"),
        ("train_scst", ["--objective", "scts"], "objective='scts' is unknown; valid objectives: .*'scst'"),
        ("train_wtf", ["--wtf_alpha", "1.5"], "wtf_alpha weighs two rewards and must be in \\[0, 1\\], got 1.5"),
        ("train_spider", ["--xe_learning_rate", "0"], "--xe_learning_rate > 0"),
    ],
)
def test_a_bad_option_fails_when_parsed_before_any_data_or_model(tmp_path, monkeypatch, recipe, arguments, message):
    module = load_recipe(recipe)
    monkeypatch.setattr(module, "load_recipe_dataset", lambda script_args: pytest.fail("data loaded"))
    with pytest.raises(ValueError, match=message):
        module.main(["--output_dir", str(tmp_path), *arguments])


@pytest.mark.parametrize(
    ("recipe", "option"),
    [("train_wtf", "discriminator_pretraining_steps"), ("train_actor_critic", "value_pretraining_steps")],
)
def test_a_budget_the_pretraining_uses_up_is_refused_before_any_data(tmp_path, monkeypatch, recipe, option):
    module = load_recipe(recipe)
    monkeypatch.setattr(module, "load_recipe_dataset", lambda script_args: pytest.fail("data loaded"))
    with pytest.raises(ValueError, match=f"--max_steps 5 ends within the .* steps of --{option}"):
        module.main(["--output_dir", str(tmp_path), "--max_steps", "5"])


def test_a_pretraining_only_run_is_let_through_when_asked_for(tmp_path, monkeypatch):
    # a PSST listener warmed up once, the start of several runs: the captioner is fixed on purpose
    module = load_recipe("train_psst")

    def load(name):
        raise RuntimeError("stop before training")

    monkeypatch.setattr(module, "load_pretrained_captioner", load)
    arguments = ["--output_dir", str(tmp_path), "--listener_pretraining_steps", "5", "--max_steps", "5"]
    with pytest.raises(ValueError, match="--max_steps 5 ends within the 5 steps of --listener_pretraining_steps"):
        module.main(arguments)
    with pytest.raises(RuntimeError, match="stop before training"):  # parsed and let through
        module.main([*arguments, "--pretraining_only", "True"])


def test_a_budget_in_epochs_the_pretraining_uses_up_is_refused(tiny_show_tell, tmp_path):
    captioner, processor, shapes = tiny_show_tell
    model = PolicyValueCaptioner.from_policy(captioner, value_hidden_size=8, value_mlp_hidden_size=8)
    args = ActorCriticConfig(
        output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, num_train_epochs=2,
        value_pretraining_steps=4, report_to="none",
    )  # fmt: skip
    trainer = RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=shapes["train"])
    assert trainer.planned_steps() == 4  # 8 images, 4 per step, 2 epochs
    with pytest.raises(ValueError, match="4 optimizer steps all go to pretraining"):
        check_the_captioner_gets_steps(trainer, RecipeArguments())
    check_the_captioner_gets_steps(trainer, RecipeArguments(pretraining_only=True))  # asked for
    trainer.args.value_pretraining_steps = 3
    check_the_captioner_gets_steps(trainer, RecipeArguments())
    assert trainer.objective.steps_by_phase(4) == {"value_pretraining": 3, "actor_critic": 1}


def test_the_spider_recipe_starts_from_the_seeing_xe_captioner():
    module = load_recipe("train_spider")
    start = module.ScriptArguments().model_name_or_path
    config = json.loads((Path(start) / "config.json").read_text())
    # scene-pretrained CNN, kept fixed, and attention over its grid: the captioner every RL recipe starts from
    assert config["image_attention"] and config["freeze_image_encoder"]
    assert start == load_recipe("train_scst").ScriptArguments().model_name_or_path
    assert module.ScriptArguments().xe_epochs == 0


# ------------------------------------------------------------------ paths


def test_a_mistyped_local_path_fails_at_once_naming_the_option(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "xe").mkdir(parents=True)
    check_pretrained_reference("runs/xe")  # a folder
    monkeypatch.setattr("rlcaption.hub.references.hub_unreachable_reason", lambda: None)
    check_pretrained_reference("org/name")  # a Hub id while the Hub answers: from_pretrained's to resolve
    for typo in ("runs/xee", "./runs/xe2", "/nowhere/xe", "runs/xe/checkpoint-7"):
        with pytest.raises(FileNotFoundError, match=f"--model_name_or_path {typo}: no such folder"):
            check_pretrained_reference(typo)


def test_the_scst_recipe_names_a_mistyped_start_before_loading_any_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="checkpoints/show-tell-rl-shapes-xee: no such folder"):
        load_recipe("train_scst").main(
            ["--output_dir", "out", "--model_name_or_path", "checkpoints/show-tell-rl-shapes-xee"]
        )


# ------------------------------------------------------------------ publishing without a network


def test_publishing_offline_says_the_saved_folder_is_intact(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(RuntimeError, match="is intact"):
        publish_folder(tmp_path, "org/model")
    assert (tmp_path / "model.safetensors").read_bytes() == b"weights"


def test_push_to_hub_offline_fails_before_training(tmp_path, monkeypatch, tiny_show_tell):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    model, processor, shapes = tiny_show_tell
    args = RLCaptionConfig(output_dir=str(tmp_path), push_to_hub=True, hub_model_id="org/model", use_cpu=True)
    with pytest.raises(RuntimeError, match="Nothing was trained yet"):
        RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=shapes["train"])


@pytest.fixture
def tiny_show_tell():
    from rlcaption.data import load_shapes
    from rlcaption.processing import CaptionProcessor
    from rlcaption.recipes import new_show_tell_rl

    shapes = load_shapes(num_train=8, num_validation=2, num_test=2, image_size=48)
    captions = [caption for row in shapes["train"]["captions"] for caption in row]
    processor = CaptionProcessor.from_captions(captions, image_size=48)
    return new_show_tell_rl(processor, 48, [4, 8], 8), processor, shapes


class _ModelBuilt(Exception):
    """Stops a recipe once its model is built, before any training."""


@pytest.mark.parametrize(
    "recipe, stop_at, new_network",
    [("train_actor_critic", "RLCaptionTrainer", "value_network"), ("train_psst", "train_and_finish", "listener")],
)
def test_the_network_a_recipe_adds_to_the_captioner_starts_from_the_run_s_seed(
    recipe, stop_at, new_network, tmp_path, monkeypatch
):
    module = load_recipe(recipe)
    no_rows = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"image": [], "captions": []})})
    monkeypatch.setattr(module, "load_recipe_dataset", lambda script_args: no_rows)

    def stop(model, *args, **kwargs):
        raise _ModelBuilt(model)

    monkeypatch.setattr(module, stop_at, stop)

    def initial_weights(seed: int) -> list[torch.Tensor]:
        torch.rand(int(torch.randint(1, 100, ())))  # random numbers drawn before the recipe must not matter
        with pytest.raises(_ModelBuilt) as built:
            module.main(["--output_dir", str(tmp_path / f"seed{seed}"), "--use_cpu", "--seed", str(seed)])
        return [weight.clone() for weight in getattr(built.value.args[0], new_network).parameters()]

    first, again, other = initial_weights(0), initial_weights(0), initial_weights(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


# ------------------------------------------------------------------ each recipe's options

# options that belong to some methods' configs only: a recipe lists those of its own method only
METHOD_OPTIONS = {
    "scst": ("baseline", "entropy_bonus_weight"),
    "sle": ("sle_alpha", "sle_distance"),
    "spider_pg": ("num_rollouts", "num_paths_per_image", "baseline_pretraining_steps"),
    "wtf": ("wtf_variant", "wtf_alpha", "reward_clip", "discriminator_learning_rate"),
    "psst": ("baseline", "psst_lambda", "psst_mode", "listener_pretraining_steps"),
    "actor_critic": ("value_learning_rate", "value_pretraining_steps"),
}
# (recipe, its arguments besides --help) -> the method whose options it lists: SLE's recipe runs its SLL baselines as
# `--objective scst`, with SCST's config
RECIPE_METHODS = {
    ("train_xe", ()): None,
    ("train_scst", ()): "scst",
    ("train_sle", ()): "sle",
    ("train_sle", ("--objective", "scst")): "scst",
    ("train_spider", ()): "spider_pg",
    ("train_wtf", ()): "wtf",
    ("train_psst", ()): "psst",
    ("train_actor_critic", ()): "actor_critic",
}


@pytest.mark.parametrize(
    ("recipe", "arguments"),
    list(RECIPE_METHODS),
    ids=[" ".join([recipe, *arguments]) for recipe, arguments in RECIPE_METHODS],
)
def test_a_recipe_s_help_lists_its_method_s_options_and_the_shared_ones_only(recipe, arguments, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_recipe(recipe).main([*arguments, "--help"])
    assert exit_info.value.code == 0
    listed = set(re.findall(r"^\s+--(\w+)", capsys.readouterr().out, flags=re.MULTILINE))
    assert {"output_dir", "learning_rate", "reward_funcs", "num_samples_per_image", "eval_num_beams"} <= listed
    own = set(METHOD_OPTIONS.get(RECIPE_METHODS[recipe, arguments], ()))
    for options in METHOD_OPTIONS.values():
        assert all((option in listed) == (option in own) for option in options), sorted(listed & set(options))


@pytest.mark.parametrize(
    "arguments, workers",
    [
        (["--dataset", "data/coco"], 3),  # image files: decoded in workers
        (["--dataset=data/coco", "--dataloader_num_workers", "0"], 0),  # as asked
        (["--dataset", "data/coco", "--dataloader-num-workers=2"], 2),
        ([], 0),  # the shapes dataset keeps its published results
        (["--dataset", "shapes"], 0),
    ],
)
def test_recipes_decode_image_files_in_worker_processes(monkeypatch, tmp_path, arguments, workers):
    monkeypatch.setattr(recipe_arguments, "dataloader_workers_for_images", lambda: 3)
    _, training_args = parse_recipe_arguments(RecipeArguments, argv=["--output_dir", str(tmp_path), *arguments])
    assert training_args.dataloader_num_workers == workers


@pytest.mark.parametrize("cores, processes, workers", [(16, 1, 4), (16, 8, 1), (4, 1, 3), (2, 1, 1), (1, 1, 0)])
def test_dataloader_workers_leave_each_training_process_a_core(monkeypatch, cores, processes, workers):
    monkeypatch.setattr(recipe_arguments.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(recipe_arguments.os, "cpu_count", lambda: cores)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
    assert dataloader_workers_for_images() == workers


@pytest.mark.parametrize(
    ("recipe", "arguments", "message"),
    [
        (
            "train_scst",
            ["--objective", "wtf"],
            r"--objective wtf belongs to another recipe: use examples/train_wtf\.py",
        ),
        ("train_xe", ["--objective", "sle"], r"use examples/train_sle\.py"),
        (
            "train_scst",
            ["--sle_alpha", "0.75"],
            r"--sle_alpha is an option of --objective sle: use examples/train_sle",
        ),
        ("train_xe", ["--wtf_alpha=0.9"], r"--wtf_alpha is an option of --objective wtf: use examples/train_wtf\.py"),
        ("train_scst", ["--no_such_option", "1"], r"--no_such_option is not an option of this recipe"),
        ("train_xe", ["--reward_funcs", "cider"], r"--reward_funcs: teacher forcing .* would ignore them"),
        ("train_xe", ["--num_samples_per_image", "5", "--top_k", "3"], r"--num_samples_per_image, --top_k: teacher"),
    ],
)
def test_a_recipe_names_the_recipe_of_another_methods_options(tmp_path, recipe, arguments, message):
    with pytest.raises(ValueError, match=message):
        load_recipe(recipe).main(["--output_dir", str(tmp_path), *arguments])


def test_a_recipe_finds_its_default_checkpoints_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no checkpoints/ here
    scst = load_recipe("train_scst")
    script_args, _ = parse_recipe_arguments(
        scst.ScriptArguments, scst.RECIPE_DEFAULTS, ["--output_dir", "out"], [SCSTConfig]
    )
    assert script_args.model_name_or_path == str(EXAMPLES.parent / "checkpoints" / "show-tell-rl-shapes-xe")
    wtf = load_recipe("train_wtf")
    _, training_args = parse_recipe_arguments(
        wtf.ScriptArguments, wtf.RECIPE_DEFAULTS, ["--output_dir", "out", "--eval_clip", "org/clip"], [wtf.WTFConfig]
    )
    assert training_args.reward_clip == str(EXAMPLES.parent / "checkpoints" / "shapes-clip-reward")
    assert training_args.eval_clip == "org/clip"  # a given one is kept
    # a recipe copied out of the repository names the default it looked for, and where
    monkeypatch.setattr(
        "rlcaption.recipe_arguments._recipe_file", lambda _: str(tmp_path / "elsewhere" / "x" / "r.py")
    )
    with pytest.raises(
        FileNotFoundError, match="--model_name_or_path defaults to the project's checkpoints/show-tell"
    ):
        parse_recipe_arguments(scst.ScriptArguments, scst.RECIPE_DEFAULTS, ["--output_dir", "out"], [SCSTConfig])
