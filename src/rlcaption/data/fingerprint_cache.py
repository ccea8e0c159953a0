"""Results computed once per dataset and remembered by its fingerprint (`datasets.Dataset._fingerprint`), in small
files under the `datasets` cache, so that a second launch on the same data reads them instead of computing them again.

The `datasets` cache (`datasets.config.HF_DATASETS_CACHE`, moved by `HF_DATASETS_CACHE` or `HF_HOME`) is where users
expect what is derived from a dataset by its fingerprint: `datasets` keeps its `map` results there. It is shared by
every run on the data, whereas a run's `--output_dir` is not: the XE, SCST and SPIDEr recipes on the same dataset each
have their own, and would each compute the result again. A dataset's own folder may be read-only (a shared copy of
COCO). `datasets.disable_caching()` turns the remembering off, as it does for `map`; deleting a folder
`rlcaption_<kind>` of the cache forgets the results of that kind.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import datasets

__all__ = ["fingerprint_cache_file", "read_json_file", "write_json_atomically"]


def fingerprint_cache_file(dataset: Any, kind: str, suffix: str) -> Path | None:
    """Where a result of `kind` computed from `dataset` is remembered:
    `<HF_DATASETS_CACHE>/rlcaption_<kind>/<fingerprint><suffix>` (the folder is created).

    Args:
        dataset (`datasets.Dataset`): the dataset the result is computed from.
        kind (`str`): what the result is, e.g. `"image_checks"`; names the folder.
        suffix (`str`): the file's suffix, e.g. `".json"`.

    Returns:
        `Path`, or `None` when the result is not to be remembered: caching is disabled (`datasets.disable_caching()`)
        or `dataset` has no fingerprint (it is not a `datasets.Dataset`).
    """
    fingerprint = getattr(dataset, "_fingerprint", None)
    if not fingerprint or not datasets.is_caching_enabled():
        return None
    folder = Path(datasets.config.HF_DATASETS_CACHE) / f"rlcaption_{kind}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{fingerprint}{suffix}"


def read_json_file(path: Path) -> Any | None:
    """The JSON content of `path`, or `None` when it is missing or unreadable (then the result is computed again)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def write_json_atomically(path: Path, content: Any) -> None:
    """Writes `content` as JSON next to `path`, then renames it: a reader (another process of a distributed launch,
    or a later launch after a crash) never sees a truncated file."""
    handle, temporary_path = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(content, file)
        os.replace(temporary_path, path)
    except BaseException:
        Path(temporary_path).unlink(missing_ok=True)
        raise
