"""CIDEr-D as computed by the COCO caption evaluation code, as an `evaluate` metric module.

Load it offline from the installed package with `rlcaption.metrics.load_metric("cider_d")` (or
`evaluate.load(<path of this file>)`); it composes with `evaluate.combine` and a `Trainer`'s `compute_metrics`.
Inputs are raw captions, tokenized like the COCO toolkit does (see `rlcaption.metrics.evaluate_captions`).
"""

import evaluate

from rlcaption.metrics import evaluate_module

_CITATION = """\
@inproceedings{vedantam2015cider,
  title={CIDEr: Consensus-based Image Description Evaluation},
  author={Vedantam, Ramakrishna and Zitnick, C. Lawrence and Parikh, Devi},
  booktitle={CVPR},
  year={2015}
}
"""

_DESCRIPTION = """\
Corpus CIDEr-D of image captions exactly as the COCO caption evaluation code (pycocoevalcap 1.2) computes it:
TF-IDF weighted n-grams (n = 1..4), clipping, a Gaussian length penalty (sigma 6), times 10. Document frequencies
come from the evaluated references unless training-corpus ones are given.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): one generated caption per image.
    references (`list[list[str]]`): the reference captions of each image (at least one each).
    tokenizer (`str`, defaults to `"fast"`): `"fast"` (pure Python) or `"ptb"` (the toolkit's Java PTBTokenizer).
    document_frequencies (`DocumentFrequencies` or path, *optional*): CIDEr-D document frequencies of a training
        corpus (`rlcaption.metrics.DocumentFrequencies`, or a file saved with its `save`); by default those of the
        evaluated references, as in the official evaluation.
Returns:
    `CIDEr` (`float`): corpus score (0 to 10, typically below 2).
Examples:
    >>> metric = rlcaption.metrics.load_metric("cider_d")
    >>> metric.compute(predictions=["a cat on a mat"], references=[["a cat on a mat", "a cat sits on a mat"]])
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CiderD(evaluate_module.CaptionMetricModule):
    metric_names = ("cider",)
    description = _DESCRIPTION
    citation = _CITATION
    inputs_description = _KWARGS_DESCRIPTION
