"""SPICE as computed by the COCO caption evaluation code, as an `evaluate` metric module.

Load it offline from the installed package with `rlcaption.metrics.load_metric("spice")` (or
`evaluate.load(<path of this file>)`); it composes with `evaluate.combine` and a `Trainer`'s `compute_metrics`.
Inputs are raw captions, tokenized like the COCO toolkit does (see `rlcaption.metrics.evaluate_captions`).
"""

import evaluate

from rlcaption.metrics import evaluate_module

_CITATION = """\
@inproceedings{anderson2016spice,
  title={SPICE: Semantic Propositional Image Caption Evaluation},
  author={Anderson, Peter and Fernando, Basura and Johnson, Mark and Gould, Stephen},
  booktitle={ECCV},
  year={2016}
}
"""

_DESCRIPTION = """\
Corpus SPICE of image captions exactly as the COCO caption evaluation code (pycocoevalcap 1.2) computes it, with
the SPICE jar that pycocoevalcap ships. Needs Java and the Stanford CoreNLP 3.6.0 jars (`rlcaption download-spice`
fetches them on a machine with internet); raises a RuntimeError saying what is missing otherwise, never returning
another number.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): one generated caption per image.
    references (`list[list[str]]`): the reference captions of each image (at least one each).
    tokenizer (`str`, defaults to `"fast"`): `"fast"` (pure Python) or `"ptb"` (the toolkit's Java PTBTokenizer).
Returns:
    `SPICE` (`float`): corpus score in [0, 1].
Examples:
    >>> metric = rlcaption.metrics.load_metric("spice")
    >>> metric.compute(predictions=["a cat on a mat"], references=[["a cat on a mat", "a cat sits on a mat"]])
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Spice(evaluate_module.CaptionMetricModule):
    metric_names = ("spice",)
    description = _DESCRIPTION
    citation = _CITATION
    inputs_description = _KWARGS_DESCRIPTION
