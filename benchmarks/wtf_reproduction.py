"""
Reproduction of Chaffin et al. 2024 (WTF-RL) on shapes: the variants of the paper's Table 1 (`tf`, `wtf`, `wtf_rl`,
`rl`, `rl_unidirectional`, `scst_discriminator`) and `rl` without the discriminator (α = 1), each
`examples/train_wtf.py` from the published XE warm start over several seeds, judged by retrieval in both directions by
the reward CLIP and by the evaluator CLIP (which no reward used, so a caption that only fools the reward CLIP shows),
BLEU-4, ROUGE-L, CIDEr-D, Self-BLEU, the scene object F1 and the share of parse failures (the discriminator should keep
captions parseable where RL alone drifts).

    python benchmarks/wtf_reproduction.py --output-dir runs/wtf_reproduction --jobs 2

The policy's learning rate is chosen on the validation split: every variant runs at each `--learning-rates`, and the
largest rate at which no seed of any variant collapses on validation (parse failures above `--collapse-parse-failures`)
is kept. At that rate, the variants whose reward has a discriminator run again with the discriminator reading the
image's CLIP embedding beside the caption's (`--discriminator_input image_text`, as the authors' code does), and the
test split is read once for every run at the chosen rate.

Prints the validation table of every rate and the test table at the chosen one (mean ± s.d. over seeds) with the
verdict of each of the paper's claims on test by the rule of `verdicts.py` (paired by seed: every variant's seed
starts from the same warm start with the same data order), writes `<output-dir>/results.json`, plots the
evaluator's test text-to-image R@1 against CIDEr-D (`--plot`), with `--page` writes the tables and verdicts into
docs/methods/wtf.md, and with `--card` puts the test table and the verdicts into a checkpoint's model card. Runs
whose scores exist are read, not trained again; `--from-results` renders a results.json without reading any run.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import partial
from pathlib import Path

from reproduction import (
    EVALUATOR_CLIP,
    REPOSITORY,
    WARM_START,
    GeneratedPage,
    benchmark_command,
    code_version,
    markdown_table,
    plot_to,
    provenance_line,
    run_recipe_once,
    summarise,
    write_card_section,
)
from verdicts import Headline, judge_headlines, verdict_lines

# the page, README row and kept results its `--page` writes
PAGE = GeneratedPage(Path(__file__).name, REPOSITORY / "docs" / "methods" / "wtf.md", "wtf")

# the rows of Table 1, and `rl` without the discriminator's part of the reward (α = 1): what the discriminator prevents
VARIANT_OPTIONS = {
    "tf": ["--wtf_variant", "tf"],
    "wtf": ["--wtf_variant", "wtf"],
    "wtf_rl": ["--wtf_variant", "wtf_rl"],
    "rl": ["--wtf_variant", "rl"],
    "rl_unidirectional": ["--wtf_variant", "rl_unidirectional"],
    "scst_discriminator": ["--wtf_variant", "scst_discriminator"],
    "rl_no_discriminator": ["--wtf_variant", "rl", "--wtf_alpha", "1"],
}
VARIANTS = tuple(VARIANT_OPTIONS)
# the variants whose reward has the discriminator's part (α < 1); `tf` trains on the ground truth alone
DISCRIMINATOR_VARIANTS = ("wtf", "wtf_rl", "rl", "rl_unidirectional", "scst_discriminator")
IMAGE_TEXT = ", image_text"
# Chaffin et al. 2024's claims (Table 1), on test at the chosen rate, by the evaluator CLIP no reward used
HEADLINES = (
    Headline("t2i_R@1", "wtf", "tf", "higher", "evaluator T2I R@1"),
    Headline("t2i_R@1", "wtf_rl", "tf", "higher", "evaluator T2I R@1"),
    Headline("CIDEr", "wtf_rl", "rl", "higher", "CIDEr-D"),
    Headline("t2i_R@1", "rl", "tf", "higher", "evaluator T2I R@1"),
    Headline("t2i_R@1", "rl_unidirectional", "rl", "lower", "evaluator T2I R@1"),
    # the discriminator keeps the writing: RL with it against RL without (α = 1)
    Headline("CIDEr", "rl", "rl_no_discriminator", "higher", "CIDEr-D"),
    Headline("object_f1", "rl", "rl_no_discriminator", "higher", "object F1"),
    # the authors' discriminator reads the image's embedding too
    Headline("i2t_R@1", f"wtf_rl{IMAGE_TEXT}", "wtf_rl", "higher", "evaluator I2T R@1"),
)
COLUMNS = (
    ("reward_clip_t2i_R@1", "reward CLIP T2I R@1"),
    ("reward_clip_i2t_R@1", "reward CLIP I2T R@1"),
    ("t2i_R@1", "evaluator T2I R@1"),
    ("t2i_R@5", "evaluator T2I R@5"),
    ("i2t_R@1", "evaluator I2T R@1"),
    ("Bleu_4", "BLEU-4"),
    ("ROUGE_L", "ROUGE-L"),
    ("CIDEr", "CIDEr-D"),
    ("Self-BLEU", "Self-BLEU"),
    ("object_f1", "object F1"),
    ("parse_failure_share", "parse failures"),
)


def _options(variant: str, seed: int, max_steps: int, learning_rate: float) -> list[str]:
    """`variant` is a key of `VARIANT_OPTIONS`, or one of `DISCRIMINATOR_VARIANTS` followed by `IMAGE_TEXT`."""
    discriminator = ["--discriminator_input", "image_text"] if variant.endswith(IMAGE_TEXT) else []
    return [
        "--model_name_or_path", WARM_START, *VARIANT_OPTIONS[variant.removesuffix(IMAGE_TEXT)], *discriminator,
        "--seed", str(seed),
        "--learning_rate", f"{learning_rate:g}", "--max_steps", str(max_steps), "--use_cpu", "--save_strategy", "no",
        "--eval_strategy", "no", "--eval_clip", EVALUATOR_CLIP, "--report_to", "none", "--disable_tqdm", "True",
        "--logging_steps", "25", "--overwrite_output_dir", "True", "--score_validation", "True",
    ]  # fmt: skip


def chosen_learning_rate(results: dict[tuple[str, float], list[dict]], collapse_parse_failures: float) -> float:
    """
    The largest learning rate at which no seed of any variant has a validation share of parse failures above
    `collapse_parse_failures` (`results`: `{(variant, learning rate): [{split: scores} of each seed]}`); the smallest
    rate when every rate collapses somewhere.
    """
    learning_rates = sorted({learning_rate for _, learning_rate in results}, reverse=True)
    for learning_rate in learning_rates:
        failures = [
            run["validation"]["parse_failure_share"] or 0.0
            for (_, rate), runs in results.items()
            if rate == learning_rate
            for run in runs
        ]
        if max(failures) <= collapse_parse_failures:
            return learning_rate
    return learning_rates[-1]


def _plot(rows: dict[str, dict[str, tuple[float, float]]], learning_rate: float, path: Path) -> None:
    with plot_to(path, figsize=(9, 4.5), legend_outside=True) as axes:
        for variant, summary in rows.items():
            (x, x_err), (y, y_err) = summary["CIDEr"], summary["t2i_R@1"]
            # a variant and its image-reading discriminator share a colour; the marker tells them apart
            colour = f"C{VARIANTS.index(variant.removesuffix(IMAGE_TEXT))}"
            axes.errorbar(
                x, y, xerr=x_err, yerr=y_err, capsize=3, linestyle="none", color=colour,
                marker="s" if variant.endswith(IMAGE_TEXT) else "o", label=variant,
            )  # fmt: skip
        axes.set_xlabel("CIDEr-D (test, beam search)")
        axes.set_ylabel("text-to-image R@1 by the evaluator CLIP (test)")
        axes.set_title(
            f"Shapes: WTF-RL variants at lr {learning_rate:g}, chosen on validation (mean ± s.d. over seeds)",
            fontsize=9,
        )


def run_name(variant: str, learning_rate: float) -> str:
    """A run's row in the validation table and its key in `results.json`: `wtf_rl, image_text, lr 3e-05`."""
    return f"{variant}, lr {learning_rate:g}"


def run_reproduction(args: argparse.Namespace) -> dict:
    """Trains the runs that are not cached, reads the others, and returns what `results.json` holds."""
    output_dir = args.output_dir.resolve()

    def run_all(pool, arms: list[tuple[str, float]]) -> dict[tuple[str, float], list[dict]]:
        futures = {
            (variant, learning_rate): [
                pool.submit(
                    run_recipe_once,
                    "train_wtf.py",
                    output_dir / f"{variant.replace(IMAGE_TEXT, '-image-text')}-lr{learning_rate:g}-seed{seed}",
                    _options(variant, seed, args.max_steps, learning_rate),
                )  # fmt: skip
                for seed in args.seeds
            ]
            for variant, learning_rate in arms
        }
        return {arm: [future.result() for future in runs] for arm, runs in futures.items()}

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = run_all(pool, [(v, rate) for rate in args.learning_rates for v in args.variants])
        learning_rate = chosen_learning_rate(runs, args.collapse_parse_failures)
        runs.update(run_all(pool, [(f"{v}{IMAGE_TEXT}", learning_rate) for v in args.image_text_variants]))
    results = {
        "command": benchmark_command(),
        "code": code_version(),
        "seeds": args.seeds,
        "max_steps": args.max_steps,
        "learning_rate": learning_rate,
        "runs": {run_name(variant, rate): seeds for (variant, rate), seeds in runs.items()},
    }
    return results | {"verdicts": [asdict(comparison) for comparison in comparisons_of(results)]}


def chosen_runs(results: dict) -> dict[str, list[dict]]:
    """Each variant's runs at the chosen learning rate, by variant."""
    suffix = f", lr {results['learning_rate']:g}"
    return {name.removesuffix(suffix): runs for name, runs in results["runs"].items() if name.endswith(suffix)}


def comparisons_of(results: dict) -> list:
    """The paper's claims judged on test at the chosen rate, paired by seed."""
    per_seed = {
        variant: {seed: run["test"] for seed, run in zip(results["seeds"], runs, strict=True)}
        for variant, runs in chosen_runs(results).items()
    }
    return judge_headlines(per_seed, HEADLINES)


def render_tables(results: dict) -> list[str]:
    """The validation table of every variant and rate, the test table at the chosen rate, and the verdicts."""
    keys = [name for name, _ in COLUMNS]
    table = partial(markdown_table, columns=COLUMNS, first_header="variant")
    runs, chosen = results["runs"], chosen_runs(results)
    validation = {name: summarise([run["validation"] for run in seeds], keys) for name, seeds in runs.items()}
    test = {variant: summarise([run["test"] for run in seeds], keys) for variant, seeds in chosen.items()}
    return [
        f"Validation split (200 images), {results['max_steps']} steps of each variant from the XE warm start\n\n"
        + table(validation, {name: len(seeds) for name, seeds in runs.items()}),
        f"Shapes test split (500 images), {results['max_steps']} steps of each variant from the XE warm start at "
        f"learning rate {results['learning_rate']:g} (the largest with no collapse on validation)\n\n"
        + table(test, {variant: len(seeds) for variant, seeds in chosen.items()}),
        verdict_lines(comparisons_of(results)),
    ]


def page_block(results: dict) -> str:
    """What docs/methods/wtf.md shows between this benchmark's markers."""
    selection = "the learning rate chosen on validation, the verdicts read on test"
    return "\n\n".join([provenance_line(results, selection), *render_tables(results)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/wtf_reproduction"))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument(
        "--image-text-variants", nargs="*", default=list(DISCRIMINATOR_VARIANTS), choices=DISCRIMINATOR_VARIANTS,
        help="Variants run again at the chosen rate with the discriminator reading the image too.",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--max-steps", type=int, default=250, help="Training steps of every run (250: one epoch).")
    parser.add_argument(
        "--learning-rates", type=float, nargs="+", default=[1e-4, 3e-5], help="The policy's learning rates."
    )
    parser.add_argument(
        "--collapse-parse-failures", type=float, default=0.05,
        help="A run whose validation captions fail to parse more often than this has collapsed.",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="Trainings run side by side (one core each).")
    parser.add_argument("--plot", type=Path, default=REPOSITORY / "docs" / "wtf_variants.png")
    parser.add_argument("--card", type=Path, default=None, help="A model card (README.md) to put the table into.")
    PAGE.add_arguments(parser)
    args = parser.parse_args()
    results, tables = PAGE.report(
        args, lambda: run_reproduction(args), args.output_dir, render_tables, page_block, comparisons_of
    )
    if args.card is not None:
        section = f"`{results['command']}`:\n\n" + "\n\n".join(tables[1:])
        write_card_section(args.card, "Table 1 of the paper on shapes", section)
    keys = [name for name, _ in COLUMNS]
    test = {
        variant: summarise([run["test"] for run in seeds], keys) for variant, seeds in chosen_runs(results).items()
    }
    _plot(test, results["learning_rate"], args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
