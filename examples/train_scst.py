"""
Self-critical sequence training (SCST, Rennie et al. 2017) from an XE checkpoint, CIDEr-D reward by default.

    accelerate launch examples/train_scst.py --model_name_or_path runs/xe --output_dir runs/scst \
        --num_train_epochs 3 --learning_rate 2e-4

Rewards are any weighted mix of built-ins (`--reward_funcs cider bleu --reward_weights 1.0 0.5`); the baseline is
the greedy caption's reward (`--baseline greedy`) or the mean of the image's other samples
(`--baseline mean_of_others`). `--push_to_hub` publishes the result.
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from rlcaption.data import load_caption_dataset
from rlcaption.models import ShowTellRL
from rlcaption.processing import CaptionProcessor
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(metadata={"help": "XE checkpoint (folder or Hub id) with its processor."})
    dataset: str = field(default="shapes", metadata={"help": "`shapes`, a save_to_disk folder or a Hub dataset id."})
    num_train_images: int = field(default=4000, metadata={"help": "Training images of the shapes dataset."})


def main():
    parser = HfArgumentParser((ScriptArguments, RLCaptionConfig))
    script_args, training_args = parser.parse_args_into_dataclasses()
    if training_args.objective == "xe":
        training_args.objective = "scst"

    shapes_options = {"num_train": script_args.num_train_images} if script_args.dataset == "shapes" else {}
    dataset = load_caption_dataset(script_args.dataset, **shapes_options)
    trainer = RLCaptionTrainer(
        model=ShowTellRL.from_pretrained(script_args.model_name_or_path),
        args=training_args,
        processing_class=CaptionProcessor.from_pretrained(script_args.model_name_or_path),
        train_dataset=dataset["train"],
        eval_dataset=dataset.get("validation"),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if trainer.eval_dataset is not None:
        trainer.evaluate()
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset)


if __name__ == "__main__":
    main()
