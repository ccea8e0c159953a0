"""benchmarks/gpu_check.py in its CPU form: a recipe in both precisions, the step budget and the throughput curve."""

import json
import re
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.slow  # every part of the check, a minute on 2 cores
def test_gpu_check_runs_on_the_cpu_and_reports_every_part(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_check

    output, profile = tmp_path / "gpu_check.json", tmp_path / "profile.txt"
    arguments = ["--device", "cpu", "--recipes", "train_scst.py", "--warmup", "0", "--repeats", "1"]
    status = gpu_check.main([*arguments, "--output", str(output), "--profile", str(profile)])
    assert status == 0
    results = json.loads(output.read_text())
    assert [(run["recipe"], run["precision"], run["ok"]) for run in results["recipes"]] == [
        ("train_scst.py", "fp32", True),
        ("train_scst.py", "bf16", True),
    ]
    models = [(row["model"], row["images"], row["precision"]) for row in results["budget"]]
    assert models == [
        ("ShowTellRL (XE warm start)", 2, "fp32"),
        ("ShowTellRL (XE warm start)", 4, "fp32"),
        ("BLIP-tiny-size (random weights)", 2, "bf16"),
    ]
    for row in results["budget"]:
        for objective in ("xe", "scst", "spider_pg") if row["model"].startswith("ShowTellRL") else ("xe", "scst"):
            timing = row[objective]
            assert timing["ms"] > 0
            assert 0.0 <= timing["reward_share"] <= 1.0 and 0.0 <= timing["sampling_share"] <= 1.0
        assert row["scst"]["sampling_share"] > 0  # SCST samples and decodes its greedy baseline
        assert row["xe"]["sampling_share"] == 0 and row["xe"]["reward_share"] == 0  # teacher forcing does neither
    assert [row["images"] for row in results["curve"]] == [2, 4]
    printed = capsys.readouterr().out
    assert "| train_scst.py | bf16 | ok |" in printed and "of linear scaling" in printed
    # the profiles of ShowTellRL's XE and SCST steps and of BLIP's SCST step: operators by host time, the host's waits
    sections = re.split(r"^# ", profile.read_text(), flags=re.MULTILINE)[1:]
    titles = [section.split(",")[0] for section in sections]
    assert titles == ["ShowTellRL XE step", "ShowTellRL SCST step", "BLIP SCST step"]
    assert all("host waits and copies" in section and "aten::" in section for section in sections)


def test_a_failed_recipe_is_reported_with_its_error(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_check

    monkeypatch.setitem(gpu_check.RECIPES, "train_scst.py", ["--learning_rate", "not-a-number"])
    run = gpu_check.run_recipe("train_scst.py", "fp32", "cpu", tmp_path)
    assert not run["ok"] and "learning_rate" in run["error"]
