import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from rlcaption.objectives.xe import XEObjective, label_smoothed_cross_entropy
from rlcaption.processing import CaptionProcessor
from tiny_captioners import make_show_tell

PAD, BOS, EOS, WORD = 0, 1, 2, 3
IMAGE_SIZE = 32  # divisible by the 16x reduction of the tiny CNN

# Two captions, "<bos> word <eos>" and "<bos> <eos> <pad>": three scored targets (word, eos, eos), one ignored.
TARGETS = torch.tensor([[WORD, EOS], [EOS, -100]])


def fixed_logits(dtype: torch.dtype) -> torch.Tensor:
    """Scores every position alike: `<pad>` and `<bos>` at the dtype's minimum (as ShowTellRL), `<eos>` 0, word 1."""
    lowest = torch.finfo(dtype).min
    return torch.tensor([lowest, lowest, 0.0, 1.0], dtype=dtype).expand(*TARGETS.shape, 4)


def xe_loss(model, inputs, smoothing: float):
    recorded = {}
    trainer = SimpleNamespace(
        args=SimpleNamespace(label_smoothing_factor=smoothing), record_metric=recorded.__setitem__
    )
    return XEObjective(trainer).compute_loss(model, inputs), recorded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
def test_label_smoothing_spreads_over_the_tokens_the_model_can_predict(dtype, smoothing):
    # p(eos) = 1 / (1 + e), p(word) = e / (1 + e); <pad> and <bos> have probability 0 and get no smoothing mass
    log_p_eos, log_p_word = -math.log(1 + math.e), 1 - math.log(1 + math.e)
    nll = -(log_p_word + 2 * log_p_eos) / 3  # targets: word, eos, eos
    uniform = -(log_p_eos + log_p_word) / 2  # cross-entropy of the uniform distribution over {eos, word}
    loss = label_smoothed_cross_entropy(fixed_logits(dtype), TARGETS, smoothing)
    assert loss.dtype == torch.float32 and math.isfinite(loss.item())
    assert loss.item() == pytest.approx((1 - smoothing) * nll + smoothing * uniform, rel=1e-6)


def test_show_tell_rl_loss_with_and_without_label_smoothing():
    captions = ["a red circle", "two blue squares on the left"]
    processor = CaptionProcessor.from_captions(captions, image_size=IMAGE_SIZE)
    model = make_show_tell(processor, IMAGE_SIZE)
    batch = processor(images=[torch.rand(3, IMAGE_SIZE, IMAGE_SIZE) for _ in captions], text=captions)
    inputs = {
        "pixel_values": batch["pixel_values"],
        "caption_input_ids": batch["input_ids"],
        "caption_attention_mask": batch["attention_mask"],
        "caption_image_index": torch.arange(len(captions)),
    }
    with torch.no_grad():
        logits = model(pixel_values=batch["pixel_values"], input_ids=batch["input_ids"]).logits[:, :-1]
    targets = batch["input_ids"][:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, -100).reshape(-1)
    logits = logits.reshape(targets.numel(), -1)

    plain, _ = xe_loss(model, inputs, 0.0)
    torch.testing.assert_close(plain, F.cross_entropy(logits, targets))

    smoothed, _ = xe_loss(model, inputs, 0.1)
    assert math.isfinite(smoothed.item())
    # equal to PyTorch's label smoothing over the vocabulary without the two tokens ShowTellRL never predicts
    predictable = torch.arange(2, logits.size(-1))
    kept_targets = targets.where(targets == -100, targets - 2)
    torch.testing.assert_close(smoothed, F.cross_entropy(logits[:, predictable], kept_targets, label_smoothing=0.1))
    smoothed.backward()
    assert all(torch.isfinite(parameter.grad).all() for parameter in model.parameters() if parameter.grad is not None)
