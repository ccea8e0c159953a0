"""Publishing a saved model folder (weights, config, processor, generation config, card) to the Hub as one commit."""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import create_repo, upload_folder

from ..models.show_tell_rl.hub_errors import HUB_CONNECTION_ERRORS

__all__ = ["publish_folder"]


def publish_folder(
    folder: str | os.PathLike,
    repo_id: str,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "Upload rlcaption model",
) -> str:
    """
    Uploads a saved model folder (created with `save_pretrained` + the processor + `README.md`) to the Hub as one
    commit, skipping training checkpoints and logs. Returns the commit URL.

    Raises:
        `FileNotFoundError`: `folder` holds no saved model.
        `RuntimeError`: the Hub could not be reached or refused the upload; the message says that the folder is
            intact and how to publish it later.
    """
    if not (Path(folder) / "config.json").is_file():
        raise FileNotFoundError(
            f"{folder} has no config.json: save the model there with `save_pretrained` before publishing it."
        )
    try:
        create_repo(repo_id, token=token, private=private, exist_ok=True)
        commit = upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            token=token,
            commit_message=commit_message,
            ignore_patterns=["checkpoint-*", "runs/*", "*.pt", "*.pth", "training_args.bin"],
        )
    except HUB_CONNECTION_ERRORS as error:
        raise RuntimeError(
            f"Could not publish {folder} to the Hub repo {repo_id}: {error}. The saved model in {folder} is intact; "
            f"publish it later with `hf upload {repo_id} {folder}` (after `hf auth login`) or "
            "`rlcaption.hub.publish_folder`."
        ) from error
    return str(commit)
