import importlib.metadata
import subprocess
import sys
from pathlib import Path

from rlcaption.hub.provenance import code_version, run_command, training_run


def _git(repository: Path, *arguments: str) -> str:
    return subprocess.run(["git", *arguments], cwd=repository, capture_output=True, text=True, check=True).stdout


def test_the_code_version_names_the_commit_and_hashes_the_uncommitted_changes(tmp_path):
    repository = tmp_path / "repository"
    repository.mkdir()
    _git(repository, "init", "-q")
    (repository / "train.py").write_text("learning_rate = 1e-4\n")
    _git(repository, "add", "train.py")
    _git(repository, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "first")
    commit = _git(repository, "rev-parse", "HEAD").strip()
    assert code_version(repository) == f"git:{commit}"

    (repository / "train.py").write_text("learning_rate = 2e-4\n")
    one_change = code_version(repository)
    (repository / "train.py").write_text("learning_rate = 3e-4\n")
    other_change = code_version(repository)
    # two uncommitted states of the same commit are two versions, each stable while the tree stays as it is
    assert one_change.startswith(f"git:{commit}+diff:") and other_change.startswith(f"git:{commit}+diff:")
    assert one_change != other_change and other_change == code_version(repository)
    (repository / "notes.txt").write_text("untracked files are not code the runs import\n")
    assert code_version(repository) == other_change


def test_outside_a_repository_the_code_version_is_the_package_version(tmp_path):
    outside = tmp_path / "not-a-repository"
    outside.mkdir()
    assert code_version(outside) == f"rlcaption {importlib.metadata.version('rlcaption')}"


def test_the_run_names_the_script_from_the_current_folder_with_its_arguments_quoted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "examples" / "train_xe.py"), "--output_dir", "runs/my run"])
    assert run_command() == "python examples/train_xe.py --output_dir 'runs/my run'"
    assert training_run() == f"`python examples/train_xe.py --output_dir 'runs/my run'` at {code_version()}"
