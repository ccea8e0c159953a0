"""
Contrastive training of a ShapesCLIP dual encoder on the shapes dataset: the project's stand-in for OpenAI CLIP, used
by the `clip_score` reward and as the evaluator CLIP of the benchmarks.

    accelerate launch examples/train_clip.py --output_dir runs/shapes-clip-reward --use_cpu --seed 0 \
        --hub_model_id rlcaption/shapes-clip-reward

The defaults train the reward CLIP (small CNN image tower, bidirectional GRU text tower, 48-pixel inputs) on 10,000
training images for 24 epochs (about 11 minutes on one CPU thread). The evaluator CLIP uses another seed and another
image tower, a 3-block CNN whose 6x6 feature map is twice as fine:

    accelerate launch examples/train_clip.py --output_dir runs/shapes-clip-evaluator --use_cpu --seed 1 \
        --cnn_channels 16 32 64 --hub_model_id rlcaption/shapes-clip-evaluator

`--encoder_type backbone` trains a small ViT image tower instead (`--backbone_config`); with the same settings it
reached test R@1 0.83 (text to image), short of the CNNs, mostly by confusing positions.

Each batch holds whole near-duplicate families (scenes that differ in one attribute; consecutive rows of a split),
so the contrastive loss sees hard negatives, and one reference per image: a specific one (sizes and a relation)
with probability 0.85, else a mid-level one (colours and shapes). Generic references ("a picture of some simple
forms") fit many images and are left out. After training the model is evaluated on the test split by retrieval with
each image's most specific reference, ranked among all test images, and the output folder gets the model, its
processor, a model card with those results and `eval_results.json`. `--push_to_hub` publishes them to
`--hub_model_id`.
"""

import json
import random
import time
from dataclasses import dataclass, field

import torch
from transformers import HfArgumentParser, Trainer, TrainingArguments

from rlcaption.data import load_shapes
from rlcaption.hub.provenance import training_run
from rlcaption.metrics.clip import clip_retrieval
from rlcaption.models import ShapesCLIPConfig, ShapesCLIPModel
from rlcaption.processing import CaptionProcessor
from rlcaption.shapes.clip_model_card import render_clip_model_card
from rlcaption.shapes.dataset import COLORS, SHAPES, SIZES, most_specific_reference

# A small ViT for `--encoder_type backbone` (its `image_size` is `--image_size`): 16x16 patches, 4 layers of width 128;
# at 48 pixels, one patch per cell of the shapes' 3x3 grid.
DEFAULT_BACKBONE_CONFIG = {
    "model_type": "vit",
    "patch_size": 16,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
# Words that only a non-generic reference contains (colours and shape names), and the size words (with their
# synonyms) that only the specific references, which also state a relation or location, contain.
_ATTRIBUTE_WORDS = frozenset(COLORS) | frozenset(SHAPES) | {"grey"}
_SIZE_WORDS = frozenset(SIZES) | {"little", "big"}
# The shapes CLIPs read 64-pixel renderings (resized to their 48-pixel input), not the captioners' 48-pixel benchmark
# images: their published cards were measured so, and a retrained CLIP must match them.
CLIP_DATASET_IMAGE_SIZE = 64


@dataclass
class ScriptArguments:
    num_train_images: int = field(default=10000, metadata={"help": "Training images of the shapes dataset."})
    num_validation_images: int = field(default=1000, metadata={"help": "Validation images (the standard 1,000)."})
    num_test_images: int = field(
        default=1000, metadata={"help": "Test images (the standard 1,000; the split does not depend on the others)."}
    )
    image_size: int = field(
        default=48,
        metadata={
            "help": "Side of the model's input images; the processor resizes every image to it (48: the size the "
            "project's captioners see, so the reward CLIP reads their inputs as they are)."
        },
    )
    encoder_type: str = field(
        default="cnn", metadata={"help": "Image tower: `cnn` (small CNN) or `backbone` (`--backbone_config`)."}
    )
    cnn_channels: list[int] = field(
        default_factory=lambda: [16, 32, 64, 64], metadata={"help": "Output channels of the CNN blocks."}
    )
    backbone_config: str = field(
        default=json.dumps(DEFAULT_BACKBONE_CONFIG),
        metadata={"help": "JSON config (with `model_type`) of the transformers vision tower for `backbone`."},
    )
    word_embedding_size: int = field(default=128, metadata={"help": "Width of the word embeddings."})
    text_hidden_size: int = field(default=128, metadata={"help": "GRU state size per direction."})
    projection_dim: int = field(default=128, metadata={"help": "Width of the shared embedding space."})
    keep_generic_references: bool = field(
        default=False, metadata={"help": "Also train on the generic references (no colour or shape named)."}
    )
    specific_reference_probability: float = field(
        default=0.85,
        metadata={
            "help": "Chance of drawing one of an image's specific references (sizes and a relation) rather than "
            "another kept one (1: specific references only)."
        },
    )
    family_batches: bool = field(
        default=True, metadata={"help": "Keep near-duplicate families together in a batch (hard negatives)."}
    )
    model_summary: str = field(
        default="the reward model of the `clip_score` reward (CLIP-S of each sampled caption for its image).",
        metadata={"help": "What the model is for: the first paragraph of its model card."},
    )


@dataclass
class CLIPTrainingArguments(TrainingArguments):
    # Defaults that train a small dual encoder from scratch in minutes on a CPU (TrainingArguments' are for
    # fine-tuning large pretrained models).
    learning_rate: float = field(default=2e-3, metadata={"help": "Peak AdamW learning rate."})
    per_device_train_batch_size: int = field(
        default=128, metadata={"help": "Images per batch: each is a negative for the other captions of the batch."}
    )
    num_train_epochs: float = field(default=24.0, metadata={"help": "Passes over the training images."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    warmup_steps: float = field(default=0.05, metadata={"help": "Warm-up steps (a fraction of training if < 1)."})
    # the collator reads the `image`, `captions` columns, which the model's forward does not name
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep the dataset columns."})
    save_strategy: str = field(default="no", metadata={"help": "Intermediate checkpoints (the final model is saved)."})
    logging_steps: float = field(default=25, metadata={"help": "Log the loss every this many steps."})


def is_generic(caption: str) -> bool:
    """A generic reference names no colour and no shape ("two simple figures on a white canvas")."""
    return not _ATTRIBUTE_WORDS & set(caption.split())


def is_specific(caption: str) -> bool:
    """A specific reference gives sizes ("a small red circle left of a big blue square")."""
    return bool(_SIZE_WORDS & set(caption.split()))


def _is_variant(base: list[dict], scene: list[dict]) -> bool:
    """Whether `scene` is `base` with one attribute (colour, shape, size or position) of one object changed."""
    if len(base) != len(scene):
        return False
    changed = []
    for before, after in zip(base, scene, strict=True):
        attributes = {key for key in ("color", "shape", "size") if before[key] != after[key]}
        if (before["row"], before["column"]) != (after["row"], after["column"]):
            attributes.add("position")
        if attributes:
            changed.append(attributes)
    return len(changed) == 1 and len(changed[0]) == 1


def family_ids(scenes: list[list[dict]]) -> list[int]:
    """The near-duplicate family of every row: a split lists each base scene followed by its variants."""
    ids, family, base = [], -1, None
    for scene in scenes:
        if base is None or not _is_variant(base, scene):
            family, base = family + 1, scene
        ids.append(family)
    return ids


class FamilySampler(torch.utils.data.Sampler):
    """All rows, families in a new random order every epoch, the rows of a family next to each other."""

    def __init__(self, families: list[int], seed: int):
        self.members: dict[int, list[int]] = {}
        for row, family in enumerate(families):
            self.members.setdefault(family, []).append(row)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return sum(len(rows) for rows in self.members.values())

    def __iter__(self):
        order = list(self.members)
        random.Random(self.seed + self.epoch).shuffle(order)
        self.epoch += 1  # a new order next time even when the Trainer does not call set_epoch
        return iter([row for family in order for row in self.members[family]])


class ContrastiveCollator:
    """Images and one random reference per image -> `pixel_values`, `input_ids`, `attention_mask`, `return_loss`.

    The reference is one of the image's specific references (sizes and a relation) with probability
    `specific_reference_probability`, else one of its other kept references (mid-level ones, and generic ones with
    `keep_generic_references`). Specific references teach what tells near-duplicates apart; mid-level ones teach the
    model to read less detailed captions too, which it then scores below a correct specific one.
    """

    def __init__(
        self,
        processor: CaptionProcessor,
        keep_generic_references: bool = False,
        specific_reference_probability: float = 0.85,
    ):
        if not 0.0 <= specific_reference_probability <= 1.0:
            raise ValueError(f"specific_reference_probability={specific_reference_probability} is not in [0, 1].")
        self.processor = processor
        self.keep_generic_references = keep_generic_references
        self.specific_reference_probability = specific_reference_probability

    def choose_reference(self, references: list[str]) -> str:
        kept = [caption for caption in references if self.keep_generic_references or not is_generic(caption)]
        kept = kept or references
        specific = [caption for caption in kept if is_specific(caption)]
        others = [caption for caption in kept if not is_specific(caption)]
        if specific and (not others or random.random() < self.specific_reference_probability):
            return random.choice(specific)
        return random.choice(others)

    def __call__(self, rows: list[dict]) -> dict:
        captions = [self.choose_reference(row["captions"]) for row in rows]
        batch = self.processor(images=[row["image"] for row in rows], text=captions, return_tensors="pt")
        return {**batch, "return_loss": True}


class FamilyBatchTrainer(Trainer):
    """A `Trainer` whose training batches keep near-duplicate families together."""

    def __init__(self, *args, families: list[int] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.families = families

    def _get_train_sampler(self, train_dataset=None):
        if self.families is None:
            return super()._get_train_sampler(train_dataset)
        return FamilySampler(self.families, seed=self.args.seed)


def retrieval_scores(model: ShapesCLIPModel, processor: CaptionProcessor, split) -> dict[str, float]:
    """R@1/5/10 both ways of each image's most specific reference among all images of `split`."""
    queries = [most_specific_reference(captions) for captions in split["captions"]]
    return clip_retrieval(split["image"], queries, model=(model, processor), batch_size=250)


def model_card(
    model: ShapesCLIPModel,
    repo_id: str,
    script_args: ScriptArguments,
    training_args: CLIPTrainingArguments,
    results: dict,
    num_test_images: int,
):
    """The model card of a trained CLIP: its settings and the retrieval `results` of `main`."""
    others = "mid-level or generic one" if script_args.keep_generic_references else "mid-level one"
    references = "one per image: a specific one (sizes and a relation) with probability "
    references += f"{script_args.specific_reference_probability:g}, else a {others}"
    if script_args.specific_reference_probability == 1.0:
        references = "one per image: a specific one (sizes and a relation)"
    schedule = getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)
    return render_clip_model_card(
        model,
        repo_id=repo_id,
        scores=results["test"],
        model_summary=script_args.model_summary,
        num_images=num_test_images,
        training_settings={
            "training images": script_args.num_train_images,
            "image size": f"{script_args.image_size}px",
            "references": references,
            "batches": "whole near-duplicate families" if script_args.family_batches else "random rows",
            "batch size": training_args.per_device_train_batch_size,
            "epochs": training_args.num_train_epochs,
            "learning rate": f"{training_args.learning_rate:g}, {schedule} schedule",
            "seed": training_args.seed,
            "run": training_run(),
            "training time": f"{results['training_minutes']:.1f} min on {results['torch_threads']} CPU thread(s)",
        },
        validation_scores=results["validation"],
    )


def main():
    parser = HfArgumentParser((ScriptArguments, CLIPTrainingArguments))
    script_args, training_args = parser.parse_args_into_dataclasses()
    # published below with the model's own push_to_hub: the Trainer's would replace the card by its own
    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False

    # 1. data and processor
    shapes = load_shapes(
        num_train=script_args.num_train_images,
        num_validation=script_args.num_validation_images,
        num_test=script_args.num_test_images,
        # the renderings the published CLIPs were trained and scored on; the processor resizes them to --image_size
        image_size=CLIP_DATASET_IMAGE_SIZE,
    )
    processor = CaptionProcessor.from_captions(shapes["train"]["captions"], image_size=script_args.image_size)
    tokenizer = processor.tokenizer

    # 2. model
    backbone_config = None
    if script_args.encoder_type == "backbone":
        backbone_config = {"image_size": script_args.image_size, **json.loads(script_args.backbone_config)}
    config = ShapesCLIPConfig(
        vocab_size=len(tokenizer),
        word_embedding_size=script_args.word_embedding_size,
        text_hidden_size=script_args.text_hidden_size,
        encoder_type=script_args.encoder_type,
        image_size=script_args.image_size,
        cnn_channels=script_args.cnn_channels,
        backbone_config=backbone_config,
        projection_dim=script_args.projection_dim,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(training_args.seed)
    model = ShapesCLIPModel(config)

    # 3. contrastive training
    trainer = FamilyBatchTrainer(
        model=model,
        args=training_args,
        data_collator=ContrastiveCollator(
            processor,
            keep_generic_references=script_args.keep_generic_references,
            specific_reference_probability=script_args.specific_reference_probability,
        ),
        train_dataset=shapes["train"],
        families=family_ids(shapes["train"]["scene"]) if script_args.family_batches else None,
    )
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    training_minutes = (time.perf_counter() - start) / 60.0

    # 4. evaluation: retrieval with the most specific reference of every test (and validation) image
    model.eval()
    scores = retrieval_scores(model, processor, shapes["test"])
    validation_scores = retrieval_scores(model, processor, shapes["validation"])
    results = {
        "test": scores,
        "validation": validation_scores,
        "training_minutes": round(training_minutes, 2),
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(results, indent=2))

    # 5. the Hub folder: model, processor, card and the evaluation as JSON
    model.save_pretrained(training_args.output_dir)
    processor.save_pretrained(training_args.output_dir)
    repo_id = training_args.hub_model_id or f"rlcaption/{training_args.output_dir.rstrip('/').split('/')[-1]}"
    card = model_card(model, repo_id, script_args, training_args, results, num_test_images=len(shapes["test"]))
    card.save(f"{training_args.output_dir}/README.md")
    with open(f"{training_args.output_dir}/eval_results.json", "w") as file:
        json.dump(results, file, indent=2)
    if push_to_hub:
        model.push_to_hub(repo_id, commit_message="Upload ShapesCLIP model")
        processor.push_to_hub(repo_id, commit_message="Upload processor")
        card.push_to_hub(repo_id, commit_message="Upload model card")


if __name__ == "__main__":
    main()
