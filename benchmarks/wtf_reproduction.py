"""
Reproduction of seed 003 (WTF-RL) on shapes: the variants of the paper's Table 1 (`tf`, `wtf`, `wtf_rl`, `rl`,
`rl_unidirectional`, `scst_discriminator`), each `examples/train_wtf.py` from the published XE warm start over several
seeds, judged on the test split by retrieval in both directions by the reward CLIP and by the evaluator CLIP (which no
reward used, so a caption that only fools the reward CLIP shows), BLEU-4, ROUGE-L, CIDEr-D, Self-BLEU, the scene object
F1 and the share of parse failures (the discriminator should keep captions parseable where RL alone drifts).

    python benchmarks/wtf_reproduction.py --output-dir runs/wtf_reproduction --jobs 2

Prints the table (mean ± s.d. over seeds), writes `<output-dir>/results.json` and plots the evaluator's text-to-image
R@1 against CIDEr-D (`--plot`). Runs whose scores exist are read, not trained again.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from reproduction import EVALUATOR_CLIP, REPOSITORY, WARM_START, markdown_table, plot_to, run_recipe_once, summarise

VARIANTS = ("tf", "wtf", "wtf_rl", "rl", "rl_unidirectional", "scst_discriminator")
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


def _options(variant: str, seed: int, max_steps: int) -> list[str]:
    return [
        "--model_name_or_path", WARM_START, "--wtf_variant", variant, "--seed", str(seed),
        "--max_steps", str(max_steps), "--use_cpu", "--save_strategy", "no", "--eval_strategy", "no",
        "--eval_clip", EVALUATOR_CLIP, "--report_to", "none", "--disable_tqdm", "True", "--logging_steps", "25",
        "--overwrite_output_dir", "True",
    ]  # fmt: skip


def _plot(rows: dict[str, dict[str, tuple[float, float]]], path: Path) -> None:
    with plot_to(path) as axes:
        for name, summary in rows.items():
            (x, x_err), (y, y_err) = summary["CIDEr"], summary["t2i_R@1"]
            axes.errorbar(x, y, xerr=x_err, yerr=y_err, marker="o", capsize=3, linestyle="none", label=name)
        axes.set_xlabel("CIDEr-D (test, beam search)")
        axes.set_ylabel("text-to-image R@1 by the evaluator CLIP")
        axes.set_title("Shapes: WTF-RL variants (mean ± s.d. over seeds)", fontsize=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/wtf_reproduction"))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=250, help="Training steps of every run (250: one epoch).")
    parser.add_argument("--jobs", type=int, default=1, help="Trainings run side by side (one core each).")
    parser.add_argument("--plot", type=Path, default=REPOSITORY / "docs" / "wtf_variants.png")
    args = parser.parse_args()
    output_dir = args.output_dir.resolve()

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            variant: [
                pool.submit(
                    run_recipe_once,
                    "train_wtf.py",
                    output_dir / f"{variant}-seed{seed}",
                    _options(variant, seed, args.max_steps),
                )  # fmt: skip
                for seed in args.seeds
            ]
            for variant in args.variants
        }
        results = {variant: [future.result() for future in runs] for variant, runs in futures.items()}

    rows = {variant: summarise(runs, [key for key, _ in COLUMNS]) for variant, runs in results.items()}
    table = partial(markdown_table, columns=COLUMNS, first_header="variant")
    print(f"\nShapes test split (500 images), {args.max_steps} steps of WTF-RL from the XE warm start")
    print(table(rows, {variant: len(runs) for variant, runs in results.items()}))
    (output_dir / "results.json").write_text(json.dumps(results, indent=1))
    _plot(rows, args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
