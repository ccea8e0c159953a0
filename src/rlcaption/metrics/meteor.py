"""METEOR 1.5 as computed by the COCO caption evaluation code, through one long-lived Java process.

The scorer runs the `meteor-1.5.jar` shipped with `pycocoevalcap` exactly as `pycocoevalcap.meteor.Meteor` does
(`java -jar -Xmx2G meteor-1.5.jar - - -stdio -l en -norm`) and speaks the same line protocol: one
``SCORE ||| ref_1 ||| ... ||| ref_m ||| hypothesis`` line per caption, answered by a line of sufficient statistics,
then one ``EVAL ||| stats_1 ||| ... ||| stats_n`` line, answered by the n per-caption scores and the corpus score.
The values are therefore those of `pycocoevalcap` (same strings from the same jar). What differs:

- the JVM is started once per scorer (about 5 s with the paraphrase table) and reused across calls, restarted
  transparently if it died, and closed at interpreter exit;
- all ``SCORE`` lines of a call are written by a background thread while the statistics are read, instead of one
  round trip per caption;
- inputs that would break the line protocol are sanitized (see `sanitize_meteor_hypothesis` and
  `sanitize_meteor_reference`); on inputs without line breaks or ``|||`` the text sent is byte-identical to
  `pycocoevalcap`'s.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
import weakref
from collections.abc import Hashable, Mapping, Sequence
from typing import IO, TypeVar

from .bleu import check_caption_corpus
from .java import check_java, find_java, pycocoevalcap_dir

__all__ = [
    "MeteorScorer",
    "compute_meteor",
    "sanitize_meteor_hypothesis",
    "sanitize_meteor_reference",
]

K = TypeVar("K", bound=Hashable)

METEOR_JAR = "meteor-1.5.jar"
# Java's BufferedReader.readLine ends a line at any of these, so each would split one protocol message in two.
_LINE_BREAKS = ("\r\n", "\r", "\n")
_FIELD_SEPARATOR = "|||"


def _join_lines(text: str) -> str:
    for line_break in _LINE_BREAKS:
        text = text.replace(line_break, " ")
    return text


def sanitize_meteor_hypothesis(hypothesis: str) -> str:
    """Make a candidate caption safe for the METEOR line protocol.

    Line breaks become spaces (a line break would end the ``SCORE`` message early); then, exactly as
    `pycocoevalcap.meteor.Meteor._stat` does, every ``|||`` (the field separator) is removed and double spaces are
    replaced by single ones in one pass, so that the statistics equal `pycocoevalcap`'s.
    """
    return _join_lines(hypothesis).replace(_FIELD_SEPARATOR, "").replace("  ", " ")


def sanitize_meteor_reference(reference: str) -> str:
    """Make a reference caption safe for the METEOR line protocol.

    Line breaks become spaces and ``|||`` is removed. `pycocoevalcap` sends references unchanged, so a ``|||``
    inside a reference silently splits it into two references there; here it stays one reference. Both are no-ops
    on ordinary (tokenized) captions, whose statistics are therefore identical to `pycocoevalcap`'s.
    """
    return _join_lines(reference).replace(_FIELD_SEPARATOR, "")


def _close_process(state: dict) -> None:
    """Terminate the METEOR process held in `state` (also run at interpreter exit through `weakref.finalize`)."""
    process: subprocess.Popen | None = state.get("process")
    state["process"] = None
    if process is None:
        return
    try:
        if process.stdin is not None:
            process.stdin.close()
    except OSError:
        pass
    if process.poll() is None:
        process.kill()
    process.wait()
    for stream in (process.stdout, state.get("stderr")):
        if stream is not None:
            stream.close()
    state["stderr"] = None


class MeteorScorer:
    """A long-lived METEOR 1.5 process (the jar shipped with `pycocoevalcap`), safe to share between threads.

    The process starts on the first call, is reused by later calls, is restarted if it died (a failed call is
    retried once on a fresh process), and is terminated by `close()`, when the scorer is garbage-collected, or at
    interpreter exit.

    Args:
        max_heap (`str`, *optional*, defaults to `"2G"`):
            Java heap limit (`-Xmx`), as in `pycocoevalcap`.
        language (`str`, *optional*, defaults to `"en"`):
            METEOR language code; the paraphrase table shipped with `pycocoevalcap` covers English only.

    Example:

    ```python
    >>> scorer = MeteorScorer()
    >>> corpus_score, per_key = scorer.score({1: "a dog runs"}, {1: ["a dog is running", "the dog runs"]})
    ```
    """

    def __init__(self, max_heap: str = "2G", language: str = "en"):
        self.max_heap = max_heap
        self.language = language
        self._lock = threading.Lock()
        self._state: dict = {"process": None, "stderr": None}
        self._finalizer = weakref.finalize(self, _close_process, self._state)

    @property
    def command(self) -> list[str]:
        """The command line of the METEOR process (the same as `pycocoevalcap`'s, with a resolved `java`)."""
        return [
            find_java(),
            "-jar",
            f"-Xmx{self.max_heap}",
            METEOR_JAR,
            "-",
            "-",
            "-stdio",
            "-l",
            self.language,
            "-norm",
        ]

    @property
    def process(self) -> subprocess.Popen | None:
        """The running METEOR process, or None before the first call / after `close()`."""
        return self._state["process"]

    @staticmethod
    def preflight() -> None:
        """Check, before starting a process, that Java >= 8 and the METEOR jar are available.

        Raises:
            RuntimeError: naming what is missing and how to install it.
        """
        check_java(8)
        meteor_jar = pycocoevalcap_dir("meteor") / METEOR_JAR
        if not meteor_jar.is_file():
            raise RuntimeError(
                f'{meteor_jar} is missing; reinstall it with `pip install --force-reinstall "rlcaption[java]"`.'
            )

    def _start(self) -> subprocess.Popen:
        meteor_dir = pycocoevalcap_dir("meteor")
        # stderr goes to a file: a pipe nobody reads could fill up and block the JVM, and the file's content explains
        # a crash in the error message.
        stderr_file = tempfile.TemporaryFile()
        process = subprocess.Popen(
            self.command,
            cwd=meteor_dir,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr_file,
        )
        self._state.update(process=process, stderr=stderr_file)
        return process

    def _stderr_tail(self, limit: int = 2000) -> str:
        stderr_file: IO[bytes] | None = self._state.get("stderr")
        if stderr_file is None:
            return ""
        stderr_file.seek(0)
        return stderr_file.read().decode("utf-8", errors="replace")[-limit:].strip()

    def close(self) -> None:
        """Terminate the METEOR process (a later call starts a new one)."""
        with self._lock:
            _close_process(self._state)

    def score(
        self, predictions: Mapping[K, str], references: Mapping[K, Sequence[str]]
    ) -> tuple[float, dict[K, float]]:
        """Score one candidate per key against that key's references.

        Args:
            predictions (`Mapping[K, str]`):
                One candidate caption per key (tokenized, tokens joined by spaces, as the COCO toolkit expects).
            references (`Mapping[K, Sequence[str]]`):
                The reference captions of every key of `predictions` (same keys, at least one reference each).

        Returns:
            `tuple[float, dict[K, float]]`: the corpus METEOR (computed by the jar from the summed statistics, not a
            mean of the per-key scores) and the METEOR of each key.

        Raises:
            ValueError: on mismatched keys, a key without references, or an empty input.
            RuntimeError: when Java is unusable or the METEOR process fails twice in a row.
        """
        keys = check_caption_corpus(predictions, references, "METEOR")
        if self._state["process"] is None:
            self.preflight()
        score_lines = [
            " ||| ".join(
                (
                    "SCORE",
                    " ||| ".join(sanitize_meteor_reference(reference) for reference in references[key]),
                    sanitize_meteor_hypothesis(predictions[key]),
                )
            )
            for key in keys
        ]
        with self._lock:
            try:
                corpus_score, scores = self._exchange(score_lines)
            except (OSError, RuntimeError, ValueError) as first_error:
                # The process died (killed, out of memory) or answered garbage: retry once on a fresh one.
                stderr_tail = self._stderr_tail()
                _close_process(self._state)
                try:
                    corpus_score, scores = self._exchange(score_lines)
                except (OSError, RuntimeError, ValueError) as second_error:
                    stderr_tail = self._stderr_tail() or stderr_tail
                    _close_process(self._state)
                    raise RuntimeError(
                        f"The METEOR process ({' '.join(self.command)}) failed twice: {first_error!r}, then "
                        f"{second_error!r}. Its stderr ended with: {stderr_tail or '(nothing)'}"
                    ) from second_error
        return corpus_score, dict(zip(keys, scores, strict=True))

    def _exchange(self, score_lines: list[str]) -> tuple[float, list[float]]:
        """Send the SCORE lines and the EVAL line to the (possibly restarted) process and parse the scores."""
        process = self._state["process"]
        if process is None or process.poll() is not None:
            _close_process(self._state)
            process = self._start()
        # 1. SCORE lines, written by a thread while this one reads the statistics: writing everything first could
        #    deadlock once the JVM blocks on a full stdout pipe that nobody reads yet.
        write_errors: list[BaseException] = []

        def write_score_lines() -> None:
            try:
                process.stdin.write("".join(line + "\n" for line in score_lines).encode("utf-8"))
                process.stdin.flush()
            except OSError as error:  # broken pipe: the reader below sees the end of stdout and reports it
                write_errors.append(error)

        writer = threading.Thread(target=write_score_lines, name="meteor-writer", daemon=True)
        writer.start()
        try:
            statistics = [self._read_line(process) for _ in score_lines]
        finally:
            writer.join()
        if write_errors:
            raise write_errors[0]
        # 2. EVAL line: the jar answers one score per SCORE line, then the corpus score.
        process.stdin.write(("EVAL ||| " + " ||| ".join(statistics) + "\n").encode("utf-8"))
        process.stdin.flush()
        scores = [float(self._read_line(process)) for _ in score_lines]
        corpus_score = float(self._read_line(process))
        return corpus_score, scores

    @staticmethod
    def _read_line(process: subprocess.Popen) -> str:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the METEOR process ended (exit code {process.poll()}) before answering")
        text = line.decode("utf-8").strip()
        if text.startswith("Error"):
            raise RuntimeError(f"the METEOR process answered {text!r}")
        return text


_shared_scorer: MeteorScorer | None = None
_shared_scorer_lock = threading.Lock()


def _get_shared_scorer() -> MeteorScorer:
    global _shared_scorer
    with _shared_scorer_lock:
        if _shared_scorer is None:
            _shared_scorer = MeteorScorer()
        return _shared_scorer


def compute_meteor(
    predictions: Mapping[K, str], references: Mapping[K, Sequence[str]]
) -> tuple[float, dict[K, float]]:
    """METEOR 1.5 of one candidate per key, equal to `pycocoevalcap.meteor.Meteor` on the same tokenized inputs.

    Uses one process shared by all calls in this interpreter (see `MeteorScorer`).

    Args:
        predictions (`Mapping[K, str]`):
            One tokenized candidate caption per key (tokens joined by single spaces).
        references (`Mapping[K, Sequence[str]]`):
            The tokenized reference captions of each key (same keys as `predictions`).

    Returns:
        `tuple[float, dict[K, float]]`: corpus METEOR and the METEOR of each key.
    """
    return _get_shared_scorer().score(predictions, references)
