"""
The Hub: checking model names before loading ([`check_pretrained_reference`]), model cards with `model-index`
results ([`render_model_card`]) and their templates, and publishing a saved model folder ([`publish_folder`]).
"""

from .cards import (
    MODEL_CARD_TEMPLATE,
    OBJECTIVE_CITATIONS,
    TEMPLATES,
    caption_eval_results,
    objective_citation,
    parameter_count,
    render_model_card,
)
from .provenance import code_version, run_command, training_run
from .publishing import publish_folder
from .references import (
    HUB_CONNECTION_ERRORS,
    HUB_PROBE_TIMEOUT,
    check_pretrained_reference,
    hub_unreachable_reason,
    model_loading_kwargs,
)

__all__ = [
    "HUB_CONNECTION_ERRORS",
    "HUB_PROBE_TIMEOUT",
    "MODEL_CARD_TEMPLATE",
    "OBJECTIVE_CITATIONS",
    "TEMPLATES",
    "caption_eval_results",
    "check_pretrained_reference",
    "code_version",
    "hub_unreachable_reason",
    "model_loading_kwargs",
    "objective_citation",
    "parameter_count",
    "publish_folder",
    "render_model_card",
    "run_command",
    "training_run",
]
