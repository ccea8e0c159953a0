"""
Teacher-forcing (XE) training of a ShowTellRL captioner: the warm start of every RL recipe.

    accelerate launch examples/train_xe.py --output_dir runs/xe --num_train_epochs 6 --learning_rate 2e-3

Defaults run on the embedded shapes dataset on a CPU (add `--use_cpu`; `accelerate launch --multi_gpu
--num_processes 2` for two processes). `--dataset` also takes a folder written by `save_to_disk` (see
`rlcaption.data.load_karpathy`) or a Hub dataset id; `--push_to_hub` publishes the model and its processor.
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from rlcaption.data import load_caption_dataset
from rlcaption.models import ShowTellRL, ShowTellRLConfig
from rlcaption.processing import CaptionProcessor
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer


@dataclass
class ScriptArguments:
    dataset: str = field(default="shapes", metadata={"help": "`shapes`, a save_to_disk folder or a Hub dataset id."})
    num_train_images: int = field(default=4000, metadata={"help": "Training images of the shapes dataset."})
    min_word_count: int = field(default=1, metadata={"help": "Words rarer than this in training captions -> <unk>."})
    image_size: int = field(default=64, metadata={"help": "Side of the square input images, in pixels."})
    encoder_type: str = field(default="cnn", metadata={"help": "`cnn`, `backbone` or `features`."})
    hidden_size: int = field(default=256, metadata={"help": "LSTM hidden size (512 in the papers)."})
    dropout: float = field(default=0.2, metadata={"help": "Dropout before the word classifier."})


def main():
    parser = HfArgumentParser((ScriptArguments, RLCaptionConfig))
    script_args, training_args = parser.parse_args_into_dataclasses()
    training_args.objective = "xe"

    shapes_options = {"num_train": script_args.num_train_images} if script_args.dataset == "shapes" else {}
    dataset = load_caption_dataset(script_args.dataset, **shapes_options)
    train_captions = [caption for captions in dataset["train"]["captions"] for caption in captions]
    processor = CaptionProcessor.from_captions(
        train_captions, min_count=script_args.min_word_count, image_size=script_args.image_size
    )
    tokenizer = processor.tokenizer
    config = ShowTellRLConfig(
        vocab_size=len(tokenizer),
        hidden_size=script_args.hidden_size,
        word_embedding_size=script_args.hidden_size,
        encoder_type=script_args.encoder_type,
        image_size=script_args.image_size,
        dropout=script_args.dropout,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    trainer = RLCaptionTrainer(
        model=ShowTellRL(config),
        args=training_args,
        processing_class=processor,
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
