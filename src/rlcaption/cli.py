"""The `rlcaption` console command: `caption`, `evaluate`, `demo`, `extract-features`, `download-spice`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def _add_lookahead_argument(parser: argparse.ArgumentParser, note: str = "") -> None:
    parser.add_argument(
        "--lookahead-lambda",
        type=float,
        default=None,
        help="For a model with a value network (a PolicyValueCaptioner, Ren et al. 2017): the beam search ranks every "
        "extension by λ·log p + (1 − λ)·v, λ in [0, 1] (Ren et al. report 0.4; 1 is plain beam search). Needs "
        "--num-beams >= 2. Plain beam search when omitted." + note,
    )


def _lookahead_kwargs(model, args: argparse.Namespace) -> dict[str, float]:
    """The `generate` argument of `--lookahead-lambda`, refused for a model without a value network or beams."""
    if args.lookahead_lambda is None:
        return {}
    from .models import PolicyValueCaptioner

    if not isinstance(model, PolicyValueCaptioner):
        raise ValueError(
            f"--lookahead-lambda needs a model with a value network (a PolicyValueCaptioner, e.g. trained by "
            f"examples/train_actor_critic.py); {args.model} is a {type(model).__name__}. Drop the option."
        )
    if args.num_beams < 2:
        raise ValueError(f"--lookahead-lambda is a beam search: pass --num-beams >= 2, got {args.num_beams}.")
    return {"lookahead_lambda": args.lookahead_lambda}


def _configure_caption_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "images",
        nargs="+",
        help="Image files or folders of images to caption; an image that cannot be read is skipped with a warning.",
    )
    parser.add_argument("--model", required=True, help="Model folder or Hub id (e.g. a published rlcaption model).")
    parser.add_argument("--num-beams", type=int, default=3, help="Beam size (1 = greedy).")
    parser.add_argument(
        "--max-length", type=int, default=21, help="Maximum caption length in tokens, the start token included."
    )
    parser.add_argument("--num-captions", type=int, default=1, help="Captions per image (at most --num-beams).")
    parser.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit) of --model.")
    _add_lookahead_argument(parser)


def _readable_image_files(images: Sequence[str]) -> list[str]:
    """The image files of `images` (files and folders) that decode; each one that does not is named in a warning."""
    from .data import find_undecodable_images
    from .inference import list_image_files

    paths = list_image_files(images)
    undecodable = find_undecodable_images(paths)
    for position, problem in undecodable.items():
        print(
            f"rlcaption caption: warning: skipped {paths[position]}, which cannot be read: {problem}", file=sys.stderr
        )
    if len(undecodable) == len(paths):
        raise ValueError(f"None of the {len(paths)} image files can be read; nothing to caption.")
    return [path for position, path in enumerate(paths) if position not in undecodable]


def _run_caption(args: argparse.Namespace) -> None:
    from .inference import caption_image_files, load_captioner

    if args.num_captions > args.num_beams:
        raise SystemExit(f"--num-captions ({args.num_captions}) cannot exceed --num-beams ({args.num_beams}).")
    paths = _readable_image_files(args.images)  # before the model is loaded: a wrong path fails at once
    model, processor = load_captioner(args.model, revision=args.revision, argument_name="--model")
    captions = caption_image_files(
        model,
        processor,
        paths,
        num_beams=args.num_beams,
        num_return_sequences=args.num_captions,
        max_length=args.max_length,
        **_lookahead_kwargs(model, args),
    )
    for index, path in enumerate(paths):
        for caption in captions[index * args.num_captions : (index + 1) * args.num_captions]:
            print(f"{path}\t{caption}")


def _configure_evaluate_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="Model folder or Hub id.")
    parser.add_argument(
        "--dataset",
        default="shapes",
        help="`shapes` (as every recipe, benchmark and published card has it: 48-pixel images, 500 test images), a "
        "folder written by `save_to_disk`, an `rlcaption extract-features` output folder (as the recipes' "
        "--image_features names it), or a folder of images with captions in `metadata.jsonl` files "
        "(`rlcaption.data.load_caption_imagefolder`).",
    )
    parser.add_argument("--split", default="test", help="Dataset split to caption.")
    parser.add_argument("--num-beams", type=int, default=3)
    parser.add_argument(
        "--max-length", type=int, default=21, help="Maximum caption length in tokens, the start token included."
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--metrics",
        nargs="*",
        default=None,
        help="Metrics among bleu, meteor, rouge_l, cider, spice, spider; all when omitted.",
    )
    parser.add_argument(
        "--caption-sets",
        nargs="*",
        default=[],
        choices=["sample", "beam"],
        help="Also caption every image --set-size times, by random sampling and/or as the top of a beam search of "
        "that width, and score the sets as Chen & Jin's Table 4 does: mean CIDEr-D, Div-1, Div-2, mBLEU-4 and, on "
        "shapes, object F1 (keys sample5_CIDEr, beam5_Div-2, ...).",
    )
    parser.add_argument("--set-size", type=int, default=5, help="Captions per image of each caption set.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the sampled caption sets.")
    parser.add_argument(
        "--save-captions",
        default=None,
        metavar="FILE",
        help="Also write what was scored to FILE as JSON: per image its id, the model's caption and the references.",
    )
    _add_lookahead_argument(parser, note=" The caption sets are decoded without it.")


# Above this share of empty captions an evaluation is most likely of a vocabulary that maps most words to <unk>
# (decoded as "") or of a model that ends every caption at once: the scores are then near 0 and say nothing.
_MOSTLY_EMPTY = 0.5


def _warn_if_captions_are_mostly_empty(predictions: dict) -> None:
    empty = sum(not caption.strip() for caption in predictions.values())
    if predictions and empty / len(predictions) > _MOSTLY_EMPTY:
        print(
            f"rlcaption evaluate: warning: {empty} of the {len(predictions)} captions are empty, so the scores are "
            "near 0. A vocabulary that leaves most words <unk> (a --min_word_count too high for a small dataset) or "
            "a model trained too briefly does this; --save-captions FILE shows what was scored.",
            file=sys.stderr,
        )


def _run_evaluate(args: argparse.Namespace) -> None:
    from .evaluation import (
        caption_dataset,
        caption_set_prefix,
        caption_set_scores,
        caption_sets,
        scene_grounding_scores,
    )
    from .inference import check_features_match_model, load_captioner
    from .metrics import evaluate_captions
    from .recipes import RecipeArguments, load_recipe_dataset

    model, processor = load_captioner(args.model, argument_name="--model")
    lookahead = _lookahead_kwargs(model, args)  # before the dataset is loaded: a wrong option fails at once
    # the recipes' data (on shapes, the benchmark's images, on which the model cards were scored)
    dataset = load_recipe_dataset(RecipeArguments(dataset=args.dataset))
    if args.split not in dataset:
        raise SystemExit(f"Split {args.split!r} not in the dataset; it has {sorted(dataset)}.")
    check_features_match_model(model, dataset, args.dataset if args.dataset != "shapes" else None)
    split = dataset[args.split]
    # `evaluate_model`'s steps, kept apart so that the scored captions can be checked and saved
    predictions, references = caption_dataset(
        model, processor, split, batch_size=args.batch_size, num_beams=args.num_beams, max_length=args.max_length,
        **lookahead,
    )  # fmt: skip
    _warn_if_captions_are_mostly_empty(predictions)
    scores = {**evaluate_captions(predictions, references, metrics=args.metrics)}
    scores.update(scene_grounding_scores(predictions, split))
    if args.save_captions is not None:
        scored = [
            {"image_id": key, "caption": caption, "references": references[key]}
            for key, caption in predictions.items()
        ]
        with open(args.save_captions, "w", encoding="utf-8") as file:
            json.dump(scored, file, indent=2, default=str)
    for decoding in args.caption_sets:
        sets, set_references = caption_sets(
            model, processor, split, decoding, set_size=args.set_size,
            max_new_tokens=args.max_length - 1, batch_size=args.batch_size, seed=args.seed,
        )  # fmt: skip
        prefix = caption_set_prefix(decoding, args.set_size)
        set_scores = caption_set_scores(sets, set_references, split)
        scores.update({prefix + name: value for name, value in set_scores.items()})
    print(json.dumps(scores, indent=2))


def _configure_demo_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default="runs/demo", help="Where the XE and SCST models are written.")
    parser.add_argument("--quick", action="store_true", help="A much smaller run (a smoke test of the recipe).")


def _run_demo(args: argparse.Namespace) -> None:
    from .shapes.demo import run_demo

    run_demo(output_dir=args.output_dir, quick=args.quick)


def _configure_extract_features_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Add a precomputed `image_features` column (pooled, or grids with --pooling none) to a captioning dataset "
        "with any transformers vision backbone. Resumable: rerun the same command after an interruption."
    )
    parser.add_argument(
        "--dataset",
        required=True,
        help="`shapes` for the embedded synthetic dataset (default sizes), or a folder written by `save_to_disk`.",
    )
    parser.add_argument("--model", required=True, help="Hub id or local folder of the vision backbone.")
    parser.add_argument("--output-dir", required=True, help="Where shards and the resulting dataset are written.")
    parser.add_argument("--batch-size", type=int, default=32, help="Images per forward pass (default: 32).")
    parser.add_argument("--split", default=None, help="Process only this split (default: all splits).")
    parser.add_argument("--device", default=None, help="Device, e.g. `cpu` or `cuda:0` (default: cuda if available).")
    parser.add_argument("--shard-size", type=int, default=1024, help="Rows per resumable shard (default: 1024).")
    parser.add_argument(
        "--pooling",
        choices=("auto", "none"),  # the encoders' POOLING_MODES, which this parser must not import
        default="auto",
        help="`auto`: one vector per image (the backbone's pooler output, else the mean over positions); `none`: "
        "the grid of positions, (N, D) per image, for attention (a ResNet's 7x7x2048 is 49x2048). Default: auto.",
    )


def _run_extract_features(args: argparse.Namespace) -> None:
    from .data.features import run_extract_features

    run_extract_features(args)


def _configure_download_spice_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Download the Stanford CoreNLP 3.6.0 jars SPICE needs (~400 MB, from the Stanford NLP site) and the "
        "standalone Nashorn engine SPICE needs on Java >= 15 (from Maven Central)."
    )
    parser.add_argument(
        "--target-dir",
        default=None,
        help="directory for the jars (default: $RLCAPTION_SPICE_LIB or pycocoevalcap/spice/lib)",
    )
    parser.add_argument(
        "--corenlp-url",
        default=None,
        help="URL of stanford-corenlp-full-2015-12-09.zip (default: the Stanford site's)",
    )
    parser.add_argument(
        "--maven-url", default=None, help="Maven repository for Nashorn and ASM (default: Maven Central)"
    )
    parser.add_argument(
        "--no-nashorn", action="store_true", help="skip the Nashorn jars (only SPICE on Java 8-14 will work)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def _run_download_spice(args: argparse.Namespace) -> None:
    from .metrics.spice import run_download_spice

    run_download_spice(args)


def build_parser() -> argparse.ArgumentParser:
    """
    The parser of every subcommand. It imports nothing heavy, so that `--help` and argument errors answer at once;
    each subcommand imports what it needs when it runs.
    """
    parser = argparse.ArgumentParser(prog="rlcaption", description="Reinforcement learning for image captioning.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    commands = [
        ("caption", "Caption image files with a trained model.", _configure_caption_parser, _run_caption),
        ("evaluate", "Score a model on a dataset split.", _configure_evaluate_parser, _run_evaluate),
        ("demo", "Train XE then SCST on the shapes dataset and compare.", _configure_demo_parser, _run_demo),
        (
            "extract-features",
            "Add precomputed image features to a dataset.",
            _configure_extract_features_parser,
            _run_extract_features,
        ),
        (
            "download-spice",
            "Fetch the Stanford CoreNLP jars SPICE needs (needs internet).",
            _configure_download_spice_parser,
            _run_download_spice,
        ),
    ]
    for name, help_text, configure, run in commands:
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        configure(subparser)
        subparser.set_defaults(run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from . import api  # noqa: F401  (the whole API, and the Auto classes registered, as `import rlcaption` gives)

    try:
        args.run(args)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        # Library errors already say what went wrong and how to fix it; a traceback adds nothing for a CLI user.
        print(f"rlcaption {args.command}: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
