"""benchmarks/reproduction.py reuses a run's results only when the same recipe, options, code and libraries made
them."""

import importlib.metadata
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
OPTIONS = ["--seed", "0", "--psst_lambda", "0.05", "--modes", "st", "psst"]
LIBRARIES = {
    "torch": importlib.metadata.version("torch"),
    "transformers": importlib.metadata.version("transformers"),
}


@pytest.fixture
def reproduction(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import reproduction

    # no recipe may start: every test reads a fake run folder
    def no_training(*args, **kwargs):
        raise AssertionError(f"a recipe was launched: {args}")

    monkeypatch.setattr(reproduction.subprocess, "run", no_training)
    monkeypatch.setattr(reproduction, "code_version", lambda: "git:0123abc")
    return reproduction


def fake_run(run_dir: Path, key: dict | None, scores: dict) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "eval_results.json").write_text(json.dumps({"test": scores}))
    if key is not None:
        (run_dir / "run_key.json").write_text(json.dumps(key))
    return run_dir


def test_a_run_made_by_the_same_recipe_options_and_code_is_read_not_trained(reproduction, tmp_path):
    key = {"recipe": "train_psst.py", "options": OPTIONS, "code": "git:0123abc", **LIBRARIES}
    run_dir = fake_run(tmp_path / "run", key, {"CIDEr": 2.5})
    assert reproduction.run_recipe_once("train_psst.py", run_dir, OPTIONS) == {"test": {"CIDEr": 2.5}}


@pytest.mark.parametrize(
    "cached, named",
    [
        (
            {"options": ["--seed", "0", "--psst_lambda", "0.2", "--modes", "st", "psst"]},
            "option --psst_lambda: 0.2 → 0.05",
        ),
        ({"options": ["--seed", "0", "--psst_lambda", "0.05", "--modes", "st"]}, "option --modes: st → st psst"),
        ({"options": ["--psst_lambda", "0.05", "--modes", "st", "psst"]}, "option --seed: (absent) → 0"),
        ({"code": "git:fedcba9"}, "code: 'git:fedcba9' → 'git:0123abc'"),
        ({"recipe": "train_scst.py"}, "recipe: 'train_scst.py' → 'train_psst.py'"),
        ({"torch": "1.0.0"}, f"torch: '1.0.0' → '{LIBRARIES['torch']}'"),
        ({"transformers": None}, f"transformers: None → '{LIBRARIES['transformers']}'"),  # a key from before
    ],
)
def test_a_run_made_otherwise_is_refused_with_the_fields_that_differ(reproduction, tmp_path, cached, named):
    key = {"recipe": "train_psst.py", "options": OPTIONS, "code": "git:0123abc", **LIBRARIES, **cached}
    run_dir = fake_run(tmp_path / "run", key, {"CIDEr": 2.5})
    with pytest.raises(RuntimeError, match="made by another run") as refused:
        reproduction.run_recipe_once("train_psst.py", run_dir, OPTIONS)
    assert named in str(refused.value)
    assert str(run_dir) in str(refused.value)


def test_results_without_a_key_are_refused(reproduction, tmp_path):
    run_dir = fake_run(tmp_path / "run", None, {"CIDEr": 2.5})
    with pytest.raises(RuntimeError, match="no run_key.json"):
        reproduction.run_recipe_once("train_psst.py", run_dir, OPTIONS)


def test_a_new_run_records_its_key_before_it_starts(reproduction, tmp_path, monkeypatch):
    def recipe(command, **kwargs):  # stands in for the recipe: writes the results a finished run leaves
        (tmp_path / "run" / "eval_results.json").write_text(json.dumps({"test": {"CIDEr": 1.0}}))
        return type("Completed", (), {"returncode": 0})()

    monkeypatch.setattr(reproduction.subprocess, "run", recipe)
    assert reproduction.run_recipe_once("train_psst.py", tmp_path / "run", OPTIONS) == {"test": {"CIDEr": 1.0}}
    key = json.loads((tmp_path / "run" / "run_key.json").read_text())
    assert key == {"recipe": "train_psst.py", "options": OPTIONS, "code": "git:0123abc", **LIBRARIES}


def test_a_result_made_in_the_process_is_cached_with_its_key(reproduction, tmp_path):
    key = reproduction.run_key("compare_objectives.py: SCST", ["--seed", "1"])
    made = []
    first = reproduction.run_once(tmp_path / "run", key, lambda: made.append(1) or {"test": {"CIDEr": 2.0}})
    again = reproduction.run_once(tmp_path / "run", key, lambda: made.append(1) or {"test": {"CIDEr": 0.0}})
    assert first == again == {"test": {"CIDEr": 2.0}} and made == [1]
    with pytest.raises(RuntimeError, match="option --seed: 1 → 2"):
        reproduction.run_once(
            tmp_path / "run", reproduction.run_key("compare_objectives.py: SCST", ["--seed", "2"]), dict
        )
