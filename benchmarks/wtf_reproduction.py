"""
Reproduction of Chaffin et al. 2024 (WTF-RL) on shapes: the variants of the paper's Table 1 (`tf`, `wtf`, `wtf_rl`,
`rl`, `rl_unidirectional`, `scst_discriminator`) and `rl` without the discriminator (α = 1), each
`examples/train_wtf.py` from the published XE warm start over several seeds and the given learning rates, judged on the
test split by retrieval in both directions by the reward CLIP and by the evaluator CLIP (which no reward used, so a
caption that only fools the reward CLIP shows), BLEU-4, ROUGE-L, CIDEr-D, Self-BLEU, the scene object F1 and the share
of parse failures (the discriminator should keep captions parseable where RL alone drifts).

    python benchmarks/wtf_reproduction.py --output-dir runs/wtf_reproduction --jobs 2

Prints the table (mean ± s.d. over seeds), writes `<output-dir>/results.json`, plots the evaluator's text-to-image
R@1 against CIDEr-D (`--plot`) and, with `--card`, puts the table into a checkpoint's model card. Runs whose scores
exist are read, not trained again.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from reproduction import (
    EVALUATOR_CLIP,
    REPOSITORY,
    WARM_START,
    benchmark_command,
    markdown_table,
    plot_to,
    run_recipe_once,
    summarise,
    write_card_section,
)

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
    return [
        "--model_name_or_path", WARM_START, *VARIANT_OPTIONS[variant], "--seed", str(seed),
        "--learning_rate", f"{learning_rate:g}", "--max_steps", str(max_steps), "--use_cpu", "--save_strategy", "no",
        "--eval_strategy", "no", "--eval_clip", EVALUATOR_CLIP, "--report_to", "none", "--disable_tqdm", "True",
        "--logging_steps", "25", "--overwrite_output_dir", "True",
    ]  # fmt: skip


def _plot(rows: dict[tuple[str, float], dict[str, tuple[float, float]]], path: Path) -> None:
    learning_rates = sorted({learning_rate for _, learning_rate in rows}, reverse=True)
    colours = {variant: f"C{index}" for index, variant in enumerate(dict.fromkeys(variant for variant, _ in rows))}
    with plot_to(path, figsize=(6.5, 4.5)) as axes:
        for (variant, learning_rate), summary in rows.items():
            (x, x_err), (y, y_err) = summary["CIDEr"], summary["t2i_R@1"]
            axes.errorbar(
                x, y, xerr=x_err, yerr=y_err, capsize=3, linestyle="none", color=colours[variant],
                marker="os^"[learning_rates.index(learning_rate) % 3], label=f"{variant}, lr {learning_rate:g}",
            )  # fmt: skip
        axes.set_xlabel("CIDEr-D (test, beam search)")
        axes.set_ylabel("text-to-image R@1 by the evaluator CLIP")
        axes.set_title("Shapes: WTF-RL variants (mean ± s.d. over seeds)", fontsize=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/wtf_reproduction"))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=250, help="Training steps of every run (250: one epoch).")
    parser.add_argument(
        "--learning-rates", type=float, nargs="+", default=[1e-4, 3e-5], help="The policy's learning rates."
    )
    parser.add_argument("--jobs", type=int, default=1, help="Trainings run side by side (one core each).")
    parser.add_argument("--plot", type=Path, default=REPOSITORY / "docs" / "wtf_variants.png")
    parser.add_argument("--card", type=Path, default=None, help="A model card (README.md) to put the table into.")
    args = parser.parse_args()
    output_dir = args.output_dir.resolve()

    def run_dir(variant: str, learning_rate: float, seed: int) -> Path:
        return output_dir / f"{variant}-lr{learning_rate:g}-seed{seed}"

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            (variant, learning_rate): [
                pool.submit(
                    run_recipe_once,
                    "train_wtf.py",
                    run_dir(variant, learning_rate, seed),
                    _options(variant, seed, args.max_steps, learning_rate),
                )  # fmt: skip
                for seed in args.seeds
            ]
            for learning_rate in args.learning_rates
            for variant in args.variants
        }
        results = {key: [future.result()["test"] for future in runs] for key, runs in futures.items()}

    rows = {key: summarise(runs, [name for name, _ in COLUMNS]) for key, runs in results.items()}
    name = {key: key[0] if len(args.learning_rates) == 1 else f"{key[0]}, lr {key[1]:g}" for key in results}
    title = f"Shapes test split (500 images), {args.max_steps} steps of each variant from the XE warm start"
    markdown = markdown_table(
        {name[key]: row for key, row in rows.items()},
        {name[key]: len(runs) for key, runs in results.items()},
        COLUMNS,
        first_header="variant",
    )
    print(f"\n{title}\n{markdown}")
    if args.card is not None:
        section = f"{title} (`{benchmark_command()}`):\n\n{markdown}"
        write_card_section(args.card, "Table 1 of the paper on shapes", section)
    (output_dir / "results.json").write_text(json.dumps({name[key]: runs for key, runs in results.items()}, indent=1))
    _plot(rows, args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
