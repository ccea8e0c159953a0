"""
The command line of the training recipes of `examples/`: their common arguments ([`RecipeArguments`]), parsing them
with a method's config ([`parse_recipe_arguments`]), errors that name the recipe an option of another method belongs
to, defaults that point at the repository's checkpoints from any folder, and where a run resumes from.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser

from .objectives import available_objectives, get_objective_class
from .trainer import RLCaptionConfig, RLCaptionTrainer
from .trainer.rl_trainer import last_complete_checkpoint

_TRUE_WORDS = ("true", "yes", "1", "last", "auto")
# The recipe of `examples/` that trains each objective.
RECIPE_OF_OBJECTIVE = {
    "xe": "train_xe.py",
    "scst": "train_scst.py",
    "spider_pg": "train_spider.py",
    "sle": "train_sle.py",
    "wtf": "train_wtf.py",
    "psst": "train_psst.py",
    "actor_critic": "train_actor_critic.py",
}
# Worker processes per training process that decode and process images, at most. One core prepares about 20 batches
# of 16 224-px JPEGs a second (`benchmarks/bench_dataloader_workers.py`); COCO's 640x480 files cost a few times more
# each, so 4 workers keep a batch ready every few tens of milliseconds, a GPU step's time, and the 8 GPUs of a node
# then start 32 of them, which such a node's cores afford.
_MAX_DATALOADER_WORKERS = 4
_FALSE_WORDS = ("false", "no", "0", "none")


@dataclass
class RecipeArguments:
    """The arguments every recipe has besides [`RLCaptionConfig`]; a recipe's own `ScriptArguments` extend them."""

    dataset: str = field(
        default="shapes",
        metadata={
            "help": "`shapes`, a save_to_disk folder, a folder of images with captions in metadata.jsonl files "
            "(`rlcaption.data.load_caption_imagefolder`) or a Hub dataset id. With a dataset other than shapes, "
            "images are decoded in worker processes: --dataloader_num_workers defaults to up to 4 per training "
            "process, one core left to it (`rlcaption.recipes.dataloader_workers_for_images`)."
        },
    )
    image_features: str | None = field(
        default=None,
        metadata={
            "help": "Train and evaluate on precomputed features instead of --dataset: the folder of a dataset with an "
            "`image_features` column, an `rlcaption extract-features` output folder (its `dataset/` is read) or "
            "region features joined with `rlcaption.data.add_region_features` and saved with save_to_disk. One "
            "pooled vector per image, or a grid or regions per image (their count may vary). A CLIP reward or "
            "--eval_clip reads the dataset's `image` column beside them (extract-features keeps it; "
            "add_region_features with keep_images=True)."
        },
    )
    num_train_images: int = field(default=4000, metadata={"help": "Training images of the shapes dataset."})
    num_validation_images: int = field(default=200, metadata={"help": "Validation images of the shapes dataset."})
    num_test_images: int = field(default=500, metadata={"help": "Test images of the shapes dataset."})
    shapes_seed: int = field(default=0, metadata={"help": "Seed of the generated shapes dataset."})
    image_size: int = field(default=48, metadata={"help": "Side of shapes images (and of a new model's input)."})
    verify_images: bool = field(
        default=True, metadata={"help": "Decode every image of the dataset once before training (corrupt ones fail)."}
    )
    skip_unreadable_images: bool = field(
        default=False, metadata={"help": "Drop the rows whose image does not decode, naming them, instead of failing."}
    )
    pretraining_only: bool = field(
        default=False,
        metadata={
            "help": "Allow a run that ends within the method's pretraining phase, the captioner fixed (e.g. a PSST "
            "listener warmed up once, from which several runs start with --model_name_or_path). Without it, a "
            "--max_steps or epoch budget that the pretraining uses up is refused."
        },
    )
    score_validation: bool = field(
        default=False,
        metadata={
            "help": "After training, also score the validation split as the test split is scored (written to "
            "eval_results.json under `validation`), so that settings are chosen on validation and test is read once."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start again although --output_dir holds checkpoints of an earlier run. Without it, a run whose "
            "--output_dir has a complete checkpoint resumes from the newest one."
        },
    )


def _normalise_resume_flag(argv: Sequence[str]) -> list[str]:
    """`--resume_from_checkpoint` with no value (the last word, or followed by another option) means `true`."""
    words = list(argv)
    for index, word in enumerate(words):
        if word == "--resume_from_checkpoint" and (index + 1 == len(words) or words[index + 1].startswith("--")):
            words.insert(index + 1, "true")
            break
    return words


def parse_recipe_arguments(
    script_arguments_class: type,
    defaults: Mapping[str, Any] | None = None,
    argv: Sequence[str] | None = None,
    config_classes: Sequence[type[RLCaptionConfig]] = (RLCaptionConfig,),
) -> tuple[Any, RLCaptionConfig]:
    """
    Parses `(script_arguments_class, config class)` from the command line (or `argv`) with the recipe's own
    `defaults` (e.g. its learning rate). `config_classes` are the configs of the methods the recipe trains, its own
    first (`(SLEConfig, SCSTConfig)`: SLE and its SLL baselines): `--objective` (or the `objective` of `defaults`,
    else the first's) chooses among them, so that `--help` lists that method's options and the shared ones. Settles
    where training resumes from ([`resolve_resume_from_checkpoint`]), so that `training_args.resume_from_checkpoint`
    is what `trainer.train(resume_from_checkpoint=...)` takes.

    Raises:
        `ValueError`: `--objective` names a method that another recipe trains.
    """
    argv = sys.argv[1:] if argv is None else argv
    config_class = _config_class_of_objective(config_classes, defaults, argv)
    parser = HfArgumentParser((script_arguments_class, config_class))
    if defaults:
        parser.set_defaults(**defaults)
    if "dataloader_num_workers" not in (defaults or {}):
        _decode_image_files_in_workers(parser, argv)
    script_args, training_args, unused = parser.parse_args_into_dataclasses(
        args=_normalise_resume_flag(argv), return_remaining_strings=True
    )
    if unused:
        raise ValueError(_unused_options_message(unused, training_args.objective))
    _checkpoints_from_the_repository((script_args, training_args), argv, _recipe_file(script_arguments_class))
    _refuse_options_the_objective_ignores(argv, training_args.objective)
    if not getattr(script_args, "pretraining_only", False):
        check_pretraining_leaves_steps(training_args)
    training_args.resume_from_checkpoint = resolve_resume_from_checkpoint(
        training_args.resume_from_checkpoint,
        training_args.output_dir,
        overwrite_output_dir=getattr(script_args, "overwrite_output_dir", False),
    )
    return script_args, training_args


# Where the repository keeps the checkpoints the recipes start from by default (the XE warm start, the shapes CLIPs).
_REPOSITORY_CHECKPOINTS = "checkpoints/"


def _recipe_file(script_arguments_class: type) -> str | None:
    """The file of the recipe that defines `script_arguments_class` (`examples/<recipe>.py`), when it can be told."""
    module = sys.modules.get(script_arguments_class.__module__)
    return getattr(module, "__file__", None)


def _checkpoints_from_the_repository(parsed: Sequence[Any], argv: Sequence[str], recipe_file: str | None) -> None:
    """
    Points every option left at a default in the repository's `checkpoints/` at that folder of the repository (the
    recipe's `examples/` is in it) when the current folder has no such folder, so that a recipe runs from any folder.

    Raises:
        `FileNotFoundError`: naming the default and where it was looked for, when neither folder has it.
    """
    given = {argument.split("=")[0].lstrip("-") for argument in argv if argument.startswith("--")}
    repository = Path(recipe_file).resolve().parent.parent if recipe_file else None
    for arguments in parsed:
        for option in dataclasses.fields(arguments):
            value = getattr(arguments, option.name)
            if (
                option.name in given
                or not isinstance(value, str)
                or not value.startswith(_REPOSITORY_CHECKPOINTS)
                or os.path.isdir(value)
            ):
                continue
            in_repository = repository / value if repository else None
            if in_repository is None or not in_repository.is_dir():
                raise FileNotFoundError(
                    f"--{option.name} defaults to the project's {value}, which is neither in the current folder "
                    f"({os.path.abspath(value)}){f' nor at {in_repository}' if in_repository else ''}: run the recipe "
                    f"from a clone of the repository, or pass --{option.name} <folder or Hub id>."
                )
            setattr(arguments, option.name, str(in_repository))


def _config_class_of_objective(
    config_classes: Sequence[type[RLCaptionConfig]], defaults: Mapping[str, Any] | None, argv: Sequence[str]
) -> type[RLCaptionConfig]:
    """The class among `config_classes` of the objective that `argv` (or `defaults`) names, read before the full
    parse since it decides which options there are."""
    by_objective = {config.__dataclass_fields__["objective"].default: config for config in config_classes}
    probe = argparse.ArgumentParser(add_help=False)  # reads only this option, as the full parser does
    probe.add_argument("--objective", default=(defaults or {}).get("objective", next(iter(by_objective))))
    objective = probe.parse_known_args(list(argv))[0].objective
    if objective not in by_objective and objective in available_objectives():
        raise ValueError(
            f"This recipe trains --objective {' or '.join(by_objective)}; --objective {objective} belongs to another "
            f"recipe: use examples/{RECIPE_OF_OBJECTIVE[objective]}."
        )
    # an unknown objective is refused by the config's validation, which lists the valid ones
    return by_objective.get(objective, config_classes[0])


def _unused_options_message(unused: Sequence[str], objective: str) -> str:
    """Why the options `unused` were refused, naming for each one of another method the recipe that takes it."""
    options = [word.split("=")[0] for word in unused if word.startswith("--")] or list(unused)
    reasons = []
    for option in options:
        name = option.lstrip("-").replace("-", "_")
        owners = [
            other for other in available_objectives()
            if name in get_objective_class(other).config_class.__dataclass_fields__
            and name not in RLCaptionConfig.__dataclass_fields__
        ]  # fmt: skip
        if owners:
            recipes = " or ".join(f"examples/{RECIPE_OF_OBJECTIVE[other]}" for other in sorted(owners))
            reasons.append(f"{option} is an option of --objective {' / '.join(sorted(owners))}: use {recipes}")
        else:
            reasons.append(f"{option} is not an option of this recipe")
    return f"Options not used by this recipe (--objective {objective}): " + "; ".join(reasons) + ". `--help` lists "
    "the recipe's options."


# The options of RLCaptionConfig that only the RL objectives read (sampled captions and their rewards): teacher
# forcing would accept and ignore them.
_RL_ONLY_OPTIONS = (
    "reward_funcs", "reward_weights", "document_frequencies", "reward_processes", "num_samples_per_image",
    "temperature", "top_k", "top_p",
)  # fmt: skip


def _refuse_options_the_objective_ignores(argv: Sequence[str], objective: str) -> None:
    """Refuses an RL option given to teacher forcing (`train_xe.py --reward_funcs cider`), which would ignore it."""
    if objective != "xe":
        return
    given = {word[2:].split("=")[0].replace("-", "_") for word in argv if word.startswith("--")}
    ignored = [f"--{name}" for name in _RL_ONLY_OPTIONS if name in given]
    if ignored:
        raise ValueError(
            f"{', '.join(ignored)}: teacher forcing (--objective xe) samples no captions and computes no reward, so "
            "it would ignore them. Drop them, or train with rewards from the XE model: examples/train_scst.py "
            "--model_name_or_path <xe output folder>."
        )


def dataloader_workers_for_images() -> int:
    """
    The `dataloader_num_workers` of a recipe on a dataset of image files: up to 4 worker processes per training
    process (`LOCAL_WORLD_SIZE` of them on this machine), leaving each training process a core of its own; 0 where
    the cores are too few to leave one.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    processes_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(0, min(_MAX_DATALOADER_WORKERS, cores // processes_here - 1))


def _decode_image_files_in_workers(parser: HfArgumentParser, argv: Sequence[str]) -> None:
    """
    Makes [`dataloader_workers_for_images`] the default of `--dataloader_num_workers` when `--dataset` is not the
    shapes dataset and the command line does not set it. Decoding a batch of JPEG files and making pixel tensors of
    them then happens while the model trains on the previous batch, instead of between steps. The shapes dataset
    keeps 0 workers: its small in-memory images gain little from workers, and the workers' seeds would draw from the
    run's random numbers, changing the published shapes results.
    """
    probe = argparse.ArgumentParser(add_help=False)  # reads only these two options, as the full parser does
    probe.add_argument("--dataset", default=parser.get_default("dataset"))
    probe.add_argument("--dataloader_num_workers", "--dataloader-num-workers", default=None)
    given, _ = probe.parse_known_args(list(argv))
    if given.dataset != "shapes" and given.dataloader_num_workers is None:
        parser.set_defaults(dataloader_num_workers=dataloader_workers_for_images())


def check_pretraining_leaves_steps(training_args: RLCaptionConfig) -> None:
    """
    Refuses a `max_steps` that a pretraining phase of the method (its `*_pretraining_steps`, the captioner fixed)
    uses up: the recipe would end, and write a card, as if the captioner had been trained. `max_steps` counts the
    pretraining steps too.
    """
    for option in (name for name in vars(training_args) if name.endswith("_pretraining_steps")):
        pretraining_steps = getattr(training_args, option)
        if 0 < training_args.max_steps <= pretraining_steps:
            raise ValueError(
                f"--max_steps {training_args.max_steps} ends within the {pretraining_steps} steps of --{option}, so "
                f"the captioner would not be trained: set --max_steps above {pretraining_steps} (it counts the "
                f"pretraining steps too), or lower --{option}."
            )


def check_the_captioner_gets_steps(trainer: RLCaptionTrainer, script_args: RecipeArguments) -> None:
    """[`check_pretraining_leaves_steps`] for a budget in epochs, once the trainer knows its steps (unless
    `--pretraining_only`)."""
    if script_args.pretraining_only:
        return
    planned = trainer.planned_steps()
    steps = trainer.objective.steps_by_phase(planned)
    last_phase = trainer.objective.phases()[-1].name
    if steps[last_phase] == 0:
        raise ValueError(
            f"The run's {planned} optimizer steps all go to pretraining ({steps}): the captioner "
            "would not be trained. Train for more steps (--num_train_epochs, --max_steps) or shorten the pretraining."
        )


def phase_steps_description(trainer: RLCaptionTrainer) -> str:
    """The optimizer steps each phase of the run took, for its model card: `"100 value_pretraining, 125 joint"`."""
    steps = trainer.objective.steps_by_phase(trainer.state.global_step)
    return ", ".join(f"{count} {phase}" for phase, count in steps.items())


def resolve_resume_from_checkpoint(value: str | bool | None, output_dir: str, overwrite_output_dir: bool = False):
    """
    Where a recipe's training resumes from, decided before any data is loaded so that a wrong value fails at once.

    Args:
        value: `--resume_from_checkpoint` as given: a checkpoint folder; `true` (or no value) for the newest complete
            checkpoint of `output_dir`; `false` to start afresh; `None` (not given) to resume automatically when
            `output_dir` has a complete checkpoint, as a relaunched job expects, unless `overwrite_output_dir`.
        output_dir: the run's `--output_dir`.

    Returns:
        A checkpoint folder, or `None` to start from the beginning.

    Raises:
        `FileNotFoundError`: a named folder that does not exist, or `true` with no complete checkpoint to resume from.
    """
    if isinstance(value, bool):
        value = str(value)
    if value is None:
        if overwrite_output_dir:
            return None
        checkpoint = last_complete_checkpoint(output_dir)
        if checkpoint is not None:
            print(
                f"Resuming from {checkpoint}, the newest complete checkpoint in --output_dir {output_dir}; pass "
                "--overwrite_output_dir to start again, or --resume_from_checkpoint <folder> to pick another."
            )
        return checkpoint
    if value.lower() in _FALSE_WORDS:
        return None
    if value.lower() in _TRUE_WORDS:
        checkpoint = last_complete_checkpoint(output_dir)
        if checkpoint is None:
            raise FileNotFoundError(
                f"--resume_from_checkpoint {value}: --output_dir {output_dir} has no complete checkpoint-<step> "
                "folder to resume from. Check --output_dir, or drop the flag to start a new run."
            )
        return checkpoint
    if not os.path.isdir(value):
        raise FileNotFoundError(
            f"--resume_from_checkpoint {value}: no such checkpoint folder. Name a checkpoint-<step> folder of an "
            f"earlier run, or pass `true` for the newest one in --output_dir."
        )
    return value
