"""SPIDEr = (CIDEr-D + SPICE) / 2 as computed by the COCO caption evaluation code, as an `evaluate` metric module.

Load it offline from the installed package with `rlcaption.metrics.load_metric("spider")` (or
`evaluate.load(<path of this file>)`); it composes with `evaluate.combine` and a `Trainer`'s `compute_metrics`.
Inputs are raw captions, tokenized like the COCO toolkit does (see `rlcaption.metrics.evaluate_captions`).
"""

import evaluate

from rlcaption.metrics import evaluate_module

_CITATION = """\
@inproceedings{liu2017improved,
  title={Improved Image Captioning via Policy Gradient Optimization of SPIDEr},
  author={Liu, Siqi and Zhu, Zhenhai and Ye, Ning and Guadarrama, Sergio and Murphy, Kevin},
  booktitle={ICCV},
  year={2017}
}
"""

_DESCRIPTION = """\
SPIDEr (Liu et al. 2017), the mean of CIDEr-D and SPICE, both exactly as the COCO caption evaluation code
computes them. SPICE needs Java and the Stanford CoreNLP 3.6.0 jars; where it cannot run this raises a
RuntimeError instead of returning another number under SPIDEr's name.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): one generated caption per image.
    references (`list[list[str]]`): the reference captions of each image (at least one each).
    tokenizer (`str`, defaults to `"fast"`): `"fast"` (pure Python) or `"ptb"` (the toolkit's Java PTBTokenizer).
Returns:
    `SPIDEr`, `CIDEr`, `SPICE` (`float`): corpus scores.
Examples:
    >>> metric = rlcaption.metrics.load_metric("spider")
    >>> metric.compute(predictions=["a cat on a mat"], references=[["a cat on a mat", "a cat sits on a mat"]])
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Spider(evaluate_module.CaptionMetricModule):
    metric_names = ("spider",)
    description = _DESCRIPTION
    citation = _CITATION
    inputs_description = _KWARGS_DESCRIPTION
