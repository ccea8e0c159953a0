"""SPICE: preflight messages, the jar invocation and result parsing (with a fake `java`), the installer.

The real SPICE needs the Stanford CoreNLP 3.6.0 jars (~400 MB from the internet); the test that runs it is skipped,
with the preflight's reason, where they are absent.
"""

import io
import json
import stat
import sys
import urllib.error
import zipfile
from pathlib import Path

import pytest

from rlcaption.cli import build_parser
from rlcaption.metrics import spice as spice_module
from rlcaption.metrics.java import java_major_version
from rlcaption.metrics.spice import (
    CORENLP_JARS,
    CORENLP_RELEASE,
    NASHORN_ARTIFACTS,
    NASHORN_JARS,
    check_spice,
    compute_spice,
    download_spice,
    run_download_spice,
)

pytest.importorskip(
    "pycocoevalcap", reason='SPICE uses the jar shipped with pycocoevalcap: pip install "rlcaption[java]"'
)

# A stand-in for `java`: answers `-version` like a JDK and, for the SPICE command, writes SPICE's output format with
# a transparent score (the share of candidate words found in the references; NaN for an empty candidate, as SPICE
# writes for a caption without tuples). It logs its arguments so the tests can check the command line.
FAKE_JAVA = """#!{python}
import json, math, os, sys
args = sys.argv[1:]
if args == ["-version"]:
    sys.stderr.write('openjdk version "{version}" 2025-04-15\\n')
    sys.exit(0)
with open(os.environ["FAKE_JAVA_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if os.environ.get("FAKE_SPICE_FAIL"):
    sys.stderr.write("Error: Could not score batched file input:\\njava.lang.NullPointerException\\n")
    sys.exit(1)
records = json.load(open(args[args.index("edu.anu.spice.SpiceScorer") + 1]))
results = []
for record in records:
    words = record["test"].split()
    reference_words = {{word for reference in record["refs"] for word in reference.split()}}
    f = sum(word in reference_words for word in words) / len(words) if words else math.nan
    results.append({{"image_id": record["image_id"], "scores": {{"All": {{"pr": f, "re": f, "f": f}},
                    "Object": {{"pr": 0.0, "re": 0.0, "f": 0.0}}}}}})
json.dump(results, open(args[args.index("-out") + 1], "w"))
"""


@pytest.fixture
def fake_java(monkeypatch, tmp_path):
    """Install a fake `java` of the given version on an isolated PATH; returns (set_version, log path)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "java_calls.jsonl"
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_JAVA_LOG", str(log))
    monkeypatch.delenv("FAKE_SPICE_FAIL", raising=False)

    def set_version(version: str) -> Path:
        script = bin_dir / "java"
        script.write_text(FAKE_JAVA.format(python=sys.executable, version=version))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        java_major_version.cache_clear()
        return script

    set_version("17.0.15")
    yield set_version, log
    java_major_version.cache_clear()


@pytest.fixture
def spice_lib(monkeypatch, tmp_path):
    """An empty SPICE library directory named by RLCAPTION_SPICE_LIB."""
    lib = tmp_path / "spice_lib"
    lib.mkdir()
    monkeypatch.setenv("RLCAPTION_SPICE_LIB", str(lib))
    return lib


def fill(lib: Path, names) -> None:
    for name in names:
        (lib / name).write_bytes(b"placeholder")


def test_preflight_names_missing_corenlp_jars_and_the_download_command(fake_java, spice_lib):
    fill(spice_lib, CORENLP_JARS[:1])
    with pytest.raises(RuntimeError) as error:
        check_spice()
    message = str(error.value)
    assert "stanford-corenlp-3.6.0-models.jar" in message
    assert "stanford-corenlp-3.6.0.jar," not in message  # the one present is not listed as missing
    assert str(spice_lib) in message and "pycocoevalcap/spice/lib" in message
    assert "rlcaption download-spice" in message and "machine with internet" in message
    assert f"{CORENLP_RELEASE}.zip" in message and "~400 MB" in message


def test_preflight_defaults_to_the_pycocoevalcap_lib_directory(fake_java, monkeypatch):
    monkeypatch.delenv("RLCAPTION_SPICE_LIB", raising=False)
    assert spice_module.spice_lib_dir() == spice_module.pycocoevalcap_dir("spice") / "lib"


def test_preflight_on_java_15_plus_asks_for_nashorn(fake_java, spice_lib):
    fill(spice_lib, CORENLP_JARS)
    with pytest.raises(RuntimeError) as error:
        check_spice()
    message = str(error.value)
    assert "Java 17" in message and "nashorn-core-15.4.jar" in message
    assert "rlcaption download-spice" in message and "JAVA_HOME" in message
    fill(spice_lib, NASHORN_JARS)
    classpath = check_spice()
    assert classpath[0].endswith("spice-1.0.jar")
    assert str(spice_lib / "nashorn-core-15.4.jar") in classpath
    assert all(str(spice_lib / name) in classpath for name in CORENLP_JARS)
    assert any(entry.endswith("SceneGraphParser-1.0.jar") for entry in classpath)  # the bundled libraries


def test_preflight_on_java_8_needs_no_nashorn(fake_java, spice_lib):
    set_version, _ = fake_java
    set_version("1.8.0_412")
    fill(spice_lib, CORENLP_JARS)
    classpath = check_spice()
    assert not any("nashorn" in entry for entry in classpath)


def test_preflight_rejects_missing_or_old_java_before_anything_else(fake_java, spice_lib):
    set_version, _ = fake_java
    set_version("1.6.0_45")
    with pytest.raises(RuntimeError, match="version 6, but at least 8"):
        check_spice()
    with pytest.raises(RuntimeError, match="version 6, but at least 8"):
        compute_spice({1: "a dog"}, {1: ["a dog"]})


def test_compute_spice_runs_the_jar_and_parses_all_f_scores(fake_java, spice_lib, tmp_path):
    _, log = fake_java
    fill(spice_lib, CORENLP_JARS + NASHORN_JARS)
    predictions = {"b": "a dog on grass", "a": "a red cat", ("c", 1): ""}
    references = {"b": ["a dog on the grass", "dog"], "a": ["a cat"], ("c", 1): ["anything"]}
    corpus, per_key = compute_spice(predictions, references, cache_dir=tmp_path / "cache", threads=2)
    # per key: share of candidate words in the references (the fake's score); the empty candidate's NaN counts as 0
    assert per_key == {"b": 1.0, "a": pytest.approx(2 / 3), ("c", 1): 0.0}
    assert corpus == pytest.approx((1.0 + 2 / 3 + 0.0) / 3)
    (arguments,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert arguments[0] == "-Xmx8G" and arguments[1] == "-cp"
    assert "nashorn-core-15.4.jar" in arguments[2]
    assert arguments[3] == "edu.anu.spice.SpiceScorer"
    assert {"-subset", "-silent"} <= set(arguments)
    assert arguments[arguments.index("-cache") + 1] == str(tmp_path / "cache")
    assert arguments[arguments.index("-threads") + 1] == "2"


def test_compute_spice_reports_the_jar_failure(fake_java, spice_lib, monkeypatch):
    fill(spice_lib, CORENLP_JARS + NASHORN_JARS)
    monkeypatch.setenv("FAKE_SPICE_FAIL", "1")
    with pytest.raises(RuntimeError, match=r"(?s)SPICE failed \(exit code 1\).*NullPointerException.*<\d+ jars"):
        compute_spice({1: "a dog"}, {1: ["a dog"]})


def test_compute_spice_rejects_bad_input_before_java(fake_java, spice_lib):
    _, log = fake_java
    with pytest.raises(ValueError, match="prediction key 2 has no entry in references"):
        compute_spice({1: "a", 2: "b"}, {1: ["a"]})
    with pytest.raises(ValueError, match="references for key 1 are an empty list"):
        compute_spice({1: "a"}, {1: []})
    assert not log.exists()


# ---------------------------------------------------------------------------------------------------------------
# download_spice, against local files instead of the internet
# ---------------------------------------------------------------------------------------------------------------


def make_jar(path: Path, content: str) -> bytes:
    with zipfile.ZipFile(path, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", f"Manifest-Version: 1.0\nCreated-By: {content}\n")
    return path.read_bytes()


@pytest.fixture
def download_sources(tmp_path):
    """A CoreNLP release zip and a Maven repository layout on disk; returns (zip URL, maven URL, expected bytes)."""
    sources = tmp_path / "sources"
    sources.mkdir()
    expected = {}
    release = sources / f"{CORENLP_RELEASE}.zip"
    with zipfile.ZipFile(release, "w") as bundle:
        for name in CORENLP_JARS:
            expected[name] = make_jar(sources / name, name)
            bundle.write(sources / name, f"{CORENLP_RELEASE}/{name}")
        bundle.writestr(f"{CORENLP_RELEASE}/README.txt", "other files of the release")
    maven = sources / "maven"
    for (group, artifact, version), name in zip(NASHORN_ARTIFACTS, NASHORN_JARS, strict=True):
        directory = maven / group.replace(".", "/") / artifact / version
        directory.mkdir(parents=True)
        expected[name] = make_jar(directory / name, name)
    return release.as_uri(), maven.as_uri(), expected


def test_download_spice_installs_the_jars(download_sources, tmp_path):
    corenlp_url, maven_url, expected = download_sources
    target = tmp_path / "installed"
    installed = download_spice(target, corenlp_url=corenlp_url, maven_url=maven_url, show_progress=False)
    assert installed == str(target)
    assert sorted(path.name for path in target.iterdir()) == sorted(expected)  # no temporary leftovers
    for name, content in expected.items():
        assert (target / name).read_bytes() == content
    # already installed: nothing is fetched again (an unreachable URL is never opened)
    assert download_spice(target, corenlp_url="file:///nonexistent.zip", maven_url="file:///nowhere") == str(target)


def test_download_spice_defaults_to_the_configured_lib_dir(download_sources, spice_lib):
    corenlp_url, maven_url, _ = download_sources
    assert download_spice(corenlp_url=corenlp_url, include_nashorn=False, show_progress=False) == str(spice_lib)
    assert sorted(path.name for path in spice_lib.iterdir()) == sorted(CORENLP_JARS)


def test_download_spice_rejects_a_non_zip_and_installs_nothing(tmp_path):
    page = tmp_path / "proxy_error.html"
    page.write_text("<html>407 Proxy Authentication Required</html>")
    target = tmp_path / "installed"
    with pytest.raises(RuntimeError, match="did not deliver a zip archive"):
        download_spice(target, corenlp_url=page.as_uri(), show_progress=False)
    assert list(target.iterdir()) == []


def test_download_spice_rejects_a_release_without_the_models_jar(tmp_path):
    release = tmp_path / "release.zip"
    with zipfile.ZipFile(release, "w") as bundle:
        bundle.writestr(f"{CORENLP_RELEASE}/stanford-corenlp-3.6.0.jar", make_jar(tmp_path / "a.jar", "a"))
    target = tmp_path / "installed"
    with pytest.raises(RuntimeError, match="does not contain stanford-corenlp-3.6.0-models.jar"):
        download_spice(target, corenlp_url=release.as_uri(), show_progress=False)
    assert list(target.iterdir()) == []


def test_download_spice_network_failure_says_what_to_do(monkeypatch, tmp_path):
    def unreachable(url, timeout):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(spice_module.urllib.request, "urlopen", unreachable)
    target = tmp_path / "installed"
    with pytest.raises(RuntimeError) as error:
        download_spice(target, show_progress=False)
    message = str(error.value)
    assert "Could not download https://nlp.stanford.edu/software/stanford-corenlp-full-2015-12-09.zip" in message
    assert "name resolution" in message and "internet access" in message and "RLCAPTION_SPICE_LIB" in message
    assert list(target.iterdir()) == []


def test_download_spice_detects_a_truncated_download(monkeypatch, tmp_path):
    class TruncatedResponse(io.BytesIO):
        headers = {"Content-Length": "1000000"}

    monkeypatch.setattr(spice_module.urllib.request, "urlopen", lambda url, timeout: TruncatedResponse(b"PK\x03\x04"))
    target = tmp_path / "installed"
    with pytest.raises(RuntimeError, match="stopped after 4 of 1000000 bytes"):
        download_spice(target, show_progress=False)
    assert list(target.iterdir()) == []


def test_console_subcommand(download_sources, tmp_path, capsys):
    corenlp_url, maven_url, expected = download_sources
    target = tmp_path / "cli_target"
    args = build_parser().parse_args(
        ["download-spice", "--target-dir", str(target), "--corenlp-url", corenlp_url, "--maven-url", maven_url,
         "--quiet"]
    )  # fmt: skip
    assert run_download_spice(args) == 0
    assert sorted(path.name for path in target.iterdir()) == sorted(expected)
    output = capsys.readouterr().out
    assert f"SPICE jars are in {target}" in output and f"RLCAPTION_SPICE_LIB={target}" in output


def _spice_problem() -> str | None:
    try:
        check_spice()
    except RuntimeError as error:
        return str(error)
    return None


@pytest.mark.java
@pytest.mark.slow
@pytest.mark.skipif(_spice_problem() is not None, reason=f"SPICE cannot run here: {_spice_problem()}")
def test_real_spice_scores_a_paraphrase_above_an_unrelated_caption():
    references = ["a man riding a horse on a beach", "a person rides a brown horse along the shore"]
    corpus, per_key = compute_spice(
        {"related": "a man rides a horse on the beach", "unrelated": "a plate of food on a table"},
        {"related": references, "unrelated": references},
    )
    assert 0.0 <= per_key["unrelated"] < per_key["related"] <= 1.0
    assert corpus == pytest.approx((per_key["related"] + per_key["unrelated"]) / 2)
