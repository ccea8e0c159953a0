import pytest

from rlcaption.trainer import RLCaptionConfig, last_complete_checkpoint


def make_config(tmp_path, **overrides):
    return RLCaptionConfig(output_dir=str(tmp_path), use_cpu=True, **overrides)


def test_defaults_keep_dataset_columns_and_run_offline(tmp_path):
    config = make_config(tmp_path)
    assert config.remove_unused_columns is False
    assert config.report_to in ([], "none", ["none"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"baseline": "median"}, "baseline='median'"),
        ({"loss_normalization": "word"}, "loss_normalization='word'"),
        ({"num_samples_per_image": 0}, "num_samples_per_image"),
        ({"baseline": "mean_of_others", "num_samples_per_image": 1}, "mean_of_others"),
        ({"reward_funcs": []}, "reward_funcs is empty"),
        ({"temperature": 0.0}, "temperature"),
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
