"""Locating the Java runtime and the jars of the COCO caption toolkit.

METEOR 1.5, SPICE and the PTB tokenizer of the COCO caption evaluation code are Java programs shipped inside the
`pycocoevalcap` package. This module finds a `java` executable (``$JAVA_HOME/bin/java`` first, then ``PATH``), reads
its major version and fails early, with a message that says how to fix it, when Java is missing or too old.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

__all__ = ["check_java", "find_java", "java_major_version", "pycocoevalcap_dir"]

_INSTALL_HINT = (
    "install a Java runtime >= {min_major} (e.g. `apt-get install default-jre-headless` on Debian/Ubuntu, "
    "`brew install openjdk` on macOS, or `conda install -c conda-forge openjdk`) or point JAVA_HOME at one"
)
# `java -version` prints e.g. `openjdk version "17.0.15" 2025-04-15` or `java version "1.8.0_301"` on stderr.
_VERSION_PATTERN = re.compile(r'version\s+"([^"]+)"')
_VERSION_PROBE_TIMEOUT_S = 60


def find_java() -> str:
    """Return the path of the `java` executable: ``$JAVA_HOME/bin/java`` when it exists, else `java` on ``PATH``.

    Raises:
        RuntimeError: when no executable is found, naming the places searched and how to install Java.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / ("java.exe" if os.name == "nt" else "java")
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("java")
    if on_path is not None:
        return on_path
    searched = f"JAVA_HOME={java_home!r} (no executable bin/java there), " if java_home else "JAVA_HOME is unset, "
    raise RuntimeError(
        f"No Java runtime found: {searched}and no `java` on PATH. METEOR, SPICE and the PTB tokenizer need Java; "
        + _INSTALL_HINT.format(min_major=8)
        + "."
    )


def _parse_java_version(version_output: str) -> int:
    """Return the major version from the text of `java -version` ("1.8.0_301" -> 8, "17.0.15" -> 17, "21" -> 21)."""
    match = _VERSION_PATTERN.search(version_output)
    if match is None:
        raise ValueError(f'no `version "..."` in {version_output.strip()!r}')
    version = match.group(1)
    # Java <= 8 reports "1.<major>.0_<update>"; Java >= 9 reports "<major>[.<minor>...][-ea]".
    components = re.split(r"[._+-]", version)
    if components[0] == "1" and len(components) > 1:
        components = components[1:]
    if not components[0].isdigit():
        raise ValueError(f"unrecognized Java version string {version!r}")
    return int(components[0])


@functools.lru_cache(maxsize=8)
def java_major_version(java: str) -> int:
    """Return the major version of the Java executable at `java` (cached per path).

    Raises:
        RuntimeError: when the executable cannot be run or its `-version` output cannot be parsed.
    """
    try:
        completed = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=_VERSION_PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(
            f"Could not run `{java} -version` ({error}); " + _INSTALL_HINT.format(min_major=8) + "."
        ) from error
    # The version goes to stderr on every JDK; some wrappers print it on stdout.
    output = completed.stderr + completed.stdout
    try:
        return _parse_java_version(output)
    except ValueError as error:
        raise RuntimeError(
            f"Could not read the Java version from `{java} -version` (exit code {completed.returncode}, "
            f"output {output.strip()[:300]!r}): {error}. Check that this is a working Java runtime, or "
            + _INSTALL_HINT.format(min_major=8)
            + "."
        ) from error


def check_java(min_major: int = 8) -> int:
    """Check that a Java runtime of at least major version `min_major` is available and return its major version.

    Args:
        min_major (`int`, *optional*, defaults to 8):
            Lowest acceptable major version (METEOR 1.5 and SPICE 1.0 were built for Java 8).

    Raises:
        RuntimeError: when Java is missing, cannot be run, or is older than `min_major`; the message names what was
            found and how to fix it.
    """
    java = find_java()
    major = java_major_version(java)
    if major < min_major:
        raise RuntimeError(
            f"Java at {java} is version {major}, but at least {min_major} is needed; "
            + _INSTALL_HINT.format(min_major=min_major)
            + "."
        )
    return major


def pycocoevalcap_dir(subdirectory: str = "") -> Path:
    """Return the directory of the installed `pycocoevalcap` package (or one of its subdirectories).

    `pycocoevalcap` is a namespace package (its `__file__` is None), so it is located through its import spec.

    Raises:
        RuntimeError: when `pycocoevalcap` is not installed, saying how to install it.
    """
    spec = importlib.util.find_spec("pycocoevalcap")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise RuntimeError(
            "The Java metrics use the jars shipped with `pycocoevalcap`, which is not installed; "
            'run `pip install "rlcaption[java]"`.'
        )
    directory = Path(locations[0]) / subdirectory
    if not directory.is_dir():
        raise RuntimeError(
            f"The installed `pycocoevalcap` at {locations[0]} has no `{subdirectory}` directory; reinstall it with "
            '`pip install --force-reinstall "rlcaption[java]"`.'
        )
    return directory
