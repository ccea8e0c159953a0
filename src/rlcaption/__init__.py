"""rlcaption: reinforcement learning for image captioning with Hugging Face models."""

import importlib
import sys
from pathlib import Path


def _started_by_the_console_command() -> bool:
    """
    Whether this import is the start of the `rlcaption` command (or `python -m rlcaption`). The command's parser
    imports nothing heavy, so that `--help` and argument errors answer at once, and each subcommand imports what it
    runs; everyone else gets the whole API, and the Auto classes registered, from `import rlcaption`.
    """
    if sys.argv and Path(sys.argv[0]).name in ("rlcaption", "rlcaption.exe"):
        return True
    # while `python -m` looks for its module, sys.argv[0] is "-m"; the interpreter's own arguments name the module
    arguments = getattr(sys, "orig_argv", [])
    return sys.argv[:1] == ["-m"] and "-m" in arguments and arguments[arguments.index("-m") + 1 :][:1] == ["rlcaption"]


__version__ = "0.1.0.dev0"

if not _started_by_the_console_command():
    from .api import *  # noqa: F403
    from .api import __all__ as __all__


def __getattr__(name: str):
    # reached only for a name not imported yet: in the console command, whose subcommands import the API on first use.
    # import_module, not `from . import api`, which would ask this function for `api` again; while the API is being
    # imported it has no `__all__` yet, and its own `from . import <submodule>` must fall through to the import system
    api = importlib.import_module(f"{__name__}.api")
    if name in getattr(api, "__all__", ()):
        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
