"""
Training of Ren et al.'s visual-semantic embedding (Ren et al. 2017), the reward model of the
`embedding` reward, on the ground-truth pairs of the shapes dataset:

    OMP_NUM_THREADS=1 python examples/train_embedding.py --output_dir runs/visual-semantic-embedding-shapes \
        --hub_model_id rlcaption/visual-semantic-embedding-shapes

trains the shipped `checkpoints/visual-semantic-embedding-shapes` with the defaults: 2,500 Adam steps of 128 of the
4,000 training images at a constant learning rate of 3e-4, margin 0.2 (about 7.5 minutes on one CPU thread).

The embedding takes the processor of the captioner it will reward (`--captioner_name_or_path`, the published XE
captioner by default): the same vocabulary, so that the reward reads every word the captioner writes, and the same
image size. By default (`--image_encoder captioner`) its image side is a linear map `l_e` of that captioner's image
encoder: its fixed, pretrained CNN (as Ren et al.'s maps fixed VGG-16 features), a copy of its vision backbone, or the
precomputed features it reads. `--image_encoder new` builds one of its own: a CNN (`--cnn_channels ...`), a pretrained
`transformers` vision model (`--vision_model <hub id or folder>`, fixed unless `--train_vision_model`), or precomputed
features (`--image_features <folder>`). Words → GRU → linear embeds a caption (`--word_embedding_size`,
`--hidden_size`, `--joint_embedding_size`).

On precomputed features, `--image_features` names the folder of a dataset with an `image_features` column (the output
folder of `rlcaption extract-features`, or a dataset of region features saved with `save_to_disk`), which replaces
`--dataset`: one pooled vector per image, or a grid or regions per image (their count may vary), read as their mean:

    python examples/train_embedding.py --output_dir runs/embedding-coco --captioner_name_or_path runs/xe-coco \
        --image_encoder new --image_features features/coco-bottom-up

Training (`rlcaption.rewards.embedding.train_embedding_model`) minimises the bidirectional hinge ranking loss of margin
`--margin` with Adam for `--max_steps` steps of `--per_device_train_batch_size` training images (at most the train
split). The test split is then scored by retrieval with all the ground-truth captions, caption → image and image →
caption R@1/5/10, and the output folder gets the model (safetensors and config), its processor, a model card whose
`model-index` holds those recalls, and `eval_results.json`. `--push_to_hub` publishes the folder to `--hub_model_id`;
then reward captioners with `get_reward("embedding", model=<folder or Hub id>)` or `examples/train_actor_critic.py
--embedding_model ...`.
"""

import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from huggingface_hub import ModelCard, ModelCardData, create_repo
from transformers import AutoModelForImageTextToText, AutoProcessor, HfArgumentParser

from rlcaption.data.collator import pad_regions
from rlcaption.hub import HUB_CONNECTION_ERRORS, MODEL_CARD_TEMPLATE, parameter_count, publish_folder
from rlcaption.hub.provenance import training_run
from rlcaption.metrics.clip import embed_images, embed_texts
from rlcaption.metrics.retrieval import retrieval_recall
from rlcaption.models import ShowTellRL, VisualSemanticEmbedding, VisualSemanticEmbeddingConfig
from rlcaption.processing import CaptionProcessor
from rlcaption.recipes import (
    RecipeArguments,
    check_pretrained_reference,
    dataset_name,
    load_recipe_dataset,
    new_image_encoder_fields,
)
from rlcaption.rewards.embedding import train_embedding_model
from rlcaption.shapes.clip_model_card import retrieval_eval_results

TEMPLATE = MODEL_CARD_TEMPLATE.parent / "visual_semantic_embedding_model_card.md"
IMAGE_ENCODERS = ("captioner", "new")
DEFAULT_CNN_CHANNELS = [32, 64, 64, 64]  # those of the published captioners' CNN
# Files of a saved model: an output folder holding one is only written over with --overwrite_output_dir.
_MODEL_FILES = ("config.json", "model.safetensors")
# Steps averaged for the first and last training loss of the results.
_LOSS_WINDOW = 50


@dataclass
class ScriptArguments(RecipeArguments):
    captioner_name_or_path: str = field(
        default="checkpoints/show-tell-rl-shapes-xe",
        metadata={
            "help": "The captioner the embedding will reward (folder or Hub id): its processor (vocabulary, image "
            "size) becomes the embedding's, and with --image_encoder captioner its fixed CNN too."
        },
    )
    image_encoder: str = field(
        default="captioner",
        metadata={
            "help": "`captioner`: a copy of the captioner's image encoder (its fixed pretrained CNN, as Ren et al.'s "
            "l_e maps fixed features; its vision backbone; or its precomputed features, with --image_features); "
            "`new`: a CNN of --cnn_channels trained with the embedding, or --vision_model, or --image_features."
        },
    )
    cnn_channels: list[int] | None = field(
        default=None, metadata={"help": "CNN blocks of a `new` image encoder (default: 32 64 64 64)."}
    )
    vision_model: str | None = field(
        default=None,
        metadata={
            "help": "A `new` image encoder that is this pretrained transformers vision model (hub id or local "
            "folder: ViT, ResNet, CLIP vision, ...), pooled; it reads the captioner processor's images, so take a "
            "captioner made for it."
        },
    )
    train_vision_model: bool = field(
        default=False, metadata={"help": "Fine-tune --vision_model with the embedding instead of keeping it fixed."}
    )
    word_embedding_size: int = field(default=128, metadata={"help": "Width of the embedding's word vectors."})
    hidden_size: int = field(default=256, metadata={"help": "State size of the caption GRU."})
    joint_embedding_size: int = field(default=256, metadata={"help": "Width of the joint caption-image space."})
    # the recipes' flag, for what it means here: this recipe writes no checkpoints to resume from
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Write over a model already saved in --output_dir."}
    )

    def __post_init__(self):
        if self.image_encoder not in IMAGE_ENCODERS:
            raise ValueError(f"--image_encoder {self.image_encoder!r} is not one of {IMAGE_ENCODERS}.")
        if self.cnn_channels is not None and self.image_encoder != "new":
            raise ValueError(
                f"--cnn_channels shapes a new CNN, but --image_encoder {self.image_encoder} copies the captioner's; "
                "pass --image_encoder new too, or drop --cnn_channels."
            )
        if self.vision_model is not None and self.image_encoder != "new":
            raise ValueError(
                f"--vision_model is a new image encoder, but --image_encoder {self.image_encoder} copies the "
                "captioner's; pass --image_encoder new too, or drop --vision_model."
            )
        new_encoders = {
            "--cnn_channels": self.cnn_channels,
            "--vision_model": self.vision_model,
            "--image_features": self.image_features if self.image_encoder == "new" else None,
        }
        chosen = [option for option, value in new_encoders.items() if value is not None]
        if len(chosen) > 1:
            raise ValueError(f"{' and '.join(chosen)} each choose the new image encoder: pass one of them.")
        if self.train_vision_model and self.vision_model is None:
            raise ValueError("--train_vision_model fine-tunes --vision_model: pass --vision_model too.")


@dataclass
class EmbeddingTrainingArguments:
    output_dir: str = field(metadata={"help": "Where the model, its processor, card and eval_results.json go."})
    # named as every other recipe (and the Trainer) names them; the older names stay accepted
    max_steps: int = field(default=2500, metadata={"help": "Adam steps.", "aliases": ["--num_steps"]})
    per_device_train_batch_size: int = field(
        default=128,
        metadata={
            "help": "Images (and one caption each) per step: the others are each one's negatives. A train split of "
            "fewer images trains on batches of all of them.",
            "aliases": ["--batch_size"],
        },
    )
    learning_rate: float = field(default=3e-4, metadata={"help": "Adam's learning rate."})
    margin: float = field(default=0.2, metadata={"help": "γ of the bidirectional hinge ranking loss."})
    seed: int = field(default=0, metadata={"help": "Seeds the initialisation, the batches and the references drawn."})
    logging_steps: int = field(default=100, metadata={"help": "Print the mean loss every this many steps."})
    eval_batch_size: int = field(default=256, metadata={"help": "Images per forward pass of the evaluation."})
    push_to_hub: bool = field(default=False, metadata={"help": "Publish the output folder to --hub_model_id."})
    hub_model_id: str | None = field(
        default=None, metadata={"help": "`org/name` of the Hub repo (default: the output folder's name)."}
    )
    hub_token: str | None = field(default=None, metadata={"help": "Hub token (default: the logged-in one)."})

    def __post_init__(self):
        if self.max_steps < 1 or self.per_device_train_batch_size < 2 or self.learning_rate <= 0 or self.margin <= 0:
            raise ValueError(
                "--max_steps must be >= 1, --per_device_train_batch_size >= 2 (a caption needs negatives), "
                f"--learning_rate > 0 and --margin > 0; got {self.max_steps}, {self.per_device_train_batch_size}, "
                f"{self.learning_rate}, {self.margin}."
            )
        if self.logging_steps < 1 or self.eval_batch_size < 1:
            raise ValueError(
                f"--logging_steps and --eval_batch_size must be >= 1, got {self.logging_steps} and "
                f"{self.eval_batch_size}."
            )

    @property
    def repo_id(self) -> str:
        return self.hub_model_id or os.path.basename(os.path.normpath(self.output_dir))


def check_output_dir(output_dir: str, overwrite: bool) -> None:
    """Refuses to write over a saved model unless `overwrite`: a finished run is not lost to a repeated command."""
    saved = [name for name in _MODEL_FILES if os.path.isfile(os.path.join(output_dir, name))]
    if saved and not overwrite:
        raise ValueError(
            f"--output_dir {output_dir} already holds a saved model ({', '.join(saved)}). Choose another folder, or "
            "pass --overwrite_output_dir to replace it."
        )


def check_hub_repo(training_args: EmbeddingTrainingArguments) -> None:
    """With `--push_to_hub`, creates the Hub repo before any training time is spent, as the other recipes do."""
    if not training_args.push_to_hub:
        return
    try:
        create_repo(training_args.repo_id, token=training_args.hub_token, exist_ok=True)
    except HUB_CONNECTION_ERRORS as error:
        raise RuntimeError(
            f"--push_to_hub: cannot create the Hub repo {training_args.repo_id}: {error}. Nothing was trained yet. "
            "Log in (`hf auth login`) and check the network, or train without --push_to_hub and publish the saved "
            "folder later with `rlcaption.hub.publish_folder`."
        ) from error


def new_embedding(script_args: ScriptArguments) -> tuple[VisualSemanticEmbedding, CaptionProcessor]:
    """A randomly initialised embedding over the vocabulary and images of `--captioner_name_or_path`, and the
    captioner's processor."""
    name = script_args.captioner_name_or_path
    local_files_only = check_pretrained_reference(name, option="--captioner_name_or_path")
    processor = AutoProcessor.from_pretrained(name, local_files_only=local_files_only)
    if not isinstance(processor, CaptionProcessor):
        raise ValueError(
            f"--captioner_name_or_path {name}: the embedding reads captions as rlcaption's CaptionProcessor tokenizes "
            f"them (`<bos> w_1 ... w_n <eos>`), but its processor is a {type(processor).__name__}."
        )
    sizes = {
        "word_embedding_size": script_args.word_embedding_size,
        "hidden_size": script_args.hidden_size,
        "joint_embedding_size": script_args.joint_embedding_size,
    }
    if script_args.image_encoder == "new":
        tokenizer = processor.tokenizer
        image_encoder = new_image_encoder_fields(
            script_args.image_features, script_args.vision_model, script_args.train_vision_model,
            script_args.cnn_channels or DEFAULT_CNN_CHANNELS,
        )  # fmt: skip
        config = VisualSemanticEmbeddingConfig(
            vocab_size=len(tokenizer), image_size=processor.image_processor.size["height"],
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, **image_encoder, **sizes,
        )  # fmt: skip
        return VisualSemanticEmbedding(config), processor
    captioner = AutoModelForImageTextToText.from_pretrained(name, local_files_only=local_files_only)
    config = captioner.config
    encoder_type = getattr(config, "encoder_type", None)
    copies = isinstance(captioner, ShowTellRL) and (
        encoder_type in ("backbone", "features") or (encoder_type == "cnn" and config.freeze_image_encoder)
    )
    if not copies:
        raise ValueError(
            f"--image_encoder captioner copies a ShowTellRL's fixed (pretrained) CNN, vision backbone or precomputed "
            f"features, but {name} is a {type(captioner).__name__} (encoder_type={encoder_type!r}, "
            f"freeze_image_encoder={getattr(config, 'freeze_image_encoder', None)!r}). Pass --image_encoder new."
        )
    if (encoder_type == "features") != (script_args.image_features is not None):
        reads = "precomputed features" if encoder_type == "features" else "images"
        remedy = (
            "pass the features with --image_features."
            if encoder_type == "features"
            else "drop --image_features, or pass --image_encoder new to read them."
        )
        raise ValueError(
            f"--captioner_name_or_path {name} reads {reads} (encoder_type={encoder_type!r}), and so does a copy of "
            f"its image encoder: {remedy}"
        )
    return VisualSemanticEmbedding.from_captioner(captioner, **sizes), processor


def embed_split_images(model: VisualSemanticEmbedding, processor, split, batch_size: int) -> torch.Tensor:
    """The unit-norm embedding of every image of `split` `(num_images, joint_embedding_size)`: from its
    `image_features` (grids and regions padded a batch at a time) for a features embedding, else from its images."""
    if model.config.encoder_type != "features":
        return embed_images(model, processor, split["image"], batch_size=batch_size)
    features = split.select_columns(["image_features"])
    chunks = []
    for start in range(0, len(features), batch_size):
        rows = features.select(range(start, min(start + batch_size, len(features))))
        if model.config.image_feature_layout == "grid":
            image_features, mask = pad_regions(rows, "image_features")
        else:
            image_features, mask = torch.as_tensor(np.asarray(rows["image_features"]), dtype=torch.float32), None
        with torch.no_grad():
            output = model.get_image_features(image_features=image_features, image_feature_mask=mask)
        chunks.append(output.pooler_output.float().cpu())
    return torch.cat(chunks)


def retrieval_scores(model: VisualSemanticEmbedding, processor, split, batch_size: int) -> dict[str, float]:
    """
    Caption → image and image → caption R@1/5/10 of every ground-truth caption of `split` among all its images
    ([`retrieval_recall`]), and the mean cosine (the reward) of a caption with its own image and with the others.
    """
    references = split["captions"]
    captions = [caption for captions in references for caption in captions]
    owner = [image for image, captions in enumerate(references) for _ in captions]
    image_embeddings = embed_split_images(model, processor, split, batch_size)  # (I, J)
    text_embeddings = embed_texts(model, processor, captions, batch_size=4 * batch_size)  # (N, J)
    scores = retrieval_recall(text_embeddings, image_embeddings, ks=(1, 5, 10), text_to_image_index=owner)
    cosines = text_embeddings @ image_embeddings.T  # (N, I)
    own = torch.zeros_like(cosines, dtype=torch.bool)
    own[torch.arange(len(captions)), torch.tensor(owner)] = True
    return {
        **scores,
        "matching_cosine": float(cosines[own].mean()),
        "mismatched_cosine": float(cosines[~own].mean()),
        "num_captions": len(captions),
    }


def model_card(
    model: VisualSemanticEmbedding,
    script_args: ScriptArguments,
    training_args: EmbeddingTrainingArguments,
    results: dict,
    num_test_images: int,
    command: str,
) -> ModelCard:
    """The model card of a trained embedding: its settings, the exact command, and the test results of `main`."""
    test = results["test"]
    name = dataset_name(script_args)
    recalls = retrieval_eval_results({key: value for key, value in test.items() if "_R@" in key}, name, name)
    card_data = ModelCardData(
        language="en",
        license="apache-2.0",
        library_name="rlcaption",
        pipeline_tag="zero-shot-image-classification",
        tags=["visual-semantic-embedding", "image-text-retrieval", "reward-model", "rlcaption"],
        metrics=["recall"],
        model_name=training_args.repo_id.split("/")[-1],
        eval_results=recalls,
    )
    config = model.config
    captioner = f"`{script_args.captioner_name_or_path}`"
    image_encoder = image_encoder_description(config, script_args.image_encoder == "captioner", captioner)
    trainable = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
    return ModelCard.from_template(
        card_data,
        template_path=str(TEMPLATE),
        model_name=training_args.repo_id.split("/")[-1],
        repo_id=training_args.repo_id,
        word_embedding_size=config.word_embedding_size,
        hidden_size=config.hidden_size,
        joint_embedding_size=config.joint_embedding_size,
        image_encoder=image_encoder,
        image_size=config.image_size,
        vocab_size=config.vocab_size,
        num_parameters=parameter_count(model),
        num_trainable_parameters=f"{trainable / 1e3:.0f}k",
        processor_source=f"the captioner {captioner}'s",
        training_settings={
            "training images": results["num_train_images"],
            "steps": training_args.max_steps,
            "batch size": training_args.per_device_train_batch_size,
            "learning rate": f"{training_args.learning_rate:g} (Adam, constant)",
            "margin γ": training_args.margin,
            "seed": training_args.seed,
            "run": training_run(),
            f"loss (mean of the first / last {results['train_loss_window']} steps)": (
                f"{results['train_loss_first']:.3f} / {results['train_loss_last']:.3f}"
            ),
            "training time": f"{results['training_minutes']:.1f} min on {results['torch_threads']} CPU thread(s)",
        },
        command=command,
        dataset_name=dataset_name(script_args),
        dataset_split="test",
        num_images=f"{num_test_images:,}",
        num_captions=f"{test['num_captions']:,}",
        scores={result.metric_name: result.metric_value for result in recalls},
        matching_cosine=test["matching_cosine"],
        mismatched_cosine=test["mismatched_cosine"],
        limitations=(
            "It knows the words of the synthetic shapes captions and the flat coloured shapes of the dataset, nothing "
            "else: other words map to `<unk>`, and its scores on natural images mean nothing. As any learned reward "
            "it can be gamed: judge a captioner trained on it by other metrics too (CIDEr-D, object F1, an evaluator "
            "CLIP)."
            if dataset_name(script_args) == "shapes"
            else "Inherits the biases of its training captions; as any learned reward it can be gamed."
        ),
    )


def image_encoder_description(config: VisualSemanticEmbeddingConfig, copied: bool, captioner: str) -> str:
    """What the model card says of the embedding's image side."""
    if config.encoder_type == "features":
        kind = "pooled" if config.image_feature_layout == "pooled" else "grid or region (mean over the real regions)"
        return f"precomputed {kind} image features of width {config.image_feature_size}"
    if config.encoder_type == "backbone":
        state = "fixed" if config.freeze_backbone else "fine-tuned"
        name = config.backbone or config.backbone_config["model_type"]
        return f"the {state} pretrained vision model `{name}`" + (
            f" of the captioner {captioner}, copied" if copied else ""
        )
    channels = list(config.cnn_channels)
    if copied:
        return (
            f"the fixed, pretrained {len(channels)}-block CNN of the captioner {captioner} (channels {channels}, "
            "copied)"
        )
    return f"its own {len(channels)}-block CNN (channels {channels}, trained with it)"


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser((ScriptArguments, EmbeddingTrainingArguments))
    script_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    # 0. what can fail before any time is spent: the output folder, the Hub repo, the captioner
    check_output_dir(training_args.output_dir, script_args.overwrite_output_dir)
    check_hub_repo(training_args)
    torch.manual_seed(training_args.seed)
    model, processor = new_embedding(script_args)

    # 1. data
    dataset = load_recipe_dataset(script_args)
    source = (
        f"--image_features {script_args.image_features}"
        if script_args.image_features is not None
        else f"--dataset {script_args.dataset}"
    )
    image_column = "image_features" if model.config.encoder_type == "features" else "image"
    missing = [split for split in ("train", "test") if split not in dataset]
    if missing or image_column not in dataset["test"].column_names:
        raise ValueError(
            f"{source}: the recipe trains on a `train` split and scores retrieval on the images of a `test` split (an "
            f"`{image_column}` column); it has splits {sorted(dataset)} and test columns "
            f"{dataset['test'].column_names if 'test' in dataset else []}."
        )

    # 2. training on the ground-truth pairs
    recent: list[float] = []

    def print_loss(step: int, loss: float) -> None:
        recent.append(loss)
        if step % training_args.logging_steps == 0:
            print(f"step {step}/{training_args.max_steps}: loss {sum(recent) / len(recent):.4f}", flush=True)
            recent.clear()

    if training_args.per_device_train_batch_size > dataset["train"].num_rows:
        print(
            f"--per_device_train_batch_size {training_args.per_device_train_batch_size} exceeds the "
            f"{dataset['train'].num_rows} training images: every step takes all of them."
        )
        training_args.per_device_train_batch_size = dataset["train"].num_rows
    start = time.perf_counter()
    losses = train_embedding_model(
        model, processor, dataset["train"], num_steps=training_args.max_steps,
        batch_size=training_args.per_device_train_batch_size,
        learning_rate=training_args.learning_rate, margin=training_args.margin, seed=training_args.seed,
        on_step=print_loss,
    )  # fmt: skip
    training_minutes = (time.perf_counter() - start) / 60.0

    # 3. retrieval on the test split with all its ground-truth captions
    model.eval()
    window = min(_LOSS_WINDOW, len(losses))
    results = {
        "test": retrieval_scores(model, processor, dataset["test"], training_args.eval_batch_size),
        # the loss of single steps is noisy: the means of the first and last steps say whether it fell
        "train_loss_first": sum(losses[:window]) / window,
        "train_loss_last": sum(losses[-window:]) / window,
        "train_loss_window": window,
        "num_train_images": dataset["train"].num_rows,
        "training_minutes": round(training_minutes, 2),
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(results, indent=2))

    # 4. the Hub folder: model, processor, card and the evaluation as JSON
    output_dir = training_args.output_dir
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
    # the thread count changes the training time the card states, so the command names it when it was set
    threads = [f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"] if "OMP_NUM_THREADS" in os.environ else []
    command = shlex.join([*threads, "python", "examples/train_embedding.py", *argv])
    card = model_card(model, script_args, training_args, results, dataset["test"].num_rows, command)
    card.save(os.path.join(output_dir, "README.md"))
    with open(os.path.join(output_dir, "eval_results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=2)
    if training_args.push_to_hub:
        print(publish_folder(output_dir, training_args.repo_id, token=training_args.hub_token))
    return results


if __name__ == "__main__":
    main()
