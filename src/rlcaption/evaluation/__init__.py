"""
Evaluating a captioner on a dataset split, the one way the trainer, the recipes, the command line and the benchmarks
do it: caption every image ([`caption_dataset`]), score the captions ([`evaluate_model`]: consensus metrics,
grounding, diversity, an evaluator CLIP), score several captions per image as a set ([`caption_set_scores`]), and a
speaker-listener's listener recall ([`listener_recall`]).
"""

from .caption_sets import (
    CAPTION_SET_DECODINGS,
    caption_set_batches,
    caption_set_generation_config,
    caption_set_prefix,
    caption_set_scores,
    caption_sets,
)
from .captions import caption_batches, caption_dataset, check_image_ids, with_image_ids
from .listener import listener_recall
from .scores import clip_scores, diversity_scores, evaluate_model, scene_grounding_scores

__all__ = [
    "CAPTION_SET_DECODINGS",
    "caption_batches",
    "caption_dataset",
    "caption_set_batches",
    "caption_set_generation_config",
    "caption_set_prefix",
    "caption_set_scores",
    "caption_sets",
    "check_image_ids",
    "clip_scores",
    "diversity_scores",
    "evaluate_model",
    "listener_recall",
    "scene_grounding_scores",
    "with_image_ids",
]
