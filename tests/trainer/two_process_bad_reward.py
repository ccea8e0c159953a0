"""Run by test_two_processes.py: SCST on two processes where, on process 1 only, a reward is NaN for one caption
(`reward`) or the loss is NaN (`loss`)."""

import math
import sys

from accelerate import PartialState
from tiny_training import make_tiny_model, two_process_shapes

from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer


def length(completions, **columns):
    return [float(len(caption.split())) for caption in completions]


def length_unless_on_process_1(completions, **columns):
    lengths = length(completions)
    return [math.nan, *lengths[1:]] if PartialState().process_index == 1 else lengths


def main(output_dir: str, cache_dir: str, what_goes_bad: str) -> None:
    shapes, processor = two_process_shapes(cache_dir)
    args = RLCaptionConfig(
        output_dir=output_dir, use_cpu=True, objective="scst", per_device_train_batch_size=2, max_steps=2,
        save_strategy="no", logging_steps=1, disable_tqdm=True, num_samples_per_image=2, max_caption_length=6,
        report_to="none", ddp_timeout=600,
    )  # fmt: skip
    trainer = RLCaptionTrainer(
        model=make_tiny_model(processor), args=args, processing_class=processor, train_dataset=shapes["train"],
        reward_funcs=[length_unless_on_process_1 if what_goes_bad == "reward" else length],
    )  # fmt: skip
    if what_goes_bad == "loss" and PartialState().process_index == 1:
        scst_loss = trainer.objective.compute_loss
        trainer.objective.compute_loss = lambda model, inputs: scst_loss(model, inputs) * math.nan
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:])
