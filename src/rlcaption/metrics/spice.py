"""SPICE 1.0 through the `spice-1.0.jar` shipped with `pycocoevalcap`, with a preflight and an installer.

SPICE parses captions into scene graphs with Stanford CoreNLP 3.6.0, whose two jars (about 400 MB zipped) are not
shipped with `pycocoevalcap`: its `Spice()` downloads them on first use and fails without internet. Here, SPICE never
downloads anything while evaluating. `check_spice` verifies beforehand that everything is in place and otherwise
raises a `RuntimeError` that names the missing files, where they must be, and the command that fetches them
(`rlcaption download-spice`, i.e. `download_spice`), to be run once on a machine with internet.

SPICE 1.0 pretty-prints its JSON output through the JDK's JavaScript engine (Nashorn), which Java 15 removed: on
Java >= 15 the jar parses every caption and then fails while writing its result. On such runtimes the standalone
Nashorn engine (`org.openjdk.nashorn:nashorn-core` 15.4 and its ASM dependencies, from Maven Central) must be in the
SPICE library directory too; `download_spice` fetches it, and `check_spice` asks for it.

The library directory is `pycocoevalcap/spice/lib/` (where `pycocoevalcap` expects the jars) unless the environment
variable `RLCAPTION_SPICE_LIB` names another one (useful when site-packages is read-only).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from .bleu import check_caption_corpus
from .java import check_java, find_java, pycocoevalcap_dir

__all__ = [
    "CORENLP_JARS",
    "CORENLP_URL",
    "NASHORN_JARS",
    "SPICE_LIB_ENV",
    "check_spice",
    "compute_spice",
    "download_spice",
    "run_download_spice",
    "spice_lib_dir",
]

K = TypeVar("K", bound=Hashable)

SPICE_JAR = "spice-1.0.jar"
SPICE_MAIN_CLASS = "edu.anu.spice.SpiceScorer"
SPICE_LIB_ENV = "RLCAPTION_SPICE_LIB"
CORENLP_RELEASE = "stanford-corenlp-full-2015-12-09"
CORENLP_URL = f"https://nlp.stanford.edu/software/{CORENLP_RELEASE}.zip"
CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
MAVEN_CENTRAL_URL = "https://repo1.maven.org/maven2"
# Standalone Nashorn (needs Java >= 11) and the ASM libraries it depends on, as Maven coordinates (group, artifact,
# version); the jar of each is `<artifact>-<version>.jar`.
NASHORN_ARTIFACTS = (
    ("org.openjdk.nashorn", "nashorn-core", "15.4"),
    ("org.ow2.asm", "asm", "7.3.1"),
    ("org.ow2.asm", "asm-commons", "7.3.1"),
    ("org.ow2.asm", "asm-tree", "7.3.1"),
    ("org.ow2.asm", "asm-util", "7.3.1"),
    ("org.ow2.asm", "asm-analysis", "7.3.1"),
)
NASHORN_JARS = tuple(f"{artifact}-{version}.jar" for _, artifact, version in NASHORN_ARTIFACTS)
# The first Java release without a built-in JavaScript engine.
JAVA_WITHOUT_NASHORN = 15
_DOWNLOAD_HINT = (
    f"run `rlcaption download-spice` on a machine with internet (it fetches {CORENLP_RELEASE}.zip from the Stanford "
    "NLP site, ~400 MB)"
)


def spice_lib_dir() -> Path:
    """The directory that must hold the Stanford CoreNLP 3.6.0 jars: ``$RLCAPTION_SPICE_LIB`` or
    ``pycocoevalcap/spice/lib``."""
    configured = os.environ.get(SPICE_LIB_ENV)
    if configured:
        return Path(configured).expanduser()
    return pycocoevalcap_dir("spice") / "lib"


def check_spice() -> list[str]:
    """Check, without launching SPICE, that it can run here; return the Java classpath to run it with.

    Checks Java >= 8, the SPICE jar and its bundled libraries, the Stanford CoreNLP 3.6.0 jars in `spice_lib_dir()`,
    and on Java >= 15 the standalone Nashorn jars.

    Returns:
        `list[str]`: the jars of the classpath, SPICE's own jar first.

    Raises:
        RuntimeError: naming what is missing, where it must be and how to get it.
    """
    java_major = check_java(8)
    spice_dir = pycocoevalcap_dir("spice")
    spice_jar = spice_dir / SPICE_JAR
    if not spice_jar.is_file():
        raise RuntimeError(
            f'{spice_jar} is missing; reinstall it with `pip install --force-reinstall "rlcaption[java]"`.'
        )
    lib_dir = spice_lib_dir()
    missing = [name for name in CORENLP_JARS if not (lib_dir / name).is_file()]
    if missing:
        raise RuntimeError(
            f"SPICE needs the Stanford CoreNLP 3.6.0 jars {', '.join(missing)} in {lib_dir} (the directory is "
            f"`pycocoevalcap/spice/lib/`, or the one named by ${SPICE_LIB_ENV}); they are missing. "
            + _DOWNLOAD_HINT
            + f", or run `rlcaption download-spice --target-dir DIR` and set {SPICE_LIB_ENV}=DIR where "
            "site-packages is read-only."
        )
    if java_major >= JAVA_WITHOUT_NASHORN:
        missing_nashorn = [name for name in NASHORN_JARS if not (lib_dir / name).is_file()]
        if missing_nashorn:
            raise RuntimeError(
                f"SPICE 1.0 writes its results through the JDK's JavaScript engine, which Java {java_major} no "
                f"longer has; it needs the standalone Nashorn jars {', '.join(missing_nashorn)} in {lib_dir}. "
                "Run `rlcaption download-spice` on a machine with internet (it also fetches them from Maven "
                "Central), or run SPICE with a Java 8-14 runtime (set JAVA_HOME)."
            )
    bundled = sorted(str(path) for path in (spice_dir / "lib").glob("*.jar"))
    extra = [str(lib_dir / name) for name in CORENLP_JARS]
    if java_major >= JAVA_WITHOUT_NASHORN:
        extra += [str(lib_dir / name) for name in NASHORN_JARS]
    # `dict.fromkeys` keeps the order and drops the CoreNLP jars already listed when lib_dir is the bundled lib/.
    return list(dict.fromkeys([str(spice_jar), *bundled, *extra]))


def _spice_f_score(value: object) -> float:
    """SPICE's "All" F-score of one image; an undefined one (no tuples on either side, e.g. an empty candidate,
    written as NaN or null) counts as 0 instead of turning the corpus mean into NaN as in `pycocoevalcap`."""
    try:
        score = float(value)
    except (TypeError, ValueError):
        return 0.0
    return score if math.isfinite(score) else 0.0


def compute_spice(
    predictions: Mapping[K, str],
    references: Mapping[K, Sequence[str]],
    cache_dir: str | os.PathLike | None = None,
    max_heap: str = "8G",
    threads: int | None = None,
) -> tuple[float, dict[K, float]]:
    """SPICE of one candidate per key, computed by `spice-1.0.jar` as `pycocoevalcap.spice.Spice` does.

    The jar runs once per call on a temporary JSON file with `-subset -silent`; the per-key score is the F-score of
    the "All" tuple category and the corpus score their mean (as in `pycocoevalcap`). Everything is checked by
    `check_spice` before Java starts.

    Args:
        predictions (`Mapping[K, str]`):
            One candidate caption per key (tokenized, as for the other COCO metrics).
        references (`Mapping[K, Sequence[str]]`):
            The reference captions of each key (same keys, at least one each).
        cache_dir (`str` or `os.PathLike`, *optional*):
            Directory where SPICE caches the scene-graph parses (LMDB) between runs; no cache when None.
        max_heap (`str`, *optional*, defaults to `"8G"`):
            Java heap limit (`-Xmx`), as in `pycocoevalcap`.
        threads (`int`, *optional*):
            Parser threads; SPICE's default (all processors) when None.

    Returns:
        `tuple[float, dict[K, float]]`: corpus SPICE and the SPICE F-score of each key.

    Raises:
        ValueError: on mismatched keys, a key without references, or an empty input.
        RuntimeError: when SPICE cannot run here (see `check_spice`) or the jar fails.
    """
    keys = check_caption_corpus(predictions, references, "SPICE")
    classpath = check_spice()
    try:
        keys = sorted(keys)  # pycocoevalcap's order, so that the corpus mean is summed in the same order
    except TypeError:
        pass  # keys of mixed types: keep the given order
    with tempfile.TemporaryDirectory(prefix="rlcaption-spice-") as work_dir:
        input_path = Path(work_dir) / "input.json"
        output_path = Path(work_dir) / "output.json"
        # Keys may be any hashable: SPICE sees their positions as image ids.
        records = [
            {"image_id": position, "test": predictions[key], "refs": list(references[key])}
            for position, key in enumerate(keys)
        ]
        input_path.write_text(json.dumps(records), encoding="utf-8")
        command = [find_java(), f"-Xmx{max_heap}", "-cp", os.pathsep.join(classpath), SPICE_MAIN_CLASS]
        command += [str(input_path), "-out", str(output_path), "-subset", "-silent"]
        if cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            command += ["-cache", str(cache_dir)]
        if threads is not None:
            command += ["-threads", str(threads)]
        completed = subprocess.run(command, cwd=work_dir, capture_output=True, check=False)
        if completed.returncode != 0 or not output_path.is_file():
            stderr = completed.stderr.decode("utf-8", errors="replace").strip()
            shown_command = " ".join(command).replace(command[3], f"<{len(classpath)} jars, see check_spice()>")
            raise RuntimeError(
                f"SPICE failed (exit code {completed.returncode}); its stderr ended with: "
                f"{stderr[-3000:] or '(nothing)'} (command: {shown_command})"
            )
        results = json.loads(output_path.read_text(encoding="utf-8"))
    scores_by_position = {int(item["image_id"]): _spice_f_score(item["scores"]["All"]["f"]) for item in results}
    missing_positions = [position for position in range(len(keys)) if position not in scores_by_position]
    if missing_positions:
        raise RuntimeError(
            f"SPICE returned no score for the keys {[keys[position] for position in missing_positions[:5]]}."
        )
    per_key = {key: scores_by_position[position] for position, key in enumerate(keys)}
    corpus = math.fsum(per_key.values()) / len(per_key)
    return corpus, per_key


# --------------------------------------------------------------------------------------------------------------------
# Installing the Stanford CoreNLP (and Nashorn) jars
# --------------------------------------------------------------------------------------------------------------------


def _download(url: str, destination: Path, show_progress: bool) -> None:
    """Stream `url` into `destination` (a temporary file next to the final one), with clear errors."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(destination, "wb") as sink:
            total = int(response.headers.get("Content-Length") or 0)
            received = 0
            while chunk := response.read(1 << 20):
                sink.write(chunk)
                received += len(chunk)
                if show_progress and total:
                    print(
                        f"\r{url.rsplit('/', 1)[-1]}: {received / 2**20:7.1f} / {total / 2**20:.1f} MiB",
                        end="",
                        file=sys.stderr,
                        flush=True,
                    )
            if show_progress and total:
                print(file=sys.stderr)
            if total and received != total:
                raise RuntimeError(f"Downloading {url} stopped after {received} of {total} bytes; run it again.")
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise RuntimeError(
            f"Could not download {url}: {error}. This needs internet access (check the connection and the "
            "HTTPS_PROXY setting); on an offline machine, run `rlcaption download-spice --target-dir DIR` "
            f"elsewhere, copy DIR here and set {SPICE_LIB_ENV}=DIR."
        ) from error


def _install_corenlp(target: Path, url: str, show_progress: bool) -> None:
    with tempfile.TemporaryDirectory(prefix=".rlcaption-corenlp-", dir=target) as staging:
        archive = Path(staging) / f"{CORENLP_RELEASE}.zip"
        _download(url, archive, show_progress)
        if not zipfile.is_zipfile(archive):
            raise RuntimeError(f"{url} did not deliver a zip archive (a proxy error page?); nothing was installed.")
        with zipfile.ZipFile(archive) as bundle:
            members = {Path(name).name: name for name in bundle.namelist() if Path(name).name in CORENLP_JARS}
            missing = [name for name in CORENLP_JARS if name not in members]
            if missing:
                raise RuntimeError(f"{url} does not contain {', '.join(missing)}; nothing was installed.")
            for name in CORENLP_JARS:
                extracted = Path(staging) / name
                with bundle.open(members[name]) as source, open(extracted, "wb") as sink:
                    shutil.copyfileobj(source, sink)  # a corrupt member raises zipfile.BadZipFile (CRC check)
        for name in CORENLP_JARS:
            _check_jar(Path(staging) / name, url)
        # Both jars are complete and valid before either is put in place.
        for name in CORENLP_JARS:
            os.replace(Path(staging) / name, target / name)


def _install_nashorn(target: Path, maven_url: str, show_progress: bool) -> None:
    with tempfile.TemporaryDirectory(prefix=".rlcaption-nashorn-", dir=target) as staging:
        for (group, artifact, version), name in zip(NASHORN_ARTIFACTS, NASHORN_JARS, strict=True):
            url = f"{maven_url}/{group.replace('.', '/')}/{artifact}/{version}/{name}"
            _download(url, Path(staging) / name, show_progress)
            _check_jar(Path(staging) / name, url)
        for name in NASHORN_JARS:
            os.replace(Path(staging) / name, target / name)


def _check_jar(path: Path, url: str) -> None:
    try:
        with zipfile.ZipFile(path) as jar:
            corrupt_member = jar.testzip()
    except zipfile.BadZipFile as error:
        raise RuntimeError(f"{path.name} from {url} is not a valid jar ({error}); nothing was installed.") from error
    if corrupt_member is not None:
        raise RuntimeError(f"{path.name} from {url} is corrupt (bad CRC in {corrupt_member}); nothing was installed.")


def download_spice(
    target_dir: str | os.PathLike | None = None,
    corenlp_url: str = CORENLP_URL,
    maven_url: str = MAVEN_CENTRAL_URL,
    include_nashorn: bool = True,
    show_progress: bool = True,
) -> str:
    """Download the Stanford CoreNLP 3.6.0 jars that SPICE needs (and the standalone Nashorn engine for Java >= 15).

    Downloads `stanford-corenlp-full-2015-12-09.zip` (~400 MB) into a temporary file inside the target directory,
    checks the archive, extracts `stanford-corenlp-3.6.0.jar` and `stanford-corenlp-3.6.0-models.jar`, checks their
    CRCs and only then moves them into place, so an interrupted download never leaves a half-written jar behind.

    Args:
        target_dir (`str` or `os.PathLike`, *optional*):
            Where to put the jars; defaults to `spice_lib_dir()` (``$RLCAPTION_SPICE_LIB`` or
            `pycocoevalcap/spice/lib/`). Set ``RLCAPTION_SPICE_LIB`` to any other directory you use.
        corenlp_url (`str`, *optional*):
            Where to fetch the CoreNLP zip from (any URL `urllib` opens, e.g. a `file://` path to a copy).
        maven_url (`str`, *optional*):
            Maven repository to fetch Nashorn and ASM from (Maven Central by default, or a mirror).
        include_nashorn (`bool`, *optional*, defaults to `True`):
            Also fetch the standalone Nashorn jars (~2.5 MB) that SPICE needs on Java >= 15.
        show_progress (`bool`, *optional*, defaults to `True`):
            Print download progress on stderr.

    Returns:
        `str`: the directory holding the jars.

    Raises:
        RuntimeError: when a download fails (with what to do offline) or an archive is invalid.
    """
    target = Path(target_dir).expanduser() if target_dir is not None else spice_lib_dir()
    target.mkdir(parents=True, exist_ok=True)
    if not all((target / name).is_file() for name in CORENLP_JARS):
        _install_corenlp(target, corenlp_url, show_progress)
    if include_nashorn and not all((target / name).is_file() for name in NASHORN_JARS):
        _install_nashorn(target, maven_url, show_progress)
    return str(target)


def run_download_spice(args: argparse.Namespace) -> int:
    """Run `rlcaption download-spice` with the parsed `args`; return the exit status."""
    target = download_spice(
        target_dir=args.target_dir,
        corenlp_url=args.corenlp_url or CORENLP_URL,
        maven_url=args.maven_url or MAVEN_CENTRAL_URL,
        include_nashorn=not args.no_nashorn,
        show_progress=not args.quiet,
    )
    print(f"SPICE jars are in {target}")
    if args.target_dir is not None and Path(target) != spice_lib_dir():
        print(f"Set {SPICE_LIB_ENV}={target} so that SPICE finds them.")
    return 0
