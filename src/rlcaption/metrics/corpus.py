"""Corpus evaluation of captions with every COCO metric, in one call.

`evaluate_captions` does what the COCO toolkit's `COCOEvalCap.evaluate()` does (tokenize predictions and references
with the PTB tokenizer, then run each scorer on the tokens) and returns the scores under the toolkit's keys. It
differs from the toolkit where the toolkit gets in the way: the metrics to run can be chosen, the tokenizer is pure
Python by default, METEOR keeps one Java process across calls, CIDEr-D can take training-corpus document
frequencies, per-caption scores come back keyed like the inputs, and by default the Java metrics that cannot run
here (no Java, no SPICE jars) are skipped with a warning instead of failing the whole evaluation.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from .bleu import check_caption_corpus, compute_bleu
from .cider import DocumentFrequencies, compute_cider_d
from .java import check_java
from .meteor import compute_meteor
from .rouge import compute_rouge_l
from .spice import check_spice, compute_spice
from .tokenization import tokenize_corpus

if TYPE_CHECKING:
    import evaluate

__all__ = [
    "AVAILABLE_METRICS",
    "EVALUATE_MODULES",
    "CaptionScores",
    "evaluate_captions",
    "load_metric",
    "resolve_metric_names",
    "tokenize_captions",
]

K = TypeVar("K", bound=Hashable)

logger = logging.getLogger(__name__)

# Metric names accepted by `evaluate_captions(metrics=...)`, in the order the scores are reported.
AVAILABLE_METRICS = ("bleu", "meteor", "rouge_l", "cider", "spice", "spider")
_ALIASES = {"rouge": "rouge_l", "cider_d": "cider", "cider-d": "cider"}
# SPIDEr is (CIDEr-D + SPICE) / 2: asking for it runs both.
_REQUIREMENTS = {"spider": ("cider", "spice")}

# `evaluate` metric modules shipped in `rlcaption/metrics/evaluate_modules/` (the shapes benchmark's scene grounding in
# `rlcaption/shapes/evaluate_modules/`), by the name `load_metric` takes. They are loaded by path, not imported.
EVALUATE_MODULES = ("bleu", "meteor", "rouge_l", "cider_d", "spice", "spider", "scene_grounding")
_MODULE_ALIASES = {"rouge": "rouge_l", "cider": "cider_d", "cider-d": "cider_d"}
_PACKAGE = Path(__file__).resolve().parent.parent
_MODULE_PATHS = {
    name: _PACKAGE / ("shapes" if name == "scene_grounding" else "metrics") / "evaluate_modules" / f"{name}.py"
    for name in EVALUATE_MODULES
}


class CaptionScores(dict):
    """The corpus scores of [`evaluate_captions`] (a `dict` keyed like the COCO toolkit), with the metrics skipped.

    Attributes:
        skipped (`dict[str, str]`): every default metric that could not run here, with why (empty when all ran, and
            always empty for explicitly requested metrics, which raise instead).
    """

    def __init__(self, scores: Mapping[str, float], skipped: Mapping[str, str]):
        super().__init__(scores)
        self.skipped = dict(skipped)


def _unavailable_java_metrics(names: Sequence[str], requested: bool) -> dict[str, str]:
    """The Java metrics among `names` that cannot run here, with the error saying why; metrics `requested` by name
    raise that error instead."""
    unavailable = {}
    for name, check in (("meteor", lambda: check_java(8)), ("spice", check_spice)):
        if name in names:
            try:
                check()
            except RuntimeError as error:
                if requested:
                    raise
                unavailable[name] = str(error)
    if "spice" in unavailable and "spider" in names:
        unavailable["spider"] = "SPIDEr averages CIDEr-D and SPICE, and SPICE cannot run: " + unavailable["spice"]
    return unavailable


def resolve_metric_names(metrics: Sequence[str] | None) -> list[str]:
    """Canonical names of the metrics to run, in report order, with the metrics SPIDEr needs added.

    Args:
        metrics (`Sequence[str]`, *optional*): names from `AVAILABLE_METRICS` (any case; `"rouge"` and
            `"cider_d"` are accepted too); `None` means all of them.

    Returns:
        `list[str]`: canonical metric names.
    """
    if metrics is None:
        return list(AVAILABLE_METRICS)
    if isinstance(metrics, str):
        metrics = [metrics]
    requested = set()
    for name in metrics:
        canonical = _ALIASES.get(name.lower(), name.lower())
        if canonical not in AVAILABLE_METRICS:
            raise ValueError(f"Unknown metric {name!r}; choose among {list(AVAILABLE_METRICS)}.")
        requested.add(canonical)
        requested.update(_REQUIREMENTS.get(canonical, ()))
    if not requested:
        raise ValueError("metrics=[] selects no metric; pass None for all of them or a list of names.")
    return [name for name in AVAILABLE_METRICS if name in requested]


def tokenize_captions(
    predictions: Mapping[K, str], references: Mapping[K, Sequence[str]], tokenizer: str = "fast"
) -> tuple[dict[K, str], dict[K, list[str]]]:
    """Tokenize predictions and references together (one Java process for both with `tokenizer="ptb"`).

    Returns:
        `tuple[dict[K, str], dict[K, list[str]]]`: the predictions and references as space-joined tokens without
        punctuation, the form every metric scores.
    """
    # one corpus holding both sides, so that tokenizer="ptb" starts a single Java process
    corpus = {("prediction", key): [caption] for key, caption in predictions.items()}
    corpus.update({("references", key): list(references[key]) for key in predictions})
    tokenized = tokenize_corpus(corpus, tokenizer)
    tokenized_predictions = {key: tokenized[("prediction", key)][0] for key in predictions}
    tokenized_references = {key: tokenized[("references", key)] for key in predictions}
    return tokenized_predictions, tokenized_references


def evaluate_captions(
    predictions: Mapping[K, str],
    references: Mapping[K, Sequence[str]],
    metrics: Sequence[str] | None = None,
    tokenizer: str = "fast",
    per_caption: bool = False,
    document_frequencies: DocumentFrequencies | str | os.PathLike | None = None,
) -> dict[str, float] | tuple[dict[str, float], dict[str, dict[K, float]]]:
    """Score one caption per key against its references with the COCO caption metrics.

    Args:
        predictions (`Mapping[K, str]`): one raw (untokenized) caption per key, e.g. per image id.
        references (`Mapping[K, Sequence[str]]`): the raw reference captions of each key; same keys as
            `predictions`, at least one reference each.
        metrics (`Sequence[str]`, *optional*): which metrics to run, among `"bleu"`, `"meteor"`, `"rouge_l"`,
            `"cider"`, `"spice"`, `"spider"`; `None` runs all of them that can run here. METEOR and SPICE need Java
            (SPICE also the Stanford CoreNLP jars, see `rlcaption download-spice`): by default those that cannot run
            are skipped, with a warning saying why, and listed in the result's `skipped`; requested by name, they
            raise a `RuntimeError` saying what is missing.
        tokenizer (`str`, *optional*, defaults to `"fast"`): `"fast"` (pure Python) or `"ptb"` (the toolkit's Java
            PTBTokenizer).
        per_caption (`bool`, *optional*, defaults to `False`): also return every key's scores.
        document_frequencies (`DocumentFrequencies` or path, *optional*): CIDEr-D document frequencies from a
            training corpus, or the file they were saved to (`DocumentFrequencies.save`); `None` takes them from
            `references`, as the official evaluation does.

    Returns:
        [`CaptionScores`]: a `dict[str, float]` keyed like the COCO toolkit (`Bleu_1`..`Bleu_4`, `METEOR`, `ROUGE_L`,
        `CIDEr`, `SPICE`, `SPIDEr`; only those of the metrics run), whose `skipped` names the default metrics that
        could not run. With `per_caption=True`, a tuple `(corpus_scores, per_caption_scores)` where
        `per_caption_scores[metric_key][key]` is the score of `predictions[key]`.

    Raises:
        `ValueError`: when the keys of `predictions` and `references` differ or a key has no references (the
            message names the key), or for an unknown metric or tokenizer name.
        `RuntimeError`: when METEOR or SPICE (or SPIDEr) is requested by name but cannot run.

    Example:
    ```python
    >>> from rlcaption.metrics import evaluate_captions
    >>> scores = evaluate_captions(
    ...     {1: "A cat on a mat."}, {1: ["A cat is on the mat.", "A cat sitting on a mat."]}, metrics=["bleu", "cider"]
    ... )
    >>> sorted(scores)
    ['Bleu_1', 'Bleu_2', 'Bleu_3', 'Bleu_4', 'CIDEr']
    ```
    """
    names = resolve_metric_names(metrics)
    check_caption_corpus(predictions, references, "evaluate_captions")
    if isinstance(document_frequencies, (str, os.PathLike)):
        document_frequencies = DocumentFrequencies.load(document_frequencies)
    # decided before any work, rather than after minutes of scoring: requested metrics that cannot run raise, the
    # defaults that cannot run are skipped
    skipped = _unavailable_java_metrics(names, requested=metrics is not None)
    if skipped:
        reasons = "\n".join(f"  {name}: {reason}" for name, reason in skipped.items())
        logger.warning(f"Skipped {', '.join(skipped)}, which cannot run here:\n{reasons}")
        names = [name for name in names if name not in skipped]
    candidates, tokenized_references = tokenize_captions(predictions, references, tokenizer)

    corpus = CaptionScores({}, skipped)
    per_key: dict[str, dict[K, float]] = {}
    if "bleu" in names:
        bleu_corpus, bleu_per_key = compute_bleu(candidates, tokenized_references)
        for order, score in enumerate(bleu_corpus):
            corpus[f"Bleu_{order + 1}"] = float(score)
            per_key[f"Bleu_{order + 1}"] = {key: float(scores[order]) for key, scores in bleu_per_key.items()}
    if "meteor" in names:
        corpus["METEOR"], per_key["METEOR"] = compute_meteor(candidates, tokenized_references)
    if "rouge_l" in names:
        corpus["ROUGE_L"], per_key["ROUGE_L"] = compute_rouge_l(candidates, tokenized_references)
    if "cider" in names:
        corpus["CIDEr"], per_key["CIDEr"] = compute_cider_d(candidates, tokenized_references, document_frequencies)
    if "spice" in names:
        corpus["SPICE"], per_key["SPICE"] = compute_spice(candidates, tokenized_references)
    if "spider" in names:
        # only reached when SPICE really ran: compute_spice raises instead of returning a substitute
        corpus["SPIDEr"] = (corpus["CIDEr"] + corpus["SPICE"]) / 2
        per_key["SPIDEr"] = {key: (per_key["CIDEr"][key] + per_key["SPICE"][key]) / 2 for key in candidates}
    if per_caption:
        return corpus, per_key
    return corpus


def load_metric(name: str, **kwargs) -> evaluate.EvaluationModule:
    """Load one of the package's caption metrics as an `evaluate.EvaluationModule`, offline.

    `evaluate.load("bleu")` fetches its script from the Hub; these modules are files of the installed package, loaded
    by path, so they work without network and compose with `evaluate.combine` and `Trainer(compute_metrics=...)`.

    Args:
        name (`str`): one of `EVALUATE_MODULES` (`"rouge"` and `"cider"` are accepted too).
        kwargs: passed on to `evaluate.load` (e.g. `experiment_id`, `num_process`, `process_id`).

    Returns:
        `evaluate.EvaluationModule`: call `.compute(predictions=[...], references=[[...], ...])` on raw captions.

    Example:
    ```python
    >>> import evaluate
    >>> from rlcaption.metrics import load_metric
    >>> metrics = evaluate.combine([load_metric("bleu"), load_metric("cider_d")])
    >>> scores = metrics.compute(predictions=["a cat on a mat"], references=[["a cat on a mat", "a cat sits"]])
    ```
    """
    import evaluate

    module_name = _MODULE_ALIASES.get(name.lower(), name.lower())
    if module_name not in EVALUATE_MODULES:
        raise ValueError(f"Unknown caption metric {name!r}; choose among {list(EVALUATE_MODULES)}.")
    path = _MODULE_PATHS[module_name]
    if not path.is_file():
        raise FileNotFoundError(
            f"The metric module {path} is missing from the installed package; reinstall rlcaption "
            "(`pip install --force-reinstall rlcaption`)."
        )
    return evaluate.load(str(path), **kwargs)
