"""
Reproduction of Chen & Jin 2020 (sequence-level exploration) on shapes: XE, SLL (SCST), SLL-ME (SCST + entropy bonus)
and SLE, over several seeds, judged by the paper's Table 4 protocol (5 random samples per image, and the beam-5 top 5:
mean CIDEr-D, Div-1, Div-2, mBLEU-4) plus the scene object F1 of the samples and the evaluator CLIP's text-to-image
R@1 of the beam-5 caption; then SLE's alpha sweep, plotted as CIDEr-D vs Div-2 of the samples.

    python benchmarks/sle_reproduction.py --output-dir runs/sle_reproduction --jobs 2

Every run is `examples/train_sle.py` from the published XE warm start (`checkpoints/show-tell-rl-shapes-xe`), one
epoch on the 4,000 training images, scored on the validation and test splits (`<output-dir>/<run>/eval_results.json`);
a run whose scores exist is not trained again, so an interrupted reproduction continues where it stopped. The XE rows
score the warm start itself with the same protocol. The method table uses the paper's α = 0.75 and reads the test
split; the α sweep, where one would choose α, is shown on the validation split. Prints Markdown tables (mean ±
standard deviation over seeds), the verdict of each of the paper's claims on test by the rule of `verdicts.py`
(paired by seed: every method's seed starts from the same warm start with the same data order), and writes
`<output-dir>/results.json` and the plot `--plot`; `--page` writes the tables and verdicts into docs/methods/sle.md,
`--from-results` renders a results.json without reading any run.
"""

from __future__ import annotations

import argparse
import os
import sys
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
    run_key,
    run_once,
    run_recipe_once,
    summarise,
)
from verdicts import Headline, judge_headlines, verdict_lines

# the page, README row and kept results its `--page` writes
PAGE = GeneratedPage(Path(__file__).name, REPOSITORY / "docs" / "methods" / "sle.md", "sle")

# method -> the recipe options that select it
METHODS = {
    "SLL": ["--objective", "scst"],
    "SLL-ME": ["--objective", "scst", "--entropy_bonus_weight", "1e-2"],
    "SLE": ["--objective", "sle", "--sle_alpha", "0.75"],
}
# Chen & Jin 2020's claims (Table 4), SLE against SLL on test: more diverse samples at no loss of CIDEr-D (judged in
# the direction "not below": "opposite" there means the diversity was bought with CIDEr-D)
HEADLINES = (
    Headline("sample5_Div-2", "SLE", "SLL", "higher", "Div-2 of 5 samples"),
    Headline("sample5_mBLEU-4", "SLE", "SLL", "lower", "mBLEU-4 of 5 samples"),
    Headline("sample5_CIDEr", "SLE", "SLL", "higher", "CIDEr-D of 5 samples"),
    Headline("CIDEr", "SLE", "SLL", "higher", "CIDEr-D (beam 5)"),
)
# (score key, header); sample5_* are the 5 random samples per image, beam5_* the beam-5 top 5
COLUMNS = (
    ("CIDEr", "CIDEr-D (beam 5)"),
    ("sample5_CIDEr", "CIDEr-D (5 samples)"),
    ("sample5_Div-1", "Div-1"),
    ("sample5_Div-2", "Div-2"),
    ("sample5_mBLEU-4", "mBLEU-4"),
    ("sample5_object_f1", "object F1"),
    ("beam5_CIDEr", "CIDEr-D (beam top 5)"),
    ("beam5_Div-2", "Div-2 (beam top 5)"),
    ("beam5_mBLEU-4", "mBLEU-4 (beam top 5)"),
    ("t2i_R@1", "t2i R@1"),
)


def _common_options(seed: int, num_train_images: int) -> list[str]:
    return [
        "--model_name_or_path", WARM_START, "--seed", str(seed), "--num_train_images", str(num_train_images),
        "--use_cpu", "--save_strategy", "no", "--eval_strategy", "no", "--eval_clip", EVALUATOR_CLIP,
        "--report_to", "none", "--disable_tqdm", "True", "--logging_steps", "25", "--overwrite_output_dir", "True",
        "--score_validation", "True",
    ]  # fmt: skip


def _score_warm_start(run_dir: Path, seed: int) -> dict[str, dict[str, float]]:
    """The XE warm start judged with the recipe's own evaluation (no training step), by split."""
    options = _common_options(seed, 4000)

    def evaluate() -> dict[str, dict[str, float]]:
        sys.path.insert(0, str(REPOSITORY / "examples"))
        import train_sle

        from rlcaption.recipes import load_pretrained_captioner, load_recipe_dataset, parse_recipe_arguments
        from rlcaption.trainer import RLCaptionTrainer

        os.chdir(REPOSITORY)
        script_args, args = parse_recipe_arguments(
            train_sle.ScriptArguments, train_sle.RECIPE_DEFAULTS,
            ["--output_dir", str(run_dir), *options], train_sle.CONFIG_CLASSES,
        )  # fmt: skip
        model, processor = load_pretrained_captioner(script_args.model_name_or_path)
        dataset = load_recipe_dataset(script_args)
        trainer = RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=dataset["train"])
        scores = {split: trainer.evaluate(dataset[split], metric_key_prefix=split) for split in ("validation", "test")}
        return {
            split: {key.removeprefix(f"{split}_"): value for key, value in split_scores.items()}
            for split, split_scores in scores.items()
        }

    return run_once(
        run_dir, run_key("train_sle.py, its evaluation of the warm start without training", options), evaluate
    )


def _plot(
    rows: dict[str, dict[str, tuple[float, float]]], alphas: dict[str, float], num_seeds: dict[str, int], path: Path
) -> None:
    """CIDEr-D vs Div-2 of the samples: SLE's alpha curve beside the SLL baselines (XE, far to the right, left out)."""
    counts = sorted({num_seeds[name] for name in (*alphas, "SLL", "SLL-ME")})
    seeds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"

    def point(name):
        (x, x_err), (y, y_err) = rows[name]["sample5_Div-2"], rows[name]["sample5_CIDEr"]
        return x, y, x_err, y_err

    with plot_to(path) as axes:
        curve = sorted((alpha, *point(name)) for name, alpha in alphas.items())
        axes.plot([x for _, x, _, _, _ in curve], [y for _, _, y, _, _ in curve], color="tab:red", alpha=0.5)
        for alpha, x, y, x_err, y_err in curve:
            axes.errorbar(x, y, xerr=x_err, yerr=y_err, marker="o", color="tab:red", capsize=3)
            axes.annotate(f"α={alpha:g}", (x, y), fontsize=8, xytext=(4, 4), textcoords="offset points")
        for name, color in (("SLL", "tab:blue"), ("SLL-ME", "tab:green")):
            x, y, x_err, y_err = point(name)
            axes.errorbar(
                x, y, xerr=x_err, yerr=y_err, marker="s", color=color, capsize=3, linestyle="none", label=name
            )
        axes.plot([], [], marker="o", color="tab:red", label="SLE (α = 1 … 0.5)")
        axes.set_xlabel("Div-2 of 5 random samples per image (higher: more diverse)")
        axes.set_ylabel("mean CIDEr-D of the 5 samples")
        axes.set_title(f"Shapes validation split, one epoch from XE (mean ± s.d. over {seeds} seeds)", fontsize=10)


def run_reproduction(args: argparse.Namespace) -> dict:
    """Trains the runs that are not cached, reads the others, and returns what `results.json` holds."""
    output_dir = args.output_dir.resolve()
    jobs = {}  # row name -> [(run dir, options)]
    for method, options in METHODS.items():
        for seed in args.seeds:
            jobs.setdefault(method, []).append(
                (output_dir / f"{method.lower()}-seed{seed}", options + _common_options(seed, args.num_train_images))
            )
    for alpha in args.alphas:
        for seed in args.alpha_seeds:
            options = ["--objective", "sle", "--sle_alpha", str(alpha)] + _common_options(seed, args.num_train_images)
            jobs.setdefault(f"SLE α={alpha:g}", []).append((output_dir / f"sle-alpha{alpha:g}-seed{seed}", options))

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            name: [pool.submit(run_recipe_once, "train_sle.py", run_dir, options) for run_dir, options in runs]
            for name, runs in jobs.items()
        }
        runs = {"XE": [_score_warm_start(output_dir / f"xe-seed{seed}", seed) for seed in args.seeds]}
        runs.update({name: [future.result() for future in seeds] for name, seeds in futures.items()})
    results = {
        "command": benchmark_command(),
        "code": code_version(),
        "seeds": args.seeds,
        "runs": runs,
        "run_seeds": {name: args.alpha_seeds if name.startswith("SLE α") else args.seeds for name in runs},
    }
    return results | {"verdicts": [asdict(comparison) for comparison in comparisons_of(results)]}


def comparisons_of(results: dict) -> list:
    """The paper's claims judged on test, paired by seed."""
    per_seed = {
        name: {seed: run["test"] for seed, run in zip(results["run_seeds"][name], runs, strict=True)}
        for name, runs in results["runs"].items()
    }
    return judge_headlines(per_seed, HEADLINES)


def render_tables(results: dict) -> list[str]:
    """The test table of the methods, the validation table of the α sweep, and the verdicts."""
    table = partial(markdown_table, columns=COLUMNS)
    keys = [key for key, _ in COLUMNS]
    runs = results["runs"]
    test = {name: summarise([run["test"] for run in seeds], keys) for name, seeds in runs.items()}
    validation = {name: summarise([run["validation"] for run in seeds], keys) for name, seeds in runs.items()}
    num_seeds = {name: len(seeds) for name, seeds in runs.items()}
    sweep_names = ["SLL", "SLL-ME", "SLE", *(name for name in validation if name.startswith("SLE α"))]
    return [
        "Shapes test split (500 images), from the XE warm start, one epoch each\n\n"
        + table({name: test[name] for name in ("XE", *METHODS)}, num_seeds),
        "SLE alpha sweep, validation split (200 images), with the SLL baselines\n\n"
        + table(
            {"SLE α=0.75" if name == "SLE" else name: validation[name] for name in sweep_names},
            {"SLE α=0.75": num_seeds["SLE"], **num_seeds},
        ),
        verdict_lines(comparisons_of(results)),
    ]


def page_block(results: dict) -> str:
    """What docs/methods/sle.md shows between this benchmark's markers."""
    selection = "the paper's α = 0.75 read on test, the α sweep on validation"
    return "\n\n".join([provenance_line(results, selection), *render_tables(results)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/sle_reproduction"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--alphas", type=float, nargs="*", default=[0.5, 0.9, 1.0], help="SLE alphas besides 0.75.")
    parser.add_argument("--alpha-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--num-train-images", type=int, default=4000)
    parser.add_argument("--jobs", type=int, default=1, help="Trainings run side by side (one core each).")
    parser.add_argument("--plot", type=Path, default=REPOSITORY / "docs" / "sle_alpha_sweep.png")
    PAGE.add_arguments(parser)
    args = parser.parse_args()
    results, _ = PAGE.report(
        args, lambda: run_reproduction(args), args.output_dir, render_tables, page_block, comparisons_of
    )
    keys = ["sample5_Div-2", "sample5_CIDEr"]
    validation = {name: summarise([run["validation"] for run in runs], keys) for name, runs in results["runs"].items()}
    alphas = {"SLE": 0.75} | {name: float(name.removeprefix("SLE α=")) for name in validation if "α=" in name}
    _plot(validation, alphas, {name: len(runs) for name, runs in results["runs"].items()}, args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
