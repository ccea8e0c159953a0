"""
Reproduction of Vered et al. 2019 (cooperative speaker-listener training, PSST) on shapes: for each way of passing
words (`st`, `psst`, `gumbel`, the paper's Gumbel temperature annealing baseline, `reinforce`) and each λ of the
sweep, `examples/train_psst.py` from the published XE warm start and a listener first trained alone on its words
(once per seed, from that seed's initialisation), judged by the listener's recall of each image among the whole split
from its speaker's caption, by an evaluator CLIP's text-to-image recall (which no training used, so a private
speaker-listener code does not pass for a good caption), and by CIDEr-D, BLEU-4, object F1 and the share of parse
failures (language drift); then ρ's sweep for `psst`. Listener recall and CIDEr-D score the same captions: the beam-3
captions, and again the greedy ones.

    python benchmarks/psst_reproduction.py --output-dir runs/psst_reproduction --jobs 2

Every run is scored on the validation split (200 images) and the test split (500). The paper compares the ways of
passing words at a fixed CIDEr (its headline: R@10 PSST 86.3 > ST 81.8 > REINFORCE 80.5 at CIDEr 1.2 on COCO); here
that comparison is made on validation and read on test: the fixed CIDEr-D is the highest that every seed of every
way reaches at some λ on validation, each way and seed keeps the λ of its best validation listener R@10 among the λs
at or above it, and the test scores of those runs are reported. The λ and ρ sweeps are shown on validation.

The verdicts, by the rule of `verdicts.py` on test (paired by seed: each seed's runs share its warm start, listener
and data order): for each way, listener feedback at the λ chosen on validation against the control λ (the smallest
of the sweep), and the paper's ordering PSST > ST > REINFORCE at the fixed CIDEr-D.

Prints the tables (mean ± s.d. over seeds) and the verdicts, writes `<output-dir>/results.json`, plots validation
recall@10 against CIDEr-D (`--plot`) and, with `--card`, puts the tables, the verdicts and the plot into a
checkpoint's model card. Runs whose scores exist are read, not trained again.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
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
PAGE = GeneratedPage(Path(__file__).name, REPOSITORY / "docs" / "methods" / "psst.md", "psst")

# the ways of passing words: name -> recipe options
WAYS = {
    "st": ["--psst_mode", "st"],
    "psst": ["--psst_mode", "psst"],
    "gumbel": ["--psst_mode", "gumbel"],
    # Jang et al. 2017's annealing τ = max(0.5, exp(−r t)), with r and the update interval scaled from their 1e-5 and
    # 500 (which would never move τ in 125 steps): τ falls from 1 to exp(−5.5e-3 · 100) = 0.577 at step 100, its last
    # update within the 125 steps
    "st_gumbel, annealed": [
        "--psst_mode", "st_gumbel", "--gumbel_temperature_schedule", "annealed",
        "--gumbel_annealing_rate", "5.5e-3", "--gumbel_annealing_interval", "25",
    ],
    "reinforce": ["--psst_mode", "reinforce"],
    # the paper's REINFORCE baseline: listener and speaker take turns, one step each
    "reinforce, alternating": ["--psst_mode", "reinforce", "--psst_schedule", "alternating"],
}  # fmt: skip
# Optimizer steps a way takes per speaker update: an alternating schedule spends every other step on the listener
# alone, so it runs twice the steps for the speaker to learn as often as in the joint ways
STEPS_PER_SPEAKER_UPDATE = {"reinforce, alternating": 2}
COLUMNS = (
    ("listener_R@1", "listener R@1"),
    ("listener_R@10", "listener R@10"),
    ("t2i_R@1", "evaluator t2i R@1"),
    ("t2i_R@10", "evaluator t2i R@10"),
    ("CIDEr", "CIDEr-D"),
    ("Bleu_4", "BLEU-4"),
    ("object_f1", "object F1"),
    ("parse_failure_share", "parse failures"),
)
# the same axes on the speaker's greedy captions (the columns above score its beam-3 captions, listener R@K included)
GREEDY_COLUMNS = (
    ("greedy_listener_R@1", "listener R@1"),
    ("greedy_listener_R@10", "listener R@10"),
    ("greedy_t2i_R@1", "evaluator t2i R@1"),
    ("greedy_t2i_R@10", "evaluator t2i R@10"),
    ("greedy_CIDEr", "CIDEr-D"),
    ("greedy_Bleu_4", "BLEU-4"),
)


def _common(seed: int) -> list[str]:
    return [
        "--seed", str(seed), "--use_cpu", "--save_strategy", "no", "--eval_strategy", "no",
        "--eval_clip", EVALUATOR_CLIP, "--report_to", "none", "--disable_tqdm", "True", "--logging_steps", "25",
        "--overwrite_output_dir", "True", "--score_validation", "True",
    ]  # fmt: skip


def _warm_up_listener(output_dir: Path, steps: int, seed: int) -> Path:
    """
    The XE speaker with a listener trained alone on its words (the paper's separate training), from `seed`'s
    initialisation: the start of that seed's runs, so that the spread over seeds includes the listener's (how fast a
    new listener leaves its starting loss depends on it).
    """
    run_dir = output_dir / f"listener-warmup-{steps}-seed{seed}"
    run_recipe_once(
        "train_psst.py", run_dir,
        ["--model_name_or_path", WARM_START, "--listener_pretraining_steps", str(steps), "--max_steps", str(steps),
         "--pretraining_only", "True", *_common(seed)],
    )  # fmt: skip
    return run_dir


def _options(start: Path, way: str, lam: float, rho: float, seed: int, speaker_updates: int) -> list[str]:
    max_steps = speaker_updates * STEPS_PER_SPEAKER_UPDATE.get(way, 1)
    return [
        "--model_name_or_path", str(start), *WAYS[way], "--psst_lambda", f"{lam:g}", "--psst_rho", f"{rho:g}",
        "--max_steps", str(max_steps), *_common(seed),
    ]  # fmt: skip


def headlines(ways: list[str]) -> list[Headline]:
    """
    Vered et al.'s claims on test: listener feedback raises the listener's recall for every way of passing words (each
    way at its chosen λs against its control λ), and R@10 PSST > ST > REINFORCE at a fixed CIDEr-D.
    """
    claims = [
        Headline("listener_R@10", f"{way} (chosen λ)", f"{way} (control λ)", "higher", "listener R@10") for way in ways
    ]
    for better, worse in (("psst", "st"), ("st", "reinforce"), ("st", "reinforce, alternating")):
        if better in ways and worse in ways:
            claims.append(
                Headline("listener_R@10", f"{better} (chosen λ)", f"{worse} (chosen λ)", "higher", "listener R@10")
            )
    return claims


def chosen_run(runs: dict[float, dict[str, dict[str, float]]], fixed_cider: float) -> float:
    """
    The λ of one way and seed kept for the fixed-CIDEr comparison (`runs`: `{λ: {split: scores}}`): the best
    validation listener R@10 among the λs whose validation CIDEr-D is at least `fixed_cider`.

    Raises:
        `ValueError`: no λ reaches `fixed_cider`.
    """
    reaching = [lam for lam, run in runs.items() if run["validation"]["CIDEr"] >= fixed_cider]
    if not reaching:
        raise ValueError(f"no λ of {sorted(runs)} reaches validation CIDEr-D {fixed_cider}")
    return max(reaching, key=lambda lam: runs[lam]["validation"]["listener_R@10"])


def _plot(curves: dict[str, list[tuple[float, float, float, float, float]]], path: Path) -> None:
    with plot_to(path) as axes:
        for way, points in curves.items():
            points = sorted(points, key=lambda point: point[4])  # along λ
            cider, cider_sd, recall, recall_sd, lambdas = zip(*points, strict=True)
            axes.errorbar(cider, recall, xerr=cider_sd, yerr=recall_sd, marker="o", capsize=2, label=way)
            for x, y, lam in zip(cider, recall, lambdas, strict=True):
                axes.annotate(f"{lam * 1e3:g}", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
        axes.set_xlabel("CIDEr-D of the speaker's captions (validation, beam 3)")
        axes.set_ylabel("listener recall@10 among the validation images")
        axes.set_title(
            "Shapes: discriminability vs naturalness over λ (labels: λ × 1e3; ± s.d. over seeds)", fontsize=9
        )


def run_name(way: str, lam: float, rho: float) -> str:
    """A run's row in the tables and its key in `results.json`: `psst, λ=200e-3, ρ=0.25`, `st, λ=50e-3`."""
    return f"{way}, λ={lam * 1e3:g}e-3" + (f", ρ={rho:g}" if way == "psst" else "")


def run_reproduction(args: argparse.Namespace) -> dict[str, Any]:
    """Trains the runs that are not cached, reads the others, and returns what `results.json` holds."""
    output_dir = args.output_dir.resolve()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        warm_up_runs = pool.map(partial(_warm_up_listener, output_dir, args.listener_warmup_steps), args.seeds)
        start = dict(zip(args.seeds, warm_up_runs, strict=True))

    def run_dir(way: str, lam: float, rho: float | None, seed: int) -> Path:
        name = way.replace(", ", "-").replace(" ", "-")
        return output_dir / (
            f"{name}-lambda{lam * 1e3:g}e-3" + (f"-rho{rho:g}" if rho is not None else "") + f"-seed{seed}"
        )

    jobs = {}  # (way, λ, ρ) -> [(run dir, options) of each seed]
    for way in args.ways:
        for lam in args.lambdas:
            jobs[(way, lam, 0.25)] = [
                (run_dir(way, lam, None, seed), _options(start[seed], way, lam, 0.25, seed, args.max_steps))
                for seed in args.seeds
            ]
    for rho in args.rhos:
        jobs[("psst", args.rho_lambda, rho)] = [
            (
                run_dir("psst", args.rho_lambda, rho, seed),
                _options(start[seed], "psst", args.rho_lambda, rho, seed, args.max_steps),
            )
            for seed in args.seeds
        ]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            key: [pool.submit(run_recipe_once, "train_psst.py", path, options) for path, options in runs]
            for key, runs in jobs.items()
        }
        runs = {run_name(*key): [future.result() for future in seeds] for key, seeds in futures.items()}
    lambda_rows = {way: [run_name(way, lam, 0.25) for lam in args.lambdas] for way in args.ways}
    # the fixed CIDEr-D: the highest that every seed of every way reaches on validation at some λ
    fixed = float(
        np.floor(
            min(
                max(runs[row][seed]["validation"]["CIDEr"] for row in rows)
                for rows in lambda_rows.values()
                for seed in range(len(args.seeds))
            )
            * 100
        )
        / 100
    )
    chosen = {
        way: [
            chosen_run({lam: runs[run_name(way, lam, 0.25)][seed] for lam in args.lambdas}, fixed)
            for seed in range(len(args.seeds))
        ]
        for way in args.ways
    }
    results = {
        "command": benchmark_command(),
        "code": code_version(),
        "selection_split": "validation",
        "judged_split": "test",
        "max_steps": args.max_steps,
        "lambdas": args.lambdas,
        "rho_lambda": args.rho_lambda,
        "warm_ups": [json.loads((run / "eval_results.json").read_text()) for run in start.values()],
        "runs": runs,
        "seeds": args.seeds,
        "fixed_cider": fixed,
        "chosen_lambda": chosen,
    }
    return results | {"verdicts": [asdict(comparison) for comparison in comparisons_of(results)]}


def comparisons_of(results: dict[str, Any]) -> list:
    """The page's headlines judged on the test split, each way at the λ chosen for each seed on validation against
    its control λ (the smallest of the sweep), paired by seed."""
    runs, seeds, control = results["runs"], results["seeds"], min(results["lambdas"])
    per_seed = {}
    for way, lambdas in results["chosen_lambda"].items():
        per_seed[f"{way} (chosen λ)"] = {
            seed: runs[run_name(way, lam, 0.25)][index]["test"]
            for index, (seed, lam) in enumerate(zip(seeds, lambdas, strict=True))
        }
        per_seed[f"{way} (control λ)"] = {
            seed: runs[run_name(way, control, 0.25)][index]["test"] for index, seed in enumerate(seeds)
        }
    return judge_headlines(per_seed, headlines(list(results["chosen_lambda"])))


def render_tables(results: dict[str, Any]) -> list[str]:
    """The tables and the verdicts of `results` (what `run_reproduction` returns), in the order a page shows them."""
    runs, lambdas, fixed = results["runs"], results["lambdas"], results["fixed_cider"]
    keys = [key for key, _ in COLUMNS]
    warm_up_row = "XE + warmed-up listener"
    num_seeds = len(results["seeds"])
    num_runs = {row: len(seeds) for row, seeds in runs.items()} | {warm_up_row: len(results["warm_ups"])}
    lambda_rows = [run_name(way, lam, 0.25) for way in results["chosen_lambda"] for lam in lambdas]
    tables = [
        f"Validation split (200 images), {results['max_steps']} speaker updates from the XE speaker and its "
        f"warmed-up listener, beam-3 captions\n\n"
        + markdown_table(
            {
                warm_up_row: summarise([run["validation"] for run in results["warm_ups"]], keys),
                **{row: summarise([run["validation"] for run in runs[row]], keys) for row in lambda_rows},
            },
            num_runs,
            COLUMNS,
        )
    ]
    chosen_rows, chosen_greedy, chosen_num = {}, {}, {}
    for way, chosen in results["chosen_lambda"].items():
        test_runs = [runs[run_name(way, lam, 0.25)][seed]["test"] for seed, lam in enumerate(chosen)]
        row = f"{way} (λ × 1e3 of each seed: {', '.join(f'{lam * 1e3:g}' for lam in chosen)})"
        chosen_rows[row] = summarise(test_runs, keys)
        chosen_greedy[row] = summarise(test_runs, [key for key, _ in GREEDY_COLUMNS])
        chosen_num[row] = num_seeds
    tables.append(
        f"Test split (500 images), beam-3 captions: each way at the λ of its best validation listener R@10 with "
        f"validation CIDEr-D ≥ {fixed:.2f} (the highest every seed of every way reaches)\n\n"
        + markdown_table(
            {warm_up_row: summarise([run["test"] for run in results["warm_ups"]], keys), **chosen_rows},
            {**chosen_num, warm_up_row: len(results["warm_ups"])},
            COLUMNS,
        )
    )
    tables.append(
        "The same runs' greedy captions, both axes on them (test)\n\n"
        + markdown_table(chosen_greedy, chosen_num, GREEDY_COLUMNS)
    )
    tables.append(verdict_lines(comparisons_of(results)))
    rho_lambda = results["rho_lambda"]
    rho_rows = sorted(row for row in runs if row.startswith(f"psst, λ={rho_lambda * 1e3:g}e-3, ρ="))
    tables.append(
        f"ρ sweep of psst at λ={rho_lambda * 1e3:g}e-3 (validation)\n\n"
        + markdown_table(
            {row: summarise([run["validation"] for run in runs[row]], keys) for row in rho_rows}, num_runs, COLUMNS
        )
    )
    return tables


def page_block(results: dict[str, Any]) -> str:
    """What docs/methods/psst.md shows between this benchmark's markers."""
    selection = (
        "each way's λ chosen per seed on validation among those reaching the fixed CIDEr-D, the verdicts read on test"
    )
    return "\n\n".join([provenance_line(results, selection), *render_tables(results)])


def _plot_results(results: dict[str, Any], path: Path) -> None:
    runs = results["runs"]
    curves = {}
    for way in results["chosen_lambda"]:
        points = []
        for lam in results["lambdas"]:
            summary = summarise(
                [run["validation"] for run in runs[run_name(way, lam, 0.25)]], ["CIDEr", "listener_R@10"]
            )
            points.append((*summary["CIDEr"], *summary["listener_R@10"], lam))
        curves[way] = points
    _plot(curves, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/psst_reproduction"))
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS, help="Ways of passing words.")
    # The paper traces λ over {10, 5, 2.5, 1.6, 1, 0.5} × 1e-3 (`--lambdas 10e-3 5e-3 2.5e-3 1.6e-3 1e-3 0.5e-3`);
    # on shapes that range barely moves CIDEr-D, so the default spans 1e-6 (next to no feedback from the listener:
    # the control) to 0.5, where the trade-off shows. Within it, λ is chosen on validation.
    parser.add_argument("--lambdas", type=float, nargs="+", default=[1e-6, 50e-3, 200e-3, 500e-3])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--rhos", type=float, nargs="*", default=[0.0, 0.5, 1.0], help="psst's ρ besides 0.25.")
    parser.add_argument("--rho-lambda", type=float, default=200e-3, help="λ of the ρ sweep.")
    parser.add_argument(
        "--max-steps", type=int, default=125,
        help="Speaker updates of every run (125: one epoch); an alternating schedule takes twice the steps.",
    )  # fmt: skip
    # a new listener sits at its starting loss for a number of steps that depends on its initialisation; 2,000 steps
    # bring every seed's listener off it (the warm-up row of the tables shows where each ends)
    parser.add_argument(
        "--listener-warmup-steps", type=int, default=2000, help="Steps of each seed's listener warm-up."
    )
    parser.add_argument("--jobs", type=int, default=1, help="Trainings run side by side (one core each).")
    parser.add_argument("--plot", type=Path, default=REPOSITORY / "docs" / "psst_lambda_sweep.png")
    parser.add_argument("--card", type=Path, default=None, help="A model card (README.md) to put the tables into.")
    PAGE.add_arguments(parser)
    args = parser.parse_args()
    results, tables = PAGE.report(
        args, lambda: run_reproduction(args), args.output_dir, render_tables, page_block, comparisons_of
    )
    _plot_results(results, args.plot)
    print(f"\nplot: {args.plot}")
    if args.card is not None:  # the checkpoint's card gets the tables and the plot
        write_card_section(
            args.card, "Reproduction on shapes", f"`{results['command']}`:\n\n" + "\n\n".join(tables),
            plot=args.plot, plot_caption="validation listener recall@10 against CIDEr-D over λ",
        )  # fmt: skip


if __name__ == "__main__":
    main()
