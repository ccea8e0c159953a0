"""Run by test_two_processes.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU): metrics that
objectives record differ by process, and the training logs must carry their mean over processes."""

import json
import math
import sys
from pathlib import Path

import torch
from tiny_training import leave_process_group, make_tiny_model, two_process_shapes

from rlcaption.objectives import XEObjective, register_objective
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer


@register_objective
class RankRecordingObjective(XEObjective):
    """XE that records its process index at every step, on process 1 only a second metric, twice per step, a metric
    undefined (NaN) on process 0, and one undefined everywhere."""

    name = "test_rank_recording"

    def compute_loss(self, model, inputs):
        process_index = self.trainer.accelerator.process_index
        self.trainer.record_metric("process_index", float(process_index))
        if process_index == 1:
            self.trainer.record_metric("only_on_process_1", 3.0)
            self.trainer.record_metric("only_on_process_1", 5.0)
        self.trainer.record_metric("undefined_on_process_0", torch.tensor(6.0 if process_index == 1 else math.nan))
        self.trainer.record_metric("undefined_everywhere", math.nan)
        return super().compute_loss(model, inputs)


def main(output_dir: str, cache_dir: str) -> None:
    shapes, processor = two_process_shapes(cache_dir)
    args = RLCaptionConfig(
        output_dir=output_dir, use_cpu=True, objective="test_rank_recording", per_device_train_batch_size=2,
        per_device_eval_batch_size=2, max_steps=2, save_strategy="no", logging_steps=1, disable_tqdm=True,
        eval_strategy="steps", eval_steps=1, eval_num_beams=1, max_caption_length=6,
    )  # fmt: skip
    trainer = RLCaptionTrainer(
        model=make_tiny_model(processor, seed=0), args=args, processing_class=processor,
        train_dataset=shapes["train"], eval_dataset=shapes["validation"],
    )  # fmt: skip
    trainer.train()
    history = trainer.state.log_history
    report = {
        "world_size": trainer.accelerator.num_processes,
        "process_index": [entry["process_index"] for entry in history if "process_index" in entry],
        "only_on_process_1": [entry["only_on_process_1"] for entry in history if "only_on_process_1" in entry],
        "undefined_on_process_0": [
            entry["undefined_on_process_0"] for entry in history if "undefined_on_process_0" in entry
        ],
        "undefined_everywhere_logged": any("undefined_everywhere" in entry for entry in history),
        "eval_logs": sum("eval_CIDEr" in entry for entry in history),
    }
    Path(output_dir, f"rank{trainer.accelerator.process_index}.json").write_text(json.dumps(report))
    leave_process_group(trainer)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
