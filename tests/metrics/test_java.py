import importlib.util
import os
import stat
from pathlib import Path

import pytest

from rlcaption.metrics import java as java_module
from rlcaption.metrics.java import (
    _parse_java_version,
    check_java,
    find_java,
    java_major_version,
    pycocoevalcap_dir,
)


def write_fake_java(directory: Path, version_stderr: str, exit_code: int = 0) -> Path:
    """A `java` executable that prints `version_stderr` on stderr for `java -version`, like a real JDK."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "java"
    # only shell builtins: the tests run with a PATH that holds nothing but this directory
    quoted = version_stderr.replace("'", "'\\''")
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' '{quoted}' >&2\nexit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


@pytest.fixture
def isolated_java_environment(monkeypatch, tmp_path):
    """No JAVA_HOME and a PATH holding only a temporary directory; the version cache is cleared around the test."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    empty_bin = tmp_path / "path_bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    java_major_version.cache_clear()
    yield empty_bin
    java_major_version.cache_clear()


posix_only = pytest.mark.skipif(os.name == "nt", reason="fake `java` executables are POSIX shell scripts")


@pytest.mark.parametrize(
    "version_output, expected_major",
    [
        ('java version "1.8.0_301"\nJava(TM) SE Runtime Environment (build 1.8.0_301-b09)', 8),
        ('openjdk version "1.8.0_412"\nOpenJDK Runtime Environment (build 1.8.0_412-8u412-ga-1~22.04-b08)', 8),
        ('openjdk version "17.0.15" 2025-04-15\nOpenJDK 64-Bit Server VM (build 17.0.15+6-Debian-1deb12u1)', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('openjdk version "11.0.2" 2019-01-15', 11),
        ('java version "9-ea"', 9),
        ('Picked up JAVA_TOOL_OPTIONS: -Xss4m\njava version "1.6.0_45"', 6),
    ],
)
def test_parse_java_version(version_output, expected_major):
    assert _parse_java_version(version_output) == expected_major


@pytest.mark.parametrize("garbled", ["", "hello world", 'version "beta"'])
def test_parse_java_version_rejects_garbled_output(garbled):
    with pytest.raises(ValueError):
        _parse_java_version(garbled)


@posix_only
def test_missing_java_names_the_search_and_the_fix(isolated_java_environment):
    with pytest.raises(RuntimeError) as error:
        check_java()
    message = str(error.value)
    assert "No Java runtime found" in message
    assert "JAVA_HOME is unset" in message
    assert "apt-get install default-jre-headless" in message


@posix_only
def test_java_home_without_executable_falls_back_to_path(isolated_java_environment, monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no_such_jdk"))
    with pytest.raises(RuntimeError, match="no executable bin/java there"):
        find_java()
    path_java = write_fake_java(isolated_java_environment, 'openjdk version "11.0.2" 2019-01-15')
    assert find_java() == str(path_java)
    assert check_java() == 11


@posix_only
def test_too_old_java_is_rejected_with_version_and_fix(isolated_java_environment):
    fake = write_fake_java(isolated_java_environment, 'java version "1.6.0_45"\nJava(TM) SE Runtime Environment')
    with pytest.raises(RuntimeError) as error:
        check_java(8)
    message = str(error.value)
    assert str(fake) in message
    assert "version 6" in message and "at least 8" in message
    assert "JAVA_HOME" in message and "default-jre-headless" in message


@posix_only
def test_garbled_version_output_is_an_error(isolated_java_environment):
    write_fake_java(isolated_java_environment, "Segmentation fault (core dumped)", exit_code=139)
    with pytest.raises(RuntimeError, match="Could not read the Java version.*exit code 139"):
        check_java()


@posix_only
def test_java_home_takes_precedence_over_path(isolated_java_environment, monkeypatch, tmp_path):
    write_fake_java(isolated_java_environment, 'java version "1.7.0_80"')
    java_home = tmp_path / "jdk17"
    home_java = write_fake_java(java_home / "bin", 'openjdk version "17.0.15" 2025-04-15')
    monkeypatch.setenv("JAVA_HOME", str(java_home))
    assert find_java() == str(home_java)
    assert check_java(8) == 17
    # the minimum is a parameter: the same runtime fails a stricter check
    with pytest.raises(RuntimeError, match="version 17, but at least 21"):
        check_java(21)


@posix_only
def test_version_is_cached_per_executable(isolated_java_environment):
    fake = write_fake_java(isolated_java_environment, 'openjdk version "17.0.15"')
    assert java_major_version(str(fake)) == 17
    # Once probed, the version is not re-read (the JVM start costs hundreds of milliseconds).
    write_fake_java(isolated_java_environment, 'java version "1.6.0_45"')
    assert java_major_version(str(fake)) == 17
    java_major_version.cache_clear()
    assert java_major_version(str(fake)) == 6


def test_missing_pycocoevalcap_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec_without_pycocoevalcap(name, *args, **kwargs):
        return None if name == "pycocoevalcap" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(java_module.importlib.util, "find_spec", find_spec_without_pycocoevalcap)
    with pytest.raises(RuntimeError, match=r'pip install "rlcaption\[java\]"'):
        pycocoevalcap_dir("meteor")


def test_pycocoevalcap_dir_locates_the_shipped_jars():
    pytest.importorskip("pycocoevalcap", reason='pycocoevalcap is an optional extra: pip install "rlcaption[java]"')
    assert (pycocoevalcap_dir("meteor") / "meteor-1.5.jar").is_file()
    assert (pycocoevalcap_dir("spice") / "spice-1.0.jar").is_file()
    with pytest.raises(RuntimeError, match="no `no_such_dir` directory"):
        pycocoevalcap_dir("no_such_dir")


def _real_java_major() -> int | None:
    try:
        return check_java(8)
    except RuntimeError:
        return None


@pytest.mark.java
@pytest.mark.skipif(_real_java_major() is None, reason="needs a Java runtime >= 8 on PATH or in JAVA_HOME")
def test_real_java_is_recent_enough():
    assert _real_java_major() >= 8
    assert Path(find_java()).name.startswith("java")
