"""
Reaching the Hub: [`check_pretrained_reference`] tells, in seconds and before anything is loaded, whether a model name
is a local folder, a Hub id that can be loaded now, or a mistake.
"""

from __future__ import annotations

import os
import threading

from huggingface_hub import constants
from huggingface_hub import try_to_load_from_cache as _try_to_load_from_cache
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import get_session, validate_repo_id

from ..models.show_tell_rl.hub_errors import HUB_CONNECTION_ERRORS

__all__ = [
    "HUB_CONNECTION_ERRORS",
    "HUB_PROBE_TIMEOUT",
    "check_pretrained_reference",
    "hub_unreachable_reason",
    "model_loading_kwargs",
]

# Seconds the Hub has to answer one request before a Hub id that is not in the local cache is refused; the Hub
# usually answers in well under a second, whereas `huggingface_hub` retries an unreachable Hub for about 23 seconds
# per file.
HUB_PROBE_TIMEOUT = 5.0


def hub_unreachable_reason(timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """
    Why the Hub (`huggingface_hub.constants.ENDPOINT`) cannot be reached now, or `None` when it answers: offline mode
    (`HF_HUB_OFFLINE=1`), or one request, without retries, that fails or gets no answer within `timeout` seconds.
    """
    if constants.is_offline_mode():
        return "offline mode is on (HF_HUB_OFFLINE=1)"
    outcome: dict[str, Exception] = {}

    def request_the_hub() -> None:
        try:
            get_session().head(constants.ENDPOINT, timeout=timeout)
        except Exception as error:  # handed to the calling thread, which decides
            outcome["error"] = error

    # in a thread of its own: a name lookup without a DNS server can hang longer than any HTTP timeout
    request = threading.Thread(target=request_the_hub, daemon=True)
    request.start()
    request.join(timeout + 1)
    if request.is_alive():
        return f"no answer from {constants.ENDPOINT} within {timeout:g} s"
    error = outcome.get("error")
    if error is None:
        return None
    if isinstance(error, HUB_CONNECTION_ERRORS):
        return f"{type(error).__name__}: {error}"
    raise error


def check_pretrained_reference(
    name_or_path: str | os.PathLike,
    option: str = "--model_name_or_path",
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
) -> bool:
    """
    Checks in seconds, before anything is loaded, that `from_pretrained` can load `name_or_path`, and says whether it
    must read local files only. Without this, a mistyped path is tried as a Hub id, and `huggingface_hub` retries
    every file for about 23 seconds before an error that does not name the typo.

    - A local folder is accepted.
    - A name meant as a local path is refused at once when it is not a folder: it starts with `.`, `/` or `~`, has
      more than one separator, is a file, or its first part is a local folder (`runs/xee` when `runs/` exists).
    - A name that is not `org/name`-shaped (`show-tell-xe`) is no Hub id: it is refused unless the Hub cache has it.
    - A Hub id `org/name` is accepted when the Hub answers ([`hub_unreachable_reason`]); when it is offline, does
      not answer or is not to be asked (`local_files_only`), only when the local Hub cache has it.

    Args:
        name_or_path: what the user gave.
        option: how the user gave it, for the error message (`--model_name_or_path`, `--model`, ...).
        revision, cache_dir, local_files_only: as passed to `from_pretrained`.

    Returns:
        `True` when `from_pretrained` must be given `local_files_only=True`: a cached Hub id while the Hub cannot be
        used.

    Raises:
        `FileNotFoundError`: naming `option`, the value, where it was looked for and how to fix it.
    """
    name = os.fspath(name_or_path)
    if os.path.isdir(name):
        return False
    parts = name.replace(os.sep, "/").split("/")
    cache = os.fspath(cache_dir or constants.HF_HUB_CACHE)
    offline_switch = f"without a network, HF_HUB_OFFLINE=1 loads Hub ids from the local Hub cache ({cache}) only"
    looks_local = (
        name.startswith((".", "/", "~"))
        or len(parts) > 2
        or os.path.isfile(name)
        or (len(parts) == 2 and os.path.isdir(parts[0]))
    )
    if looks_local or not _is_hub_id(name):
        raise FileNotFoundError(
            f"{option} {name}: no such folder (looked for {os.path.abspath(os.path.expanduser(name))}). Give a folder "
            f"written by `save_pretrained` (a model with its config and processor) or a Hub id such as `org/name`; "
            f"{offline_switch}."
        )
    is_cached = isinstance(_try_to_load_from_cache(name, "config.json", cache_dir=cache_dir, revision=revision), str)
    if len(parts) == 1 and not is_cached:
        raise FileNotFoundError(
            f"{option} {name}: no such folder (looked for {os.path.abspath(name)}), nor a Hub id (those are "
            f"`org/name`, e.g. `openai/clip-vit-base-patch32`) in the local Hub cache ({cache}). Give a folder "
            f"written by `save_pretrained` or the full Hub id; {offline_switch}."
        )
    reason = "local_files_only=True" if local_files_only else hub_unreachable_reason()
    if reason is None:
        return False
    if is_cached:
        return True
    if local_files_only:
        fix = "or load it without local_files_only=True to download it"
    elif constants.is_offline_mode():
        fix = "or unset HF_HUB_OFFLINE to download it"
    else:
        fix = f"or download it where the Hub can be reached (`hf download {name}`); {offline_switch}"
    raise FileNotFoundError(
        f"{option} {name}: not a local folder (looked for {os.path.abspath(name)}) nor in the local Hub cache "
        f"({cache}), and the Hub cannot be used ({reason}). Check the path, give a folder written by "
        f"`save_pretrained`, {fix}."
    )


def _is_hub_id(name: str) -> bool:
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def model_loading_kwargs(kwargs: dict) -> dict:
    """
    The `from_pretrained` keyword arguments of a model for the loading `kwargs` of its folder or Hub id. With
    `local_files_only=True`, the look-up of a PEFT adapter that transformers makes for a Hub id (when peft is
    installed) gets it and the `cache_dir` too: transformers passes neither there, and that request would retry the
    unreachable Hub for about 23 seconds.
    """
    if not kwargs.get("local_files_only"):
        return kwargs
    adapter_lookup = {"local_files_only": True, **{key: kwargs[key] for key in ("cache_dir",) if key in kwargs}}
    return {**kwargs, "adapter_kwargs": {**adapter_lookup, **kwargs.get("adapter_kwargs", {})}}
