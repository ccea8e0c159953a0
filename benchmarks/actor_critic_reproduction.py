"""
Reproduction of Ren et al. 2017 (policy and value networks) on shapes: the published XE
captioner, SCST from it, and actor-critic from it with the visual-semantic embedding reward and with the CIDEr-D
reward, over several seeds; then lookahead beam search `λ · log p + (1 − λ) · v` over λ for the actor-critic models.

    python benchmarks/actor_critic_reproduction.py --output-dir runs/actor_critic_reproduction --jobs 2

Every model, the XE start included, is judged here the same way on the test split (beam search, 3 beams): CIDEr-D,
BLEU-4, METEOR (where Java runs), the mean embedding reward of its captions (by the shipped embedding model), the
scene object F1, and the text-to-image R@1 of the evaluator CLIP (which no reward used). The actor-critic runs add the
value network's explained variance on captions sampled for the held-out test images (`value_explained_variance` of
`examples/train_actor_critic.py`). SCST and actor-critic make the same number of policy updates; actor-critic first
pretrains its value network with the policy fixed (`--value-pretraining-steps`).

Prints the tables (mean ± s.d. over seeds), writes `<output-dir>/results.json`, plots CIDEr-D against λ with plain
beam search as reference (`--plot`) and, with `--card`, puts the tables and the plot into a checkpoint's model card.
Runs whose scores exist are read, not trained again.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
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

from rlcaption.evaluation import caption_dataset, clip_scores, scene_grounding_scores
from rlcaption.metrics import evaluate_captions, load_clip
from rlcaption.recipes import RecipeArguments, load_pretrained_captioner, load_recipe_dataset
from rlcaption.rewards import get_reward

EMBEDDING_MODEL = "checkpoints/visual-semantic-embedding-shapes"
LAMBDAS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
COLUMNS = (
    ("CIDEr", "CIDEr-D"),
    ("Bleu_4", "BLEU-4"),
    ("METEOR", "METEOR"),
    ("embedding", "embedding reward"),
    ("object_f1", "object F1"),
    ("t2i_R@1", "evaluator T2I R@1"),
    ("value_explained_variance", "value expl. var."),
)
LOOKAHEAD_COLUMNS = (("CIDEr", "CIDEr-D"), ("Bleu_4", "BLEU-4"), ("embedding", "embedding reward"))


def _common(seed: int) -> list[str]:
    return [
        "--model_name_or_path", WARM_START, "--seed", str(seed), "--use_cpu", "--save_strategy", "no",
        "--eval_strategy", "no", "--report_to", "none", "--disable_tqdm", "True", "--logging_steps", "25",
        "--overwrite_output_dir", "True",
    ]  # fmt: skip


def _methods(policy_steps: int, value_pretraining_steps: int) -> dict[str, tuple[str, str, list[str]]]:
    """`{method: (run folder prefix, recipe, options but the seed's)}`."""
    actor_critic = ["--value_pretraining_steps", str(value_pretraining_steps)]
    # the lookahead sweep below scores every λ, so the recipe's own lookahead pass is left out (λ = 1)
    actor_critic += ["--max_steps", str(value_pretraining_steps + policy_steps), "--test_lookahead_lambda", "1"]
    embedding_only = ["--embedding_model", EMBEDDING_MODEL, "--reward_weights", "0"]  # CIDEr-D's weight 0
    return {
        "SCST (CIDEr-D)": ("scst-cider", "train_scst.py", ["--max_steps", str(policy_steps)]),
        "actor-critic (embedding)": ("ac-embedding", "train_actor_critic.py", [*actor_critic, *embedding_only]),
        "actor-critic (CIDEr-D)": ("ac-cider", "train_actor_critic.py", actor_critic),
    }


def _judge(model_dir: Path, lambdas: tuple[float, ...] = (), cache: Path | None = None) -> dict[str, float]:
    """Test scores of the model in `model_dir` (read from `cache` when it exists, else written there); with `lambdas`,
    also `lookahead_<λ>_<key>`."""
    if cache is not None and cache.is_file():
        return json.loads(cache.read_text())
    torch.set_num_threads(1)
    test = load_recipe_dataset(RecipeArguments())["test"]
    model, processor = load_pretrained_captioner(str(model_dir))
    model.eval()
    embedding = get_reward("embedding", model=str(REPOSITORY / EMBEDDING_MODEL))
    images = {row["image_id"]: row["image"] for row in test.select_columns(["image_id", "image"])}

    def scores(**decoding) -> tuple[dict[str, float], dict]:
        predictions, references = caption_dataset(model, processor, test, num_beams=3, **decoding)
        result = evaluate_captions(predictions, references, metrics=["cider", "bleu", "meteor"])
        result.update(scene_grounding_scores(predictions, test))
        rewards = embedding(completions=list(predictions.values()), image=[images[key] for key in predictions])
        result["embedding"] = statistics.fmean(rewards)
        return result, predictions

    judged, predictions = scores()
    judged.update(clip_scores(predictions, test, load_clip(str(REPOSITORY / EVALUATOR_CLIP))))
    results = model_dir / "eval_results.json"
    if results.is_file():
        judged["value_explained_variance"] = json.loads(results.read_text())["test"].get("value_explained_variance")
    for lam in lambdas:
        lookahead, _ = scores(lookahead_lambda=lam)
        judged.update({f"lookahead_{lam:g}_{key}": lookahead[key] for key, _ in LOOKAHEAD_COLUMNS})
    if cache is not None:
        cache.write_text(json.dumps(judged, indent=1))
    return judged


def _train_and_judge(run_dir: Path, recipe: str, options: list[str], lambdas: tuple[float, ...]) -> dict[str, float]:
    run_recipe_once(recipe, run_dir, options)
    return _judge(run_dir, lambdas, cache=run_dir / "judged.json")


def _plot(lookahead: dict[str, dict[str, tuple[float, float]]], lambdas: tuple[float, ...], path: Path) -> None:
    with plot_to(path) as axes:
        for method, summary in lookahead.items():
            means = [summary[f"lookahead_{lam:g}_CIDEr"][0] for lam in lambdas]
            spreads = [summary[f"lookahead_{lam:g}_CIDEr"][1] for lam in lambdas]
            axes.errorbar(lambdas, means, yerr=spreads, marker="o", capsize=3, label=method)
        axes.set_xlabel("λ of lookahead beam search (λ · log p + (1 − λ) · v; 1 = plain beam search)")
        axes.set_ylabel("CIDEr-D (test, 3 beams)")
        axes.set_title("Shapes: lookahead with the value network (mean ± s.d. over seeds)", fontsize=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/actor_critic_reproduction"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--policy-steps", type=int, default=125, help="Policy updates of every run (125: one epoch).")
    parser.add_argument("--value-pretraining-steps", type=int, default=100)
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(LAMBDAS))
    parser.add_argument("--jobs", type=int, default=1, help="Trainings run side by side (one core each).")
    parser.add_argument("--plot", type=Path, default=REPOSITORY / "docs" / "lookahead_lambda_sweep.png")
    parser.add_argument("--card", type=Path, default=None, help="A model card (README.md) to put the tables into.")
    args = parser.parse_args()
    output_dir, lambdas = args.output_dir.resolve(), tuple(args.lambdas)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        xe = pool.submit(_judge, REPOSITORY / WARM_START)
        futures = {
            method: [
                pool.submit(
                    _train_and_judge,
                    output_dir / f"{prefix}-seed{seed}",
                    recipe,
                    [*options, *_common(seed)],
                    lambdas if recipe == "train_actor_critic.py" else (),
                )  # fmt: skip
                for seed in args.seeds
            ]
            for method, (prefix, recipe, options) in _methods(args.policy_steps, args.value_pretraining_steps).items()
        }
        results = {"XE (published start)": [xe.result()]}
        results.update({method: [future.result() for future in runs] for method, runs in futures.items()})

    keys = [key for key, _ in COLUMNS]
    rows = {method: summarise(runs, keys) for method, runs in results.items()}
    num_runs = {method: len(runs) for method, runs in results.items()}
    title = f"Shapes test split (500 images), {args.policy_steps} policy updates from the XE start"
    tables = [f"{title}\n\n{markdown_table(rows, num_runs, COLUMNS)}"]
    print(f"\n{tables[0]}")

    lookahead_keys = [f"lookahead_{lam:g}_{key}" for lam in lambdas for key, _ in LOOKAHEAD_COLUMNS]
    lookahead = {method: summarise(results[method], lookahead_keys) for method in results if "actor-critic" in method}
    for method, summary in lookahead.items():
        by_lambda = {
            f"{lam:g}": {key: summary[f"lookahead_{lam:g}_{key}"] for key, _ in LOOKAHEAD_COLUMNS} for lam in lambdas
        }
        seeds = {name: num_runs[method] for name in by_lambda}
        title = f"Lookahead beam search of {method} (λ = 1: plain beam search)"
        tables.append(f"{title}\n\n{markdown_table(by_lambda, seeds, LOOKAHEAD_COLUMNS, first_header='λ')}")
        print(f"\n{tables[-1]}")
    (output_dir / "results.json").write_text(json.dumps(results, indent=1))
    _plot(lookahead, lambdas, args.plot)
    print(f"\nplot: {args.plot}")
    if args.card is not None:  # the checkpoint's card gets the tables and the plot
        write_card_section(
            args.card, "Reproduction on shapes", f"`{benchmark_command()}`:\n\n" + "\n\n".join(tables),
            plot=args.plot, plot_caption="CIDEr-D against λ of lookahead",
        )  # fmt: skip


if __name__ == "__main__":
    main()
