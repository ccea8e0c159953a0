"""
Decoding and scoring captions with any captioner: [`generate_captions`] and [`sample_token_log_probs`] (the one place
objectives, evaluation and scripts decode and score), the adapters that say what differs between captioner families
([`captioner_for`]: ours, VisionEncoderDecoder, BLIP, GIT, and the prompted
families of [`rlcaption.generation.prompted_captioners`]: Florence-2, BLIP-2, PaliGemma, SmolVLM/Idefics3,
Qwen2-VL/2.5-VL, LLaVA), and the decoding loops with their CUDA graphs.
"""

from .captioners import Captioner, captioner_for, forward_through
from .decoding import (
    IMAGE_INPUT_NAMES,
    GeneratedCaptions,
    caption_logits,
    caption_token_mask,
    evaluation_mode,
    generate_caption_sets,
    generate_captions,
    image_inputs_of,
    repeat_image_inputs,
    sample_token_log_probs,
    sample_token_log_probs_and_entropies,
    selective_log_softmax,
    token_log_probs,
)

# registers the prompted families with `captioner_for`
from .prompted_captioners import PromptedCaptioner

__all__ = [
    "IMAGE_INPUT_NAMES",
    "Captioner",
    "GeneratedCaptions",
    "PromptedCaptioner",
    "caption_logits",
    "caption_token_mask",
    "captioner_for",
    "evaluation_mode",
    "forward_through",
    "generate_caption_sets",
    "generate_captions",
    "image_inputs_of",
    "repeat_image_inputs",
    "sample_token_log_probs",
    "sample_token_log_probs_and_entropies",
    "selective_log_softmax",
    "token_log_probs",
]
