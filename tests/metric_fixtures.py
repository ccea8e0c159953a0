"""Shared inputs of the metric and reward tests: the COCO toolkit's example and the Java check."""

import json
from collections import defaultdict
from pathlib import Path

from rlcaption.metrics.java import check_java

FAKECAP = Path(__file__).parent / "fixtures" / "fakecap"


def load_fakecap() -> tuple[dict[int, str], dict[int, list[str]]]:
    """The toolkit's example (`tests/fixtures/fakecap/`), raw captions: `(predictions, references)` keyed by image
    id, predictions in the results file's order."""
    ground_truth = json.loads((FAKECAP / "captions_val2014_fakecap_gt_subset.json").read_text())
    results = json.loads((FAKECAP / "captions_val2014_fakecap_results.json").read_text())
    references = defaultdict(list)
    for annotation in ground_truth["annotations"]:
        references[annotation["image_id"]].append(annotation["caption"])
    return {entry["image_id"]: entry["caption"] for entry in results}, dict(references)


def java_problem() -> str | None:
    """Why Java-backed metrics cannot run here, or None when Java >= 8 is available."""
    try:
        check_java(8)
    except RuntimeError as error:
        return str(error)
    return None
