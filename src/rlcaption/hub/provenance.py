"""
What made a run, as a model card and the reproduction benchmarks' cache record it: the command line and the version of
the code.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shlex
import subprocess
import sys
from pathlib import Path

__all__ = ["code_version", "run_command", "training_run"]


def code_version(folder: str | os.PathLike | None = None) -> str:
    """
    The code a run is made by: `git:<commit>` of the git repository holding `folder` (default: the running script's
    folder), followed by `+diff:<hash>` (the first 16 hex digits of the SHA-256 of `git diff HEAD`) when tracked files
    have uncommitted changes, so that two different uncommitted states never pass for one; outside a repository,
    `rlcaption <version>` of the installed package.
    """
    folder = Path(folder if folder is not None else Path(sys.argv[0]).resolve().parent)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, check=True
        ).stdout.strip()
        changes = subprocess.run(
            ["git", "diff", "HEAD", "--binary"], cwd=folder, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"rlcaption {importlib.metadata.version('rlcaption')}"
    return f"git:{commit}" + (f"+diff:{hashlib.sha256(changes).hexdigest()[:16]}" if changes else "")


def run_command() -> str:
    """The command line of the running script, `python <script> <arguments>`, the script relative to the current
    folder where it lies within it."""
    script = Path(sys.argv[0])
    if script.is_absolute() and script.is_relative_to(Path.cwd()):
        script = script.relative_to(Path.cwd())
    return shlex.join(["python", str(script), *sys.argv[1:]])


def training_run() -> str:
    """A model card's "run" row: the command that trained the model and the code version it ran."""
    return f"`{run_command()}` at {code_version()}"
