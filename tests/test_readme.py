"""The README's snippets run as written."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def _python_block_after(heading: str) -> str:
    readme = (REPOSITORY / "README.md").read_text()
    section = readme[readme.index(f"## {heading}\n") :]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_published_checkpoint_snippet_captions_an_image_and_leaves_it_for_the_command_line(tmp_path):
    # run where a user of a clone runs it, its root, with the repository's checkpoints and nothing else
    (tmp_path / "checkpoints").symlink_to(REPOSITORY / "checkpoints")
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _python_block_after("Use a published checkpoint")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (caption,) = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert any(shape in caption for shape in ("circle", "square", "triangle", "star", "diamond", "hexagon")), caption
    assert (tmp_path / "scene.png").is_file()  # what the shell example after it captions
