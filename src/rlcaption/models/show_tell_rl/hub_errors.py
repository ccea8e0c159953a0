"""
What the Hub raises when it cannot be reached, and a `push_to_hub` that says so.

This module needs only `huggingface_hub` and sits in the captioner's folder, whose modeling file imports it relatively:
`save_pretrained` copies it beside that file for `trust_remote_code` loading, unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from huggingface_hub.errors import HTTPError, LocalTokenNotFoundError, OfflineModeIsEnabled

__all__ = ["HUB_CONNECTION_ERRORS", "HubUploadErrorsMixin"]


def _transport_errors() -> tuple[type[Exception], ...]:
    """The network errors (no route, DNS, timeout, proxy) of the HTTP client of `huggingface_hub`: `httpx2` from
    version 2, `httpx` in version 1; neither is an `HTTPError`."""
    return tuple(
        importlib.import_module(module).TransportError
        for module in ("httpx2", "httpx")
        if importlib.util.find_spec(module) is not None
    )


# What a Hub request raises when the Hub cannot be reached or refuses it (no network, offline mode, no token, HTTP
# errors); a failed upload leaves the local folder as it was.
HUB_CONNECTION_ERRORS = (HTTPError, OfflineModeIsEnabled, LocalTokenNotFoundError, *_transport_errors())


class HubUploadErrorsMixin:
    """`push_to_hub` of a `PreTrainedModel` whose failure to reach the Hub is a `RuntimeError` saying what to do."""

    def push_to_hub(self, repo_id: str, *args: Any, **kwargs: Any) -> Any:
        """`PushToHubMixin.push_to_hub`.

        Raises:
            `RuntimeError`: the Hub could not be reached or refused the upload (no network, `HF_HUB_OFFLINE=1`, not
                logged in); the message names the repo and how to publish later.
        """
        try:
            return super().push_to_hub(repo_id, *args, **kwargs)
        except HUB_CONNECTION_ERRORS as error:
            raise RuntimeError(
                f"Could not push the {type(self).__name__} to the Hub repo {repo_id}: {type(error).__name__}: "
                f"{error}. Nothing was uploaded. Save it with `save_pretrained(folder)` and publish the folder "
                f"where the Hub can be reached, with `hf upload {repo_id} <folder>` (after `hf auth login`) or "
                "`rlcaption.hub.publish_folder`."
            ) from error
