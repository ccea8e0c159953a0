"""Run by test_two_processes.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU)."""

import json
import sys
from pathlib import Path

import torch
from tiny_training import leave_process_group, make_tiny_model, two_process_shapes

from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer


def main(output_dir: str, cache_dir: str) -> None:
    shapes, processor = two_process_shapes(cache_dir, num_validation=6)
    model = make_tiny_model(processor, seed=0)
    initial = torch.cat([parameter.detach().flatten() for parameter in model.parameters()]).clone()
    args = RLCaptionConfig(
        output_dir=output_dir,
        use_cpu=True,
        objective="scst",
        per_device_train_batch_size=2,
        per_device_eval_batch_size=4,
        max_steps=2,
        learning_rate=1e-2,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        num_samples_per_image=2,
        max_caption_length=10,
    )
    trainer = RLCaptionTrainer(
        model=model,
        args=args,
        processing_class=processor,
        train_dataset=shapes["train"],
        eval_dataset=shapes["validation"],
    )
    trainer.train()
    metrics = trainer.evaluate()
    final = torch.cat([parameter.detach().flatten() for parameter in model.parameters()])
    report = {
        "world_size": trainer.accelerator.num_processes,
        "backend": str(torch.distributed.get_backend()) if torch.distributed.is_initialized() else None,
        "parameter_sum": float(final.double().sum()),
        "changed": bool(not torch.equal(initial, final)),
        "eval_num_images": metrics["eval_num_images"],
        "eval_CIDEr": metrics["eval_CIDEr"],
    }
    rank = trainer.accelerator.process_index
    Path(output_dir, f"rank{rank}.json").write_text(json.dumps(report))
    leave_process_group(trainer)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
