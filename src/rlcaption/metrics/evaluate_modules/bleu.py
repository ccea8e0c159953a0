"""BLEU-1..4 as computed by the COCO caption evaluation code, as an `evaluate` metric module.

Load it offline from the installed package with `rlcaption.metrics.load_metric("bleu")` (or
`evaluate.load(<path of this file>)`); it composes with `evaluate.combine` and a `Trainer`'s `compute_metrics`.
Inputs are raw captions, tokenized like the COCO toolkit does (see `rlcaption.metrics.evaluate_captions`).
"""

import evaluate

from rlcaption.metrics import evaluate_module

_CITATION = """\
@inproceedings{papineni2002bleu,
  title={BLEU: a Method for Automatic Evaluation of Machine Translation},
  author={Papineni, Kishore and Roukos, Salim and Ward, Todd and Zhu, Wei-Jing},
  booktitle={ACL},
  year={2002}
}
"""

_DESCRIPTION = """\
Corpus BLEU-1..4 of image captions exactly as the COCO caption evaluation code (pycocoevalcap 1.2) computes
it: PTB tokenization with punctuation removed, clipped n-gram counts, the closest reference length and one
corpus-level brevity penalty.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): one generated caption per image.
    references (`list[list[str]]`): the reference captions of each image (at least one each).
    tokenizer (`str`, defaults to `"fast"`): `"fast"` (pure Python) or `"ptb"` (the toolkit's Java PTBTokenizer).
Returns:
    `Bleu_1`, `Bleu_2`, `Bleu_3`, `Bleu_4` (`float`): corpus scores in [0, 1].
Examples:
    >>> metric = rlcaption.metrics.load_metric("bleu")
    >>> metric.compute(predictions=["a cat on a mat"], references=[["a cat on a mat", "a cat sits on a mat"]])
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Bleu(evaluate_module.CaptionMetricModule):
    metric_names = ("bleu",)
    description = _DESCRIPTION
    citation = _CITATION
    inputs_description = _KWARGS_DESCRIPTION
