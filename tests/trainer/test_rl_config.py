import dataclasses
import re

import pytest

from rlcaption.objectives import (
    ActorCriticConfig,
    PSSTConfig,
    SCSTConfig,
    SLEConfig,
    SpiderPGConfig,
    WTFConfig,
    get_objective_class,
)
from rlcaption.trainer import RLCaptionConfig, last_complete_checkpoint

# the config of every built-in objective (xe takes the shared fields alone)
CONFIG_CLASSES = {
    "xe": RLCaptionConfig,
    "scst": SCSTConfig,
    "sle": SLEConfig,
    "spider_pg": SpiderPGConfig,
    "wtf": WTFConfig,
    "psst": PSSTConfig,
    "actor_critic": ActorCriticConfig,
}
# what some objectives read and the others do not: on the configs of those that read it only
OPTIONS_OF_SOME_METHODS = {
    "baseline": {SCSTConfig, PSSTConfig},  # PSST's naturalness term is SCST's loss, without its entropy bonus
    "entropy_bonus_weight": {SCSTConfig},
}


def make_config(tmp_path, **overrides):
    return RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, **overrides)


def test_defaults_keep_dataset_columns_and_run_offline(tmp_path):
    config = make_config(tmp_path)
    assert config.remove_unused_columns is False
    assert config.report_to in ([], "none", ["none"])


def test_batches_reach_the_gpu_without_blocking_unless_the_accelerator_config_says_otherwise(tmp_path, monkeypatch):
    # a blocking copy to the GPU waits for the previous step's work; pinned batches copy without it
    monkeypatch.setattr("rlcaption.rl_config._batches_go_to_a_gpu", lambda use_cpu: not use_cpu)
    config = RLCaptionConfig(output_dir=str(tmp_path))  # not use_cpu, which turns pinned memory off
    assert config.accelerator_config.non_blocking is True and config.dataloader_pin_memory is True
    assert make_config(tmp_path, accelerator_config={"split_batches": False}).accelerator_config.non_blocking is False


def test_without_a_gpu_batches_are_neither_pinned_nor_copied_without_blocking(tmp_path, monkeypatch):
    # pinned memory needs an accelerator, and non_blocking without it draws a warning from the Trainer at every run
    monkeypatch.setattr("rlcaption.rl_config._batches_go_to_a_gpu", lambda use_cpu: False)
    config = RLCaptionConfig(output_dir=str(tmp_path))
    assert config.accelerator_config.non_blocking is False and config.dataloader_pin_memory is False


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"loss_normalization": "word"}, "loss_normalization='word'"),
        ({"num_samples_per_image": 0}, "num_samples_per_image"),
        ({"reward_funcs": []}, "reward_funcs is empty"),
        ({"temperature": 0.0}, "temperature"),
        ({"reward_processes": -1}, "reward_processes must be >= 0"),
    ],
)
def test_invalid_settings_are_rejected_with_the_bad_value(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_config(tmp_path, **overrides)


@pytest.mark.parametrize("objective", ["scst", "psst"])
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"baseline": "median"}, "baseline='median' is not one of"),
        ({"baseline": "mean_of_others", "num_samples_per_image": 1}, "mean_of_others' needs num_samples_per_image"),
    ],
)
def test_the_self_critical_baseline_is_validated_where_it_is_read(tmp_path, objective, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_config(tmp_path, objective=objective, **overrides)


# ------------------------------------------------------------------ one config per method


@pytest.mark.parametrize("objective", list(CONFIG_CLASSES))
def test_an_objective_s_config_holds_the_shared_fields_and_its_own_only(objective):
    # each method's options are its own: a config that extended another method's would take options it never reads
    config_class = CONFIG_CLASSES[objective]
    assert get_objective_class(objective).config_class is config_class
    assert config_class is RLCaptionConfig or config_class.__bases__ == (RLCaptionConfig,)


@pytest.mark.parametrize("objective", list(CONFIG_CLASSES))
def test_the_config_of_an_objective_is_built_by_naming_the_objective(tmp_path, objective):
    fields = {"reward_clip": "checkpoints/shapes-clip-reward"} if objective == "wtf" else {}
    config = make_config(tmp_path, objective=objective, **fields)
    assert type(config) is CONFIG_CLASSES[objective] and config.objective == objective


@pytest.mark.parametrize("option", list(OPTIONS_OF_SOME_METHODS))
def test_an_option_is_on_the_configs_of_the_methods_that_read_it_only(option):
    for config_class in CONFIG_CLASSES.values():
        has_it = option in {field.name for field in dataclasses.fields(config_class)}
        assert has_it == (config_class in OPTIONS_OF_SOME_METHODS[option]), (option, config_class.__name__)


@pytest.mark.parametrize(
    ("objective", "option", "owners"),
    [
        ("wtf", "baseline", "PSSTConfig (objective='psst') and SCSTConfig (objective='scst')"),
        ("spider_pg", "baseline", "PSSTConfig (objective='psst') and SCSTConfig (objective='scst')"),
        ("actor_critic", "baseline", "PSSTConfig (objective='psst') and SCSTConfig (objective='scst')"),
        ("sle", "entropy_bonus_weight", "SCSTConfig (objective='scst')"),
        ("psst", "entropy_bonus_weight", "SCSTConfig (objective='scst')"),
        ("xe", "sle_alpha", "SLEConfig (objective='sle')"),
    ],
)
def test_an_option_of_another_method_is_refused_naming_the_class_that_has_it(tmp_path, objective, option, owners):
    message = f"{CONFIG_CLASSES[objective].__name__} has no option '{option}'; it is an option of {owners}."
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        make_config(tmp_path, objective=objective, **{option: 1})


def test_an_unknown_option_is_refused_without_a_class():
    with pytest.raises(TypeError, match=r"^SCSTConfig has no option 'baselin'\.$"):
        RLCaptionConfig(output_dir="x", objective="scst", baselin="greedy")


@pytest.mark.parametrize(
    ("config_class", "objective", "message"),
    [
        (SLEConfig, "scst", "objective='scst' takes its options from SCSTConfig, not SLEConfig"),
        (SCSTConfig, "psst", "objective='psst' takes its options from PSSTConfig, not SCSTConfig"),
        (SpiderPGConfig, "xe", "objective='xe' takes its options from RLCaptionConfig, not SpiderPGConfig"),
    ],
)
def test_a_method_s_config_never_configures_another_objective(tmp_path, config_class, objective, message):
    with pytest.raises(ValueError, match=f"{message}: build it as RLCaptionConfig\\(objective='{objective}'"):
        config_class(output_dir=str(tmp_path), use_cpu=True, objective=objective)


def test_a_subclass_of_a_method_s_config_configures_that_method(tmp_path):
    @dataclasses.dataclass
    class MySCSTConfig(SCSTConfig):
        note: str = "mine"

    config = MySCSTConfig(output_dir=str(tmp_path), use_cpu=True, baseline="mean_of_others")
    assert (config.objective, config.baseline, config.note) == ("scst", "mean_of_others", "mine")


def test_last_complete_checkpoint_skips_half_written_folders(tmp_path):
    for step, complete in [(10, True), (20, True), (30, False)]:
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"")
        if complete:
            (folder / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-bad").mkdir()
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-20")
    assert last_complete_checkpoint(str(tmp_path / "missing")) is None


@pytest.mark.parametrize(
    ("eval_metrics", "bad_name"),
    [(["cider", "cidr"], "cidr"), (["Bleu", "div2"], "div2"), (["self-bleu"], "self-bleu")],
)
def test_unknown_eval_metrics_are_rejected_listing_the_valid_names(tmp_path, eval_metrics, bad_name):
    with pytest.raises(ValueError, match=rf"eval_metrics.*'{bad_name}'.*rouge_l.*div_2.*self_bleu"):
        make_config(tmp_path, eval_metrics=eval_metrics)


def test_caption_and_diversity_metrics_are_valid_eval_metrics(tmp_path):
    names = ["bleu", "rouge_l", "CIDEr", "spider", "div_1", "div_2", "mbleu_4", "self_bleu", "distinct_captions"]
    assert make_config(tmp_path, eval_metrics=names, eval_num_beams=2).eval_metrics == names


@pytest.mark.parametrize("name", ["div_1", "div_2", "mbleu_4"])
def test_set_diversity_metrics_need_several_beams(tmp_path, name):
    with pytest.raises(ValueError, match=rf"{name}.*eval_num_beams >= 2.*eval_num_beams=1"):
        make_config(tmp_path, eval_metrics=[name], eval_num_beams=1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"fsdp": "full_shard"}, r"fsdp='full_shard'.*not supported.*FSDP1.*examples/accelerate/fsdp.yaml"),
        ({"fsdp": True}, r"fsdp=True.*not supported.*FSDP1.*examples/accelerate/fsdp.yaml"),
        ({"deepspeed": {"zero_optimization": {"stage": 3}}}, r"deepspeed=.*not supported.*DDP"),
    ],
)
def test_the_trainer_arguments_own_sharding_is_refused_naming_the_setting(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_config(tmp_path, **overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_completions_to_print": 0}, "num_completions_to_print"),
        ({"eval_clip": ""}, "eval_clip"),
        ({"eval_num_beams": 0}, "eval_num_beams"),
    ],
)
def test_evaluation_and_logging_settings_are_validated(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_config(tmp_path, **overrides)


def test_completion_logging_and_evaluator_clip_defaults(tmp_path):
    config = make_config(tmp_path)
    assert config.log_completions is True and config.num_completions_to_print == 3
    assert config.eval_clip is None
