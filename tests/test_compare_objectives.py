"""benchmarks/compare_objectives.py: every RL arm gets the same policy updates, and a tiny run prints its table."""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
SCRIPT = REPOSITORY / "benchmarks" / "compare_objectives.py"


def load_script():
    if str(SCRIPT.parent) not in sys.path:  # it imports the reproductions' shared helpers beside it
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("compare_objectives", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_arm_gets_the_same_policy_updates():
    compare_objectives = load_script()
    args = argparse.Namespace(policy_steps=125, baseline_pretraining_steps=50, bcmr=True)
    arms = compare_objectives._arms(args)
    assert set(arms) == {"SCST", "spider_pg", "spider_pg, no pretraining", "SCST, BCMR", "spider_pg, BCMR"}
    for name, settings in arms.items():
        policy_updates = settings["max_steps"] - settings.get("baseline_pretraining_steps", 0)
        assert policy_updates == 125, name
        # every arm is trained at each of the learning rates, and keeps the one chosen on validation
        assert "learning_rate" not in settings, name
    assert arms["spider_pg"]["baseline_pretraining_steps"] == 50
    assert arms["spider_pg, BCMR"]["reward_funcs"] == ["bleu", "cider", "meteor", "rouge_l"]


def test_a_run_is_read_from_its_cache_folder_when_its_key_matches(tmp_path, monkeypatch):
    compare_objectives = load_script()
    args = argparse.Namespace(
        output_dir=str(tmp_path), data_seed=0, num_train=16, num_validation=4, num_test=8, image_size=48,
        xe_model="checkpoints/show-tell-rl-shapes-xe", metrics=["cider"], eval_clip="shapes-clip-evaluator",
        policy_steps=1, threads_per_job=1,
        versions={"code": "git:0123abc", "torch": "2.0", "transformers": "4.0"},
    )  # fmt: skip
    monkeypatch.setattr(compare_objectives, "_train", lambda *args, **kwargs: pytest.fail("a cached run was trained"))
    settings = compare_objectives._arms(argparse.Namespace(policy_steps=1, baseline_pretraining_steps=0, bcmr=False))
    options = ["--seed", "3", "--settings", json.dumps({"learning_rate": 5e-4, **settings["SCST"]}, sort_keys=True)]
    key = compare_objectives._key(args, "SCST", [*options, *compare_objectives._shared_options(args)])
    run_dir = tmp_path / "SCST-lr-0.0005-seed3"
    run_dir.mkdir()
    (run_dir / "run_key.json").write_text(json.dumps(key))
    scores = {"validation": {"CIDEr": 2.4}, "test": {"CIDEr": 2.5}}
    (run_dir / "eval_results.json").write_text(json.dumps(scores))
    assert compare_objectives._run_arm(args, "SCST", settings["SCST"], 3, 5e-4) == scores
    # a folder made with another learning rate is refused, not read
    (run_dir.parent / "SCST-lr-0.0002-seed3").mkdir()
    (run_dir.parent / "SCST-lr-0.0002-seed3" / "run_key.json").write_text(json.dumps(key))
    with pytest.raises(RuntimeError, match="made by another run.*--settings"):
        compare_objectives._run_arm(args, "SCST", settings["SCST"], 3, 2e-4)


def _scored(validation_cider: float, test_cider: float, test_recall: float) -> dict[str, dict[str, float]]:
    shared = {
        "object_f1": 0.9,
        "parse_failure_share": 0.0,
        "Self-BLEU": 0.8,
        "distinct_captions": 100,
        "train_seconds": 1,
    }
    return {
        "validation": {"CIDEr": validation_cider, "t2i_R@1": 0.5, **shared},
        "test": {"CIDEr": test_cider, "t2i_R@1": test_recall, **shared},
    }


def test_each_arm_is_read_on_test_at_the_learning_rate_of_its_best_validation_cider():
    compare_objectives = load_script()
    results = {
        "command": "python benchmarks/compare_objectives.py", "code": "git:abc", "seeds": [0, 1, 2],
        "settings": {
            "metrics": ["cider"], "policy_steps": 125, "baseline_pretraining_steps": 50, "num_validation": 200,
            "num_test": 500, "xe_model": "xe", "jobs": 2,
        },
        "minutes": 3.0,
        "warm_start": _scored(2.2, 2.2, 0.5),
        "runs": {
            # SCST is best on validation at 5e-4, spider_pg at 2e-4 (though better on test at 5e-4: not read)
            "SCST": {"0.0002": [_scored(2.40, 2.4, 0.6)] * 3, "0.0005": [_scored(2.45, 2.5, 0.6)] * 3},
            "spider_pg": {
                "0.0002": [_scored(2.44, 2.40, 0.55), _scored(2.44, 2.41, 0.56), _scored(2.44, 2.39, 0.54)],
                "0.0005": [_scored(2.30, 2.6, 0.7)] * 3,
            },
        },
    }  # fmt: skip
    assert compare_objectives.chosen_learning_rates(results) == {"SCST": "0.0005", "spider_pg": "0.0002"}
    assert [run["CIDEr"] for run in compare_objectives.test_runs(results)["spider_pg"]] == [2.40, 2.41, 2.39]
    block = compare_objectives.page_block(results)
    assert "| spider_pg (lr 0.0002) | 3 | 2.400 ± 0.010 |" in block and "| XE | 1 | 2.200 ± 0.000 |" in block
    assert "| SCST, lr 0.0002 | 3 | 2.400 ± 0.000 |" in block
    # a count of captions keeps one decimal, seconds none
    rows = [row for row in block.split("\n") if "lr 0.0002" in row]
    assert rows and all("| 100.0 ± 0.0 |" in row and row.endswith("| 1 ± 0 |") for row in rows)
    # spider_pg − SCST on test CIDEr-D: −0.10, −0.09, −0.11 by seed; SCST's direction is the paper's baseline
    assert "CIDEr-D: spider_pg − SCST = -0.100" in block and "CIDEr-D: spider_pg − XE = +0.200" in block
    # spider_pg against XE (CIDEr-D), against SCST (CIDEr-D, R@1); no BCMR or no-pretraining arm to judge
    assert block.count("paired interval") == 3


@pytest.mark.slow
def test_a_tiny_comparison_prints_and_saves_its_table(tmp_path):
    env = {
        **os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join([str(REPOSITORY / "src"), os.environ.get("PYTHONPATH", "")]),
    }  # fmt: skip
    output = tmp_path / "compare.json"
    card = tmp_path / "README.md"
    card.write_text("---\nlicense: mit\n---\n# A captioner\n\n## Evaluation\n\nScores.\n\n## Citation\n\nA paper.\n")
    command = [
        sys.executable, str(SCRIPT), "--xe-model", str(REPOSITORY / "checkpoints" / "show-tell-rl-shapes-xe"),
        "--num-train", "16", "--num-validation", "4", "--num-test", "8", "--seeds", "0", "1",
        "--policy-steps", "1", "--baseline-pretraining-steps", "1", "--metrics", "cider", "bleu",
        "--output-dir", str(tmp_path / "runs"), "--output", str(output), "--plot", str(tmp_path / "plot.png"),
        "--card", str(card),
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in result.stdout.splitlines() if line.startswith("| ")]
    test_rows = rows[rows.index("model", 1) :]
    assert [row.split(" (lr ")[0] for row in test_rows] == [
        "model",
        "XE",
        "SCST",
        "spider_pg",
        "spider_pg, no pretraining",
    ]
    report = json.loads(output.read_text())
    assert len(report["runs"]["SCST"]["0.0005"]) == 2 and len(report["runs"]["SCST"]["0.0002"]) == 2
    # the report names the code and libraries that made it, as each run's cache key does
    run_key = json.loads((tmp_path / "runs" / "SCST-lr-0.0005-seed1" / "run_key.json").read_text())
    assert report["code"] == run_key["code"] and report["code"].startswith(("git:", "rlcaption "))
    assert (report["torch"], report["transformers"]) == (run_key["torch"], run_key["transformers"])
    assert run_key["recipe"] == "compare_objectives.py: SCST" and run_key["options"][:2] == ["--seed", "1"]
    assert set(report["runs"]["SCST"]["0.0005"][0]["validation"]) >= {
        "CIDEr", "Bleu_4", "object_f1", "Self-BLEU", "distinct_captions", "t2i_R@1",
    }  # fmt: skip
    # the table and the picture go into the card, before its citation
    text = card.read_text()
    assert text.index("## Against SCST on shapes") < text.index("## Citation")
    assert "evaluator T2I R@1" in text and "![CIDEr-D against evaluator R@1](plot.png)" in text
    assert (tmp_path / "plot.png").is_file()
    # in the words of the one rule: spider_pg against XE (CIDEr-D), against SCST (CIDEr-D, the evaluator's R@1)
    # and against itself without baseline pretraining (CIDEr-D); no BCMR arm runs here
    verdicts = [line for line in result.stdout.splitlines() if line.startswith("- ")]
    assert [line.split(" = ")[0] for line in verdicts] == [
        "- CIDEr-D: spider_pg − XE",
        "- CIDEr-D: spider_pg − SCST",
        "- evaluator T2I R@1: spider_pg − SCST",
        "- CIDEr-D: spider_pg − spider_pg, no pretraining",
    ]
    for sentence in verdicts:
        assert "paired interval" in sentence
        assert sentence.endswith(("reproduced", "opposite", "not separated at 2 seeds"))
