"""Caption metrics computed exactly as the COCO caption evaluation code does, fast.

`evaluate_captions` is the entry point for corpus evaluation (its `CaptionScores` also say which default metrics
could not run here); every metric is also a plain function on tokenized captions (`compute_bleu`, `compute_rouge_l`,
`compute_cider_d`, `compute_meteor`, `compute_spice`) returning the corpus score and the per-image scores, and an
`evaluate` module (`load_metric`). Diversity (`div_n`, `mbleu`,
`self_bleu`, ...) and retrieval recall (`retrieval_recall`) sit beside them. The scene grounding of
shapes captions is the shapes benchmark's (`rlcaption.shapes.scene_grounding`).
The CLIP metrics (`clip_score`, `clip_retrieval`: CLIP-S and retrieval with any CLIP) import torch and transformers
only when they are called.
"""

from .bleu import compute_bleu, corpus_bleu_statistics
from .cider import CiderD, DocumentFrequencies, compute_cider_d
from .clip import CLIP_S_WEIGHT, clip_retrieval, clip_s, clip_score, embed_images, embed_texts, load_clip
from .corpus import (
    AVAILABLE_METRICS,
    EVALUATE_MODULES,
    CaptionScores,
    evaluate_captions,
    load_metric,
    tokenize_captions,
)
from .diversity import copy_rate, div_n, mbleu, self_bleu, set_diversity, vocabulary_size
from .java import check_java, find_java, pycocoevalcap_dir
from .meteor import MeteorScorer, compute_meteor
from .retrieval import retrieval_recall
from .rouge import compute_rouge_l
from .spice import check_spice, compute_spice, download_spice
from .tokenization import PUNCTUATIONS, normalize_caption, tokenize_caption, tokenize_corpus

__all__ = [
    "AVAILABLE_METRICS",
    "CLIP_S_WEIGHT",
    "EVALUATE_MODULES",
    "PUNCTUATIONS",
    "CaptionScores",
    "CiderD",
    "DocumentFrequencies",
    "MeteorScorer",
    "check_java",
    "check_spice",
    "clip_retrieval",
    "clip_s",
    "clip_score",
    "compute_bleu",
    "compute_cider_d",
    "compute_meteor",
    "compute_rouge_l",
    "compute_spice",
    "copy_rate",
    "corpus_bleu_statistics",
    "div_n",
    "download_spice",
    "embed_images",
    "embed_texts",
    "evaluate_captions",
    "find_java",
    "load_clip",
    "load_metric",
    "mbleu",
    "normalize_caption",
    "pycocoevalcap_dir",
    "retrieval_recall",
    "self_bleu",
    "set_diversity",
    "tokenize_caption",
    "tokenize_captions",
    "tokenize_corpus",
    "vocabulary_size",
]
