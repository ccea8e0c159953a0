"""METEOR 1.5 as computed by the COCO caption evaluation code, as an `evaluate` metric module.

Load it offline from the installed package with `rlcaption.metrics.load_metric("meteor")` (or
`evaluate.load(<path of this file>)`); it composes with `evaluate.combine` and a `Trainer`'s `compute_metrics`.
Inputs are raw captions, tokenized like the COCO toolkit does (see `rlcaption.metrics.evaluate_captions`).
"""

import evaluate

from rlcaption.metrics import evaluate_module

_CITATION = """\
@inproceedings{denkowski2014meteor,
  title={Meteor Universal: Language Specific Translation Evaluation for Any Target Language},
  author={Denkowski, Michael and Lavie, Alon},
  booktitle={Workshop on Statistical Machine Translation},
  year={2014}
}
"""

_DESCRIPTION = """\
Corpus METEOR 1.5 of image captions exactly as the COCO caption evaluation code (pycocoevalcap 1.2) computes it,
with the METEOR jar that pycocoevalcap ships, run by Java (one process kept alive across calls). Needs Java 8 or
newer and `pip install rlcaption[java]`; raises a RuntimeError saying what is missing otherwise.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): one generated caption per image.
    references (`list[list[str]]`): the reference captions of each image (at least one each).
    tokenizer (`str`, defaults to `"fast"`): `"fast"` (pure Python) or `"ptb"` (the toolkit's Java PTBTokenizer).
Returns:
    `METEOR` (`float`): corpus score in [0, 1].
Examples:
    >>> metric = rlcaption.metrics.load_metric("meteor")
    >>> metric.compute(predictions=["a cat on a mat"], references=[["a cat on a mat", "a cat sits on a mat"]])
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Meteor(evaluate_module.CaptionMetricModule):
    metric_names = ("meteor",)
    description = _DESCRIPTION
    citation = _CITATION
    inputs_description = _KWARGS_DESCRIPTION
