"""The base class of the package's `evaluate` metric modules (`rlcaption/metrics/evaluate_modules/`).

Each module file subclasses [`CaptionMetricModule`] with its metric names and texts; this class turns `evaluate`'s
`compute(predictions=..., references=...)` into one [`evaluate_captions`] call. Module files must import this module,
not the class: `evaluate` takes the first `EvaluationModule` subclass it finds in a module file as its metric.
"""

from __future__ import annotations

import datasets
import evaluate

from .corpus import evaluate_captions

__all__ = ["CaptionMetricModule"]

_COCO_CAPTION_URL = "https://github.com/tylin/coco-caption"


class CaptionMetricModule(evaluate.Metric):
    """
    An `evaluate.Metric` computing `metric_names` with [`evaluate_captions`] on raw captions: `predictions` is one
    caption per image, `references` the list of reference captions of each image.
    """

    metric_names: tuple[str, ...] = ()
    description: str = ""
    citation: str = ""
    inputs_description: str = ""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=self.description,
            citation=self.citation,
            inputs_description=self.inputs_description,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
            reference_urls=[_COCO_CAPTION_URL],
        )

    def _compute(self, predictions, references, tokenizer="fast", document_frequencies=None):
        return evaluate_captions(
            dict(enumerate(predictions)),
            dict(enumerate(references)),
            metrics=list(self.metric_names),
            tokenizer=tokenizer,
            document_frequencies=document_frequencies,
        )
