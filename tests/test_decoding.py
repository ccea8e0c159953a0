"""Decoding helpers work for our models and for transformers captioners we did not write."""

import pytest
import torch

from rlcaption.decoding import caption_logits, caption_token_mask, generate_captions, token_log_probs
from rlcaption.processing import CaptionProcessor
from tiny_captioners import make_show_tell, make_vision_encoder_decoder

IMAGE_SIZE = 32
CAPTIONS = ["a red circle", "a blue square left of a green star", "two shapes on a white background"]


@pytest.fixture(scope="module")
def processor():
    return CaptionProcessor.from_captions(CAPTIONS, image_size=IMAGE_SIZE)


@pytest.fixture(scope="module")
def show_tell(processor):
    return make_show_tell(processor, IMAGE_SIZE).eval()


def images(batch_size: int) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)


def test_image_index_encodes_each_image_once_with_the_same_result(show_tell, processor):
    pixel_values = images(2)
    encoded = processor(text=CAPTIONS + CAPTIONS[:1], return_tensors="pt")
    image_index = torch.tensor([0, 0, 1, 1])
    shared = caption_logits(
        show_tell, {"pixel_values": pixel_values}, encoded["input_ids"], encoded["attention_mask"], image_index
    )
    repeated = caption_logits(
        show_tell, {"pixel_values": pixel_values[image_index]}, encoded["input_ids"], encoded["attention_mask"]
    )
    torch.testing.assert_close(shared, repeated)


@pytest.mark.parametrize("model_kind", ["show_tell", "vision_encoder_decoder"])
def test_log_probs_of_generated_captions_match_generation_scores(model_kind, show_tell, processor):
    model = show_tell if model_kind == "show_tell" else make_vision_encoder_decoder(processor, IMAGE_SIZE).eval()
    eos = processor.tokenizer.eos_token_id
    pixel_values = images(3)
    generated = generate_captions(
        model, processor, {"pixel_values": pixel_values}, do_sample=False, num_beams=1, max_length=8,
        output_scores=True, return_dict_in_generate=True,
    )  # fmt: skip
    assert generated.sequences[:, 0].eq(processor.tokenizer.bos_token_id).all()
    assert len(generated.texts) == 3
    log_probs = token_log_probs(model, {"pixel_values": pixel_values}, generated.sequences)
    mask = caption_token_mask(generated.sequences, eos)
    # greedy decoding picks the argmax token: its log-probability is the max of the step's distribution
    logits = caption_logits(model, {"pixel_values": pixel_values}, generated.sequences)
    best = torch.log_softmax(logits.float(), dim=-1).max(dim=-1).values
    torch.testing.assert_close(log_probs * mask, best * mask, rtol=1e-5, atol=1e-5)
