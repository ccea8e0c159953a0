"""
Reproduction of Ren et al. 2017 (policy and value networks) on shapes: the published XE
captioner, SCST from it, and actor-critic from it with the visual-semantic embedding reward and with the CIDEr-D
reward, over several seeds; then lookahead beam search `λ · log p + (1 − λ) · v` over λ for the actor-critic models.

    python benchmarks/actor_critic_reproduction.py --output-dir runs/actor_critic_reproduction --jobs 2

Every model, the XE start included, is judged the same way (beam search, 3 beams): CIDEr-D, BLEU-4, METEOR (where
Java runs), the mean embedding reward of its captions (by the shipped embedding model), the scene object F1, and the
text-to-image R@1 of the evaluator CLIP (which no reward used). The actor-critic runs add the value network's
explained variance on captions sampled for held-out images (`value_explained_variance` of
`examples/train_actor_critic.py`). SCST and actor-critic make the same policy updates under the same learning-rate
schedule: actor-critic first pretrains its value network with the policy fixed (`--value-pretraining-steps`), steps
that the policy's schedule does not count.

λ is chosen on the validation split: every actor-critic model decodes the validation images at each λ, the λ of the
highest mean CIDEr-D over seeds is kept, and the test split is scored once at that λ and once with plain beam search
(λ = 1). Nothing else is chosen, so the other rows are test scores of each run's last step.

The verdicts, by the rule of `verdicts.py` on test (paired by seed: each seed's runs share the warm start and the
data order): actor-critic against SCST with the same reward, the embedding reward's retrieval against SCST's, and
lookahead at the chosen λ against plain beam search for each actor-critic model.

Prints the tables (mean ± s.d. over seeds) and the verdicts, writes `<output-dir>/results.json`, plots validation
CIDEr-D against λ (`--plot`) and, with `--card`, puts the tables, the verdicts and the plot into a checkpoint's model
card. Runs whose scores exist are read, not trained again; a model's judged scores are kept beside it with the code
and settings that made them.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch
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

from rlcaption.evaluation import caption_dataset, clip_scores, scene_grounding_scores
from rlcaption.metrics import evaluate_captions, load_clip
from rlcaption.recipes import RecipeArguments, load_pretrained_captioner, load_recipe_dataset
from rlcaption.rewards import get_reward

# the page, README row and kept results its `--page` writes
PAGE = GeneratedPage(Path(__file__).name, REPOSITORY / "docs" / "methods" / "actor_critic.md", "actor_critic")

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
        "--overwrite_output_dir", "True", "--score_validation", "True",
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


def _headlines(chosen: dict[str, float]) -> list[Headline]:
    """Ren et al. 2017's claims on test; `chosen`: the λ of lookahead kept on validation per actor-critic model."""
    claims = [
        Headline("CIDEr", "actor-critic (CIDEr-D)", "SCST (CIDEr-D)", "higher", "CIDEr-D"),
        Headline("t2i_R@1", "actor-critic (embedding)", "SCST (CIDEr-D)", "higher", "evaluator T2I R@1"),
    ]
    claims += [
        Headline("CIDEr", f"{method}, λ = {lam:g}", method, "higher", "CIDEr-D, lookahead against plain beam search")
        for method, lam in chosen.items()
        # where validation keeps plain beam search (λ = 1), there is no lookahead to judge on test
        if lam != 1
    ]
    return claims


def _judge(
    model_dir: Path, split: str, lambdas: tuple[float, ...] = (), cache_dir: Path | None = None
) -> dict[str, float]:
    """
    Scores of the model in `model_dir` on `split` with plain beam search and, for each of `lambdas`,
    `lookahead_<λ>_<key>`. Kept in `judged-<split>.json` of `cache_dir` (default `model_dir`) with the code version,
    the split and the λs; read from there when those match, computed again when they do not.
    """
    key = {"code": code_version(), "split": split, "lambdas": list(lambdas)}
    cache = (cache_dir or model_dir) / f"judged-{split}.json"
    cached = json.loads(cache.read_text()) if cache.is_file() else {}
    if cached.get("key") == key:
        return cached["scores"]
    torch.set_num_threads(1)
    images_split = load_recipe_dataset(RecipeArguments())[split]
    model, processor = load_pretrained_captioner(str(model_dir))
    model.eval()
    embedding = get_reward("embedding", model=str(REPOSITORY / EMBEDDING_MODEL))
    images = {row["image_id"]: row["image"] for row in images_split.select_columns(["image_id", "image"])}

    def scores(**decoding) -> tuple[dict[str, float], dict]:
        predictions, references = caption_dataset(model, processor, images_split, num_beams=3, **decoding)
        result = evaluate_captions(predictions, references, metrics=["cider", "bleu", "meteor"])
        result.update(scene_grounding_scores(predictions, images_split))
        rewards = embedding(completions=list(predictions.values()), image=[images[key] for key in predictions])
        result["embedding"] = statistics.fmean(rewards)
        return result, predictions

    judged, predictions = scores()
    judged.update(clip_scores(predictions, images_split, load_clip(str(REPOSITORY / EVALUATOR_CLIP))))
    results = model_dir / "eval_results.json"
    if results.is_file():
        judged["value_explained_variance"] = json.loads(results.read_text())[split].get("value_explained_variance")
    for lam in lambdas:
        lookahead, _ = scores(lookahead_lambda=lam)
        judged.update({f"lookahead_{lam:g}_{key}": lookahead[key] for key, _ in LOOKAHEAD_COLUMNS})
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "scores": judged}, indent=1))
    return judged


def _train(run_dir: Path, recipe: str, options: list[str], lambdas: tuple[float, ...]) -> dict[str, float]:
    """Trains the run once; an actor-critic run is then judged on validation at every λ."""
    run_recipe_once(recipe, run_dir, options)
    return _judge(run_dir, "validation", lambdas) if lambdas else {}


def chosen_lambda(validation_runs: list[dict[str, float]], lambdas: tuple[float, ...]) -> float:
    """The λ of the highest mean validation CIDEr-D over seeds (on a tie, the larger λ: the plainer decoding)."""
    mean_cider = {lam: statistics.fmean(run[f"lookahead_{lam:g}_CIDEr"] for run in validation_runs) for lam in lambdas}
    return max(lambdas, key=lambda lam: (round(mean_cider[lam], 6), lam))


def _plot(validation: dict[str, dict[str, tuple[float, float]]], lambdas: tuple[float, ...], path: Path) -> None:
    with plot_to(path) as axes:
        for method, summary in validation.items():
            means = [summary[f"lookahead_{lam:g}_CIDEr"][0] for lam in lambdas]
            spreads = [summary[f"lookahead_{lam:g}_CIDEr"][1] for lam in lambdas]
            axes.errorbar(lambdas, means, yerr=spreads, marker="o", capsize=3, label=method)
        axes.set_xlabel("λ of lookahead beam search (λ · log p + (1 − λ) · v; 1 = plain beam search)")
        axes.set_ylabel("CIDEr-D (validation, 3 beams)")
        axes.set_title("Shapes: lookahead with the value network (mean ± s.d. over seeds)", fontsize=10)


def run_reproduction(args: argparse.Namespace) -> dict:
    """Trains and judges what is not cached, reads the rest, and returns what `results.json` holds."""
    output_dir, lambdas = args.output_dir.resolve(), tuple(args.lambdas)
    methods = _methods(args.policy_steps, args.value_pretraining_steps)
    run_dirs = {
        method: [output_dir / f"{prefix}-seed{seed}" for seed in args.seeds]
        for method, (prefix, _, _) in methods.items()
    }
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        xe = pool.submit(_judge, REPOSITORY / WARM_START, "test", cache_dir=output_dir / "xe")
        trained = {
            method: [
                pool.submit(
                    _train,
                    run_dir,
                    recipe,
                    [*options, *_common(seed)],
                    lambdas if recipe == "train_actor_critic.py" else (),
                )  # fmt: skip
                for run_dir, seed in zip(run_dirs[method], args.seeds, strict=True)
            ]
            for method, (_, recipe, options) in methods.items()
        }
        validation = {method: [future.result() for future in runs] for method, runs in trained.items()}
        validation = {method: runs for method, runs in validation.items() if "actor-critic" in method}
        chosen = {method: chosen_lambda(runs, lambdas) for method, runs in validation.items()}
        tested = {
            method: [
                pool.submit(_judge, run_dir, "test", (chosen[method],) if method in chosen else ()) for run_dir in dirs
            ]
            for method, dirs in run_dirs.items()
        }
        test = {"XE (published start)": [xe.result()]}
        test.update({method: [future.result() for future in runs] for method, runs in tested.items()})
    results = {
        "command": benchmark_command(),
        "code": code_version(),
        "seeds": args.seeds,
        "policy_steps": args.policy_steps,
        "lambdas": args.lambdas,
        "test": test,
        "validation": validation,
        "chosen_lambda": chosen,
    }
    return results | {"verdicts": [asdict(comparison) for comparison in comparisons_of(results)]}


def comparisons_of(results: dict) -> list:
    """Ren et al.'s claims judged on test, paired by seed."""
    test, chosen = results["test"], results["chosen_lambda"]
    per_seed = {
        method: dict(zip(results["seeds"], runs, strict=True))
        for method, runs in test.items()
        if method != "XE (published start)"
    }
    for method, lam in chosen.items():
        per_seed[f"{method}, λ = {lam:g}"] = {
            seed: {"CIDEr": run[f"lookahead_{lam:g}_CIDEr"]} for seed, run in per_seed[method].items()
        }
    return judge_headlines(per_seed, _headlines(chosen))


def render_tables(results: dict) -> list[str]:
    """The test table, each actor-critic model's λ sweep on validation, the test at the chosen λ, the verdicts."""
    test, validation, chosen, lambdas = (
        results["test"],
        results["validation"],
        results["chosen_lambda"],
        results["lambdas"],
    )
    keys = [key for key, _ in COLUMNS]
    num_runs = {method: len(runs) for method, runs in test.items()}
    title = (
        f"Shapes test split (500 images), plain beam search, {results['policy_steps']} policy updates from the XE "
        "start under the same schedule"
    )
    rows = {method: summarise(runs, keys) for method, runs in test.items()}
    tables = [f"{title}\n\n{markdown_table(rows, num_runs, COLUMNS)}"]
    for method, runs in validation.items():
        summary = summarise(runs, [f"lookahead_{lam:g}_{key}" for lam in lambdas for key, _ in LOOKAHEAD_COLUMNS])
        by_lambda = {
            f"{lam:g}": {key: summary[f"lookahead_{lam:g}_{key}"] for key, _ in LOOKAHEAD_COLUMNS} for lam in lambdas
        }
        seeds = {name: len(runs) for name in by_lambda}
        title = f"Lookahead beam search of {method} on the validation split (200 images; λ = 1: plain beam search)"
        tables.append(f"{title}\n\n{markdown_table(by_lambda, seeds, LOOKAHEAD_COLUMNS, first_header='λ')}")
    chosen_rows, chosen_runs = {}, {}
    for method, lam in chosen.items():
        chosen_keys = {f"lookahead_{lam:g}_{key}": key for key, _ in LOOKAHEAD_COLUMNS}
        at_lambda = summarise(test[method], list(chosen_keys))
        chosen_rows[f"{method}, λ = 1"] = summarise(test[method], [key for key, _ in LOOKAHEAD_COLUMNS])
        chosen_rows[f"{method}, λ = {lam:g} (chosen)"] = {chosen_keys[key]: value for key, value in at_lambda.items()}
        chosen_runs.update({name: num_runs[method] for name in list(chosen_rows)[-2:]})
    title = "Test split at the λ chosen on validation, beside plain beam search"
    tables.append(f"{title}\n\n{markdown_table(chosen_rows, chosen_runs, LOOKAHEAD_COLUMNS)}")
    tables.append(verdict_lines(comparisons_of(results)))
    return tables


def page_block(results: dict) -> str:
    """What docs/methods/actor_critic.md shows between this benchmark's markers."""
    selection = "lookahead's λ chosen on validation, the verdicts read on test"
    return "\n\n".join([provenance_line(results, selection), *render_tables(results)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/actor_critic_reproduction"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--policy-steps", type=int, default=125, help="Policy updates of every run (125: one epoch).")
    parser.add_argument("--value-pretraining-steps", type=int, default=100)
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(LAMBDAS))
    parser.add_argument("--jobs", type=int, default=1, help="Trainings run side by side (one core each).")
    parser.add_argument("--plot", type=Path, default=REPOSITORY / "docs" / "lookahead_lambda_sweep.png")
    parser.add_argument("--card", type=Path, default=None, help="A model card (README.md) to put the tables into.")
    PAGE.add_arguments(parser)
    args = parser.parse_args()
    results, tables = PAGE.report(
        args, lambda: run_reproduction(args), args.output_dir, render_tables, page_block, comparisons_of
    )
    lambdas = results["lambdas"]
    lookahead_keys = [f"lookahead_{lam:g}_CIDEr" for lam in lambdas]
    _plot(
        {method: summarise(runs, lookahead_keys) for method, runs in results["validation"].items()}, lambdas, args.plot
    )
    print(f"\nplot: {args.plot}")
    if args.card is not None:  # the checkpoint's card gets the tables and the plot
        write_card_section(
            args.card, "Reproduction on shapes", f"`{results['command']}`:\n\n" + "\n\n".join(tables),
            plot=args.plot, plot_caption="validation CIDEr-D against λ of lookahead",
        )  # fmt: skip


if __name__ == "__main__":
    main()
