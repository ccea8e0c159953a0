"""
Run by test_peft.py in a process of its own: SCST with LoRA adapters on a tiny BLIP and a KL penalty, a checkpoint
every step, optionally killed with SIGKILL at the end of a step; a later run resumes from the newest complete
checkpoint.
"""

import sys

from kill_at_step import KillAtStep
from tiny_training import IMAGE_SIZE, two_process_shapes

from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer, last_complete_checkpoint
from tiny_captioners import make_foreign_captioner

MAX_STEPS = 4


def lora_trainer(output_dir: str, cache_dir: str) -> RLCaptionTrainer:
    shapes, _ = two_process_shapes(cache_dir)
    captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
    model, processor = make_foreign_captioner("blip", captions, IMAGE_SIZE)
    args = RLCaptionConfig(
        output_dir=output_dir, use_cpu=True, objective="scst", per_device_train_batch_size=4, max_steps=MAX_STEPS,
        learning_rate=5e-2, save_strategy="steps", save_steps=1, logging_steps=1, disable_tqdm=True,
        max_caption_length=8, num_samples_per_image=2, seed=0, log_completions=False, use_peft=True, lora_r=4,
        lora_dropout=0.1, beta=0.1,
    )  # fmt: skip
    return RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=shapes["train"])


def main(output_dir: str, cache_dir: str, kill_at_step: int) -> None:
    trainer = lora_trainer(output_dir, cache_dir)
    trainer.add_callback(KillAtStep(kill_at_step))
    resume = last_complete_checkpoint(output_dir) is not None
    trainer.train(resume_from_checkpoint=True if resume else None)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
