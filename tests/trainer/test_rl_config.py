import pytest

from rlcaption.trainer import RLCaptionConfig, last_complete_checkpoint


def make_config(tmp_path, **overrides):
    return RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, **overrides)


def test_defaults_keep_dataset_columns_and_run_offline(tmp_path):
    config = make_config(tmp_path)
    assert config.remove_unused_columns is False
    assert config.report_to in ([], "none", ["none"])


def test_batches_reach_the_gpu_without_blocking_unless_the_accelerator_config_says_otherwise(tmp_path):
    # a blocking copy to the GPU waits for the previous step's work; pinned batches copy without it
    config = RLCaptionConfig(output_dir=str(tmp_path))  # not use_cpu, which turns pinned memory off
    assert config.accelerator_config.non_blocking is True and config.dataloader_pin_memory is True
    assert make_config(tmp_path, accelerator_config={"split_batches": False}).accelerator_config.non_blocking is False


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"baseline": "median"}, "baseline='median'"),
        ({"loss_normalization": "word"}, "loss_normalization='word'"),
        ({"num_samples_per_image": 0}, "num_samples_per_image"),
        ({"baseline": "mean_of_others", "num_samples_per_image": 1}, "mean_of_others"),
        ({"reward_funcs": []}, "reward_funcs is empty"),
        ({"temperature": 0.0}, "temperature"),
        ({"reward_processes": -1}, "reward_processes must be >= 0"),
    ],
)
def test_invalid_settings_are_rejected_with_the_bad_value(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_config(tmp_path, **overrides)


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
