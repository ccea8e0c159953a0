"""
`gradient_checkpointing` and `bf16` in RL steps of transformers captioners: the pass that scores the samples (in
evaluation mode, with gradients) is checkpointed too, and gives the gradients of the pass without checkpointing.
"""

import pytest
import torch
import transformers.modeling_utils
from tiny_training import IMAGE_SIZE

from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import make_foreign_captioner

KINDS = ("vit_gpt2", "blip", "git")


@pytest.fixture(scope="module")
def train_captions(tiny_shapes):
    return [caption for captions in tiny_shapes["train"]["captions"] for caption in captions]


def one_scst_step(kind, train_captions, shapes, output_dir, use_peft=False, **overrides):
    model, processor = make_foreign_captioner(kind, train_captions, IMAGE_SIZE)
    args = RLCaptionConfig(
        output_dir=str(output_dir), use_cpu=True, objective="scst", per_device_train_batch_size=4, max_steps=1,
        learning_rate=1e-2, save_strategy="no", logging_steps=1, disable_tqdm=True, max_caption_length=8,
        num_samples_per_image=2, seed=0, log_completions=False, use_peft=use_peft, lora_r=4, **overrides,
    )  # fmt: skip
    trainer = RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=shapes["train"])
    trainer.train()
    return trainer


@pytest.mark.parametrize("use_peft", [False, True], ids=["whole", "lora"])
@pytest.mark.parametrize("kind", KINDS)
def test_gradient_checkpointing_covers_the_scoring_pass(
    kind, use_peft, tiny_shapes, train_captions, tmp_path, monkeypatch
):
    checkpointed = []
    checkpoint = transformers.modeling_utils.checkpoint

    def counting_checkpoint(function, *args, **kwargs):
        checkpointed.append(torch.is_grad_enabled())
        return checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "checkpoint", counting_checkpoint)
    plain = one_scst_step(kind, train_captions, tiny_shapes, tmp_path / "plain", use_peft)
    assert not checkpointed
    with_checkpoints = one_scst_step(
        kind, train_captions, tiny_shapes, tmp_path / "checkpointed", use_peft, gradient_checkpointing=True
    )
    # an SCST step runs the model with gradients only in the scoring pass, in evaluation mode: it was checkpointed
    assert checkpointed and all(checkpointed)
    for (name, actual), (_, expected) in zip(
        with_checkpoints.model.named_parameters(), plain.model.named_parameters(), strict=True
    ):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6, msg=name)
    # the layers are back in the model's mode, with the model's checkpoint function
    layers = [module for module in with_checkpoints.model.modules() if getattr(module, "gradient_checkpointing", 0)]
    assert layers and all(layer._gradient_checkpointing_func.func is counting_checkpoint for layer in layers)


def _cpu_has_bf16() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4)).sum().item()
    except RuntimeError:
        return False
    return True


@pytest.mark.skipif(not _cpu_has_bf16(), reason="this CPU's torch runs no bfloat16 autocast")
@pytest.mark.parametrize("kind", KINDS)
def test_a_bf16_scst_step_with_checkpointing_trains(kind, tiny_shapes, train_captions, tmp_path):
    model, _ = make_foreign_captioner(kind, train_captions, IMAGE_SIZE)
    trainer = one_scst_step(kind, train_captions, tiny_shapes, tmp_path, bf16=True, gradient_checkpointing=True)
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    assert torch.isfinite(torch.tensor(logged["loss"]))
    changed = [
        name
        for (name, after), (_, before) in zip(trainer.model.named_parameters(), model.named_parameters(), strict=True)
        if not torch.equal(after, before)
    ]
    assert changed
