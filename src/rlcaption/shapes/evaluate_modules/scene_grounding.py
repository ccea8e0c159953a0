"""Scene grounding of captions of the embedded shapes dataset, as an `evaluate` metric module.

Load it offline from the installed package with `rlcaption.metrics.load_metric("scene_grounding")` (or
`evaluate.load(<path of this file>)`). Unlike the COCO metrics it scores captions against each image's `scene` (the
objects it shows), not against reference captions; see `rlcaption.shapes.scene_grounding`.
"""

from collections.abc import Mapping

import datasets
import evaluate

from rlcaption.shapes import grounding
from rlcaption.shapes.dataset import SceneObject

_DESCRIPTION = """\
How true captions of the shapes dataset (`rlcaption.data.load_shapes`) are to their images: each caption is parsed
with the dataset's own vocabulary and grammar, and the objects (colour, shape), sizes, spatial relation, location and
count it states are checked against the image's scene. Object precision / recall / F1 use multiset matching of the
mentioned (colour, shape) pairs against the scene objects, pooled over the corpus; captions the grammar cannot parse
state nothing and are counted in `parse_failure_share`.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): one generated caption per image.
    scenes (`list[list[dict]]`): the `scene` of each image, as in the `scene` column of `rlcaption.data.load_shapes`
        (objects with `shape`, `color`, `size`, `row`, `column`; the jitter `x`, `y` is optional and unused).
Returns:
    `object_precision`, `object_recall`, `object_f1`, `color_*`, `shape_*`, `size_accuracy`, `relation_accuracy`,
    `location_accuracy`, `count_accuracy`, `generic_share`, `parse_failure_share` (`float`, `nan` where there is
    nothing to count), `num_captions` and the `num_*_checked` supports of the accuracies.
Examples:
    >>> metric = rlcaption.metrics.load_metric("scene_grounding")
    >>> shapes = rlcaption.data.load_shapes(num_train=10, num_validation=10, num_test=10)
    >>> metric.compute(predictions=["a red circle"] * 10, scenes=shapes["test"]["scene"])
"""

# The fields a scene object is scored on; `add_batch` drops the others (the jitter `x`, `y` of the dataset's rows),
# since `evaluate` only takes objects whose keys are exactly those of its features.
_SCENE_OBJECT_FIELDS = ("shape", "color", "size", "row", "column")
_SCENE_OBJECT = {
    "shape": datasets.Value("string"),
    "color": datasets.Value("string"),
    "size": datasets.Value("string"),
    "row": datasets.Value("int8"),
    "column": datasets.Value("int8"),
}


def _scored_fields(obj):
    """`obj` as a dict of exactly the scored fields (`None` for a missing one: `scene_grounding` then names it)."""
    if isinstance(obj, Mapping):
        return {name: obj.get(name) for name in _SCENE_OBJECT_FIELDS}
    if isinstance(obj, SceneObject):
        return {name: getattr(obj, name) for name in _SCENE_OBJECT_FIELDS}
    return obj


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SceneGrounding(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "scenes": datasets.List(_SCENE_OBJECT)}
            ),
        )

    def add_batch(self, *, predictions=None, scenes=None, **kwargs):
        """Add a batch of captions and their scenes (objects may carry fields beyond the scored ones)."""
        if scenes is not None:
            scenes = [
                [_scored_fields(obj) for obj in scene] if isinstance(scene, list | tuple) else scene
                for scene in scenes
            ]
        super().add_batch(predictions=predictions, scenes=scenes, **kwargs)

    def _compute(self, predictions, scenes):
        return grounding.scene_grounding(list(predictions), list(scenes))
