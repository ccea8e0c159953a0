"""XE, SCST and spider_pg (Liu et al. 2017) on the shapes test split at an equal policy budget, over several seeds.

    OMP_NUM_THREADS=1 python benchmarks/compare_objectives.py --xe-model checkpoints/show-tell-rl-shapes-xe \
        --num-train 4000 --num-validation 200 --num-test 500 --bcmr --jobs 2 \
        --output-dir runs/compare_objectives --plot docs/spider_pg_vs_scst.png --page

Arms, each trained for `--policy-steps` policy updates on a linear schedule at each of `--learning-rates` (SCST's
5e-4 and the spider_pg recipe's 2e-4 by default), all with the CIDEr-D reward (`--bcmr` adds SCST and spider_pg with
the paper's BLEU-4 + CIDEr-D + METEOR + ROUGE-L mix):

- SCST (Rennie et al. 2017): 5 samples per image, the greedy caption's reward as the baseline;
- spider_pg (Liu et al. 2017): M = 1 sampled caption per image, K = 3 Monte-Carlo rollouts per prefix, a learned
  MLP baseline first fitted for `--baseline-pretraining-steps` steps with the policy fixed (those steps hold the
  base learning rate and are not policy updates: the schedule counts captioner steps only);
- spider_pg without baseline pretraining.

Every model (and the XE warm start) captions the validation and test splits once with beam search (3 beams) and is
scored with CIDEr-D, BLEU-4, ROUGE-L, METEOR (Java), the scene grounding of `rlcaption.evaluation.evaluate_model`
(object F1, parse failures), the diversity of the captions (Self-BLEU-4, distinct captions) and the text-to-image
R@1 of the evaluator CLIP (`--eval-clip`, which no reward used). Nothing is chosen on test: each arm keeps the
learning rate of its best mean validation CIDEr-D over the seeds, and the test table and the verdicts are read at
those rates. `--plot` draws test CIDEr-D against that recall per arm; `--card` puts the tables and the plot into a
model card, `--page` into docs/methods/spider_pg.md. The dataset is the same for every seed (`--data-seed`); the
seed changes the data order and the sampling. The tables give the mean and the sample standard deviation over seeds.

`--xe-model FOLDER` is the saved XE model (with its processor) every seed's RL runs start from: the spread measures
the RL runs only (the XE row has none). Use the shapes sizes the XE model was trained with (the recipe's:
`--num-train 4000 --num-validation 200 --num-test 500`). `--jobs 2` runs two runs at a
time in separate processes, each on one thread.

Every run (each arm and seed, and the warm start's scores) is kept in its folder of `--output-dir` with the key of
`reproduction.py`'s cache (the arm's settings, the shared options, the code version, torch and transformers), so a
second invocation with the same options and code reads the scores instead of training again, and a folder made
otherwise is refused. The JSON report records the same code and library versions.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import datasets
import torch
from reproduction import (
    EVALUATOR_CLIP,
    REPOSITORY,
    GeneratedPage,
    benchmark_command,
    markdown_table,
    plot_to,
    provenance_line,
    run_key,
    run_once,
    summarise,
    write_card_section,
)
from verdicts import Headline, judge_headlines, verdict_lines

from rlcaption.data import load_shapes
from rlcaption.evaluation import caption_dataset, clip_scores, diversity_scores, scene_grounding_scores
from rlcaption.metrics import evaluate_captions, load_clip
from rlcaption.models import ShowTellRL
from rlcaption.processing import CaptionProcessor
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer

METRIC_KEYS = {"cider": "CIDEr", "bleu": "Bleu_4", "rouge_l": "ROUGE_L", "meteor": "METEOR"}
# what a consensus metric cannot see: grounding in the scene and the diversity of the test captions
EXTRA_KEYS = ["object_f1", "parse_failure_share", "Self-BLEU", "distinct_captions", "t2i_R@1"]
DISPLAY_NAMES = {
    "CIDEr": "CIDEr-D", "Bleu_4": "BLEU-4", "ROUGE_L": "ROUGE-L", "METEOR": "METEOR", "object_f1": "object F1",
    "parse_failure_share": "parse fail.", "Self-BLEU": "Self-BLEU-4", "distinct_captions": "distinct",
    "t2i_R@1": "evaluator T2I R@1", "policy_steps": "policy steps", "train_seconds": "train s",
}  # fmt: skip
CIDER_REWARD = ["cider"]
# Liu et al. 2017's "BCMR": BLEU-4, CIDEr-D, METEOR and ROUGE-L with equal weights
BCMR_REWARD = ["bleu", "cider", "meteor", "rouge_l"]
HEADLINES = (
    Headline("CIDEr", "spider_pg", "XE", metric="CIDEr-D"),
    Headline("CIDEr", "spider_pg, BCMR", "XE", metric="CIDEr-D"),
    Headline("CIDEr", "spider_pg", "SCST", metric="CIDEr-D"),
    Headline("t2i_R@1", "spider_pg", "SCST", metric="evaluator T2I R@1"),
    Headline("CIDEr", "spider_pg, BCMR", "SCST, BCMR", metric="CIDEr-D"),
    Headline("t2i_R@1", "spider_pg, BCMR", "SCST, BCMR", metric="evaluator T2I R@1"),
    Headline("CIDEr", "spider_pg", "spider_pg, no pretraining", metric="CIDEr-D"),
)
# the page, README row and kept results its `--page` writes
PAGE = GeneratedPage(Path(__file__).name, REPOSITORY / "docs" / "methods" / "spider_pg.md", "spider_pg")

# options that say where results go or how they are shown, not how a run trains: left out of results.json
NOT_SETTINGS = ("versions", "threads_per_job", "output_dir", "output", "plot", "card", "from_results", "page")

_shapes: datasets.DatasetDict | None = None  # each worker process loads the dataset once


def _train(model, processor, train_split, output_dir: str, seed: int, **settings) -> float:
    settings.setdefault("reward_funcs", CIDER_REWARD)
    args = RLCaptionConfig(
        output_dir=output_dir, use_cpu=True, per_device_train_batch_size=32, save_strategy="no", logging_steps=50,
        disable_tqdm=True, seed=seed, dataloader_num_workers=0, report_to=[], **settings,
    )  # fmt: skip
    trainer = RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=train_split)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model(output_dir)
    return seconds


def _score(model, processor, test_split, metrics: list[str], eval_clip: str) -> dict[str, float]:
    """The metrics of `rlcaption.evaluation.evaluate_model`, the diversity of the same beam-3 captions and the
    evaluator CLIP's retrieval of each image from its caption."""
    predictions, references = caption_dataset(model.eval(), processor, test_split, num_beams=3, max_length=21)
    scores = {**evaluate_captions(predictions, references, metrics=metrics)}
    scores.update(scene_grounding_scores(predictions, test_split))
    scores.update(diversity_scores(predictions, None, ["self_bleu", "distinct_captions"]))
    scores.update(clip_scores(predictions, test_split, load_clip(eval_clip)))
    keys = [METRIC_KEYS[metric] for metric in metrics] + EXTRA_KEYS
    return {key: float(scores[key]) for key in keys}


def _arms(args) -> dict[str, dict]:
    """The RL arms by name: their objective's settings; `max_steps` counts policy updates plus pretraining steps."""
    scst = {"objective": "scst", "num_samples_per_image": 5, "baseline": "greedy"}
    spider = {"objective": "spider_pg", "num_paths_per_image": 1, "num_rollouts": 3}
    pretraining = args.baseline_pretraining_steps
    arms = {
        "SCST": {**scst, "max_steps": args.policy_steps},
        "spider_pg": {
            **spider,
            "baseline_pretraining_steps": pretraining,
            "max_steps": args.policy_steps + pretraining,
        },
        "spider_pg, no pretraining": {**spider, "max_steps": args.policy_steps},
    }
    if args.bcmr:
        arms["SCST, BCMR"] = {**arms["SCST"], "reward_funcs": BCMR_REWARD}
        arms["spider_pg, BCMR"] = {**arms["spider_pg"], "reward_funcs": BCMR_REWARD}
    return arms


def _load_shapes(args) -> datasets.DatasetDict:
    global _shapes
    if _shapes is None:
        datasets.disable_progress_bars()
        _shapes = load_shapes(
            args.num_train, args.num_validation, args.num_test, image_size=args.image_size, seed=args.data_seed
        )
    return _shapes


def _shared_options(args) -> list[str]:
    """The options every run depends on, as its cache key records them (the arm's settings and seed besides)."""
    return [
        "--data-seed", str(args.data_seed), "--num-train", str(args.num_train),
        "--num-validation", str(args.num_validation), "--num-test", str(args.num_test),
        "--image-size", str(args.image_size), "--xe-model", str(args.xe_model), "--metrics", *args.metrics,
        "--eval-clip", str(args.eval_clip),
    ]  # fmt: skip


def _run_dir(args, name: str, seed: int | None = None) -> Path:
    folder = name.replace(", ", "-").replace(" ", "-") + (f"-seed{seed}" if seed is not None else "")
    return Path(args.output_dir).resolve() / folder


def _key(args, name: str, options: list[str]) -> dict:
    """The cache key of a run: its arm and options, and the code and library versions read once at the start."""
    return {**args.versions, "recipe": f"compare_objectives.py: {name}", "options": options}


def _score_warm_start(args) -> dict[str, dict[str, float]]:
    """The XE warm start's validation and test scores, cached like a run."""

    def score() -> dict[str, dict[str, float]]:
        processor = CaptionProcessor.from_pretrained(args.xe_model)
        model = ShowTellRL.from_pretrained(args.xe_model)
        return {
            split: {
                **_score(model, processor, _load_shapes(args)[split], args.metrics, args.eval_clip),
                "train_seconds": 0.0,
                "policy_steps": 0.0,
            }  # fmt: skip
            for split in ("validation", "test")
        }

    return run_once(_run_dir(args, "XE"), _key(args, "XE warm start", _shared_options(args)), score)


def _run_arm(args, name: str, settings: dict, seed: int, learning_rate: float) -> dict[str, dict[str, float]]:
    """
    Trains one RL arm at one learning rate from the shared XE model and scores it on the validation and test splits
    (a worker process's job), unless the run is cached in its folder of `--output-dir`.
    """
    torch.set_num_threads(args.threads_per_job)
    rl_settings = {**settings, "learning_rate": learning_rate}
    output_dir = _run_dir(args, f"{name}, lr {learning_rate:g}", seed)

    def train_and_score() -> dict[str, dict[str, float]]:
        shapes = _load_shapes(args)
        processor = CaptionProcessor.from_pretrained(args.xe_model)
        model = ShowTellRL.from_pretrained(args.xe_model)
        seconds = _train(model, processor, shapes["train"], str(output_dir), seed, **rl_settings)
        extra = {"train_seconds": seconds, "policy_steps": float(args.policy_steps)}
        return {
            split: {**_score(model, processor, shapes[split], args.metrics, args.eval_clip), **extra}
            for split in ("validation", "test")
        }

    options = ["--seed", str(seed), "--settings", json.dumps(rl_settings, sort_keys=True), *_shared_options(args)]
    scores = run_once(output_dir, _key(args, name, options), train_and_score)
    print(f"[seed {seed}] {name}, lr {learning_rate:g}: {scores['test']}", flush=True)
    return scores


def comparisons_of(results: dict) -> list:
    """
    The headlines on test at each arm's chosen learning rate, judged as one family by the rule of `verdicts.py`,
    paired by seed (every arm starts from the same warm start with the same seeds and data order): Liu et al.'s claim
    that spider_pg improves on the MLE model, and each spider_pg arm against SCST with the same reward and against
    spider_pg without baseline pretraining, in the direction of the method's claim to improve on them.
    """
    seeds, runs = results["seeds"], test_runs(results)
    per_seed = {arm: dict(zip(seeds, rows, strict=True)) for arm, rows in runs.items() if arm != "XE"}
    # the warm start is one fixed model: its score stands for every seed, so the spread is the RL runs' alone
    per_seed["XE"] = dict.fromkeys(seeds, runs["XE"][0])
    return judge_headlines(per_seed, HEADLINES)


def _plot(summary, path) -> None:
    """CIDEr-D against the evaluator CLIP's text-to-image R@1, one point per arm (mean ± s.d. over seeds)."""
    with plot_to(path) as axes:
        for index, (name, stats) in enumerate(summary.items()):
            axes.errorbar(
                stats["CIDEr"][0], stats["t2i_R@1"][0], xerr=stats["CIDEr"][1], yerr=stats["t2i_R@1"][1],
                capsize=3, linestyle="none", color=f"C{index}",
                marker="s" if "BCMR" in name else "o", label=name,
            )  # fmt: skip
        axes.set_xlabel("CIDEr-D (test, beam 3)")
        axes.set_ylabel("text-to-image R@1 by the evaluator CLIP (test)")
        axes.set_title(
            "Shapes: SCST and spider_pg from one XE start\n(test split, mean ± s.d. over seeds)", fontsize=10
        )


def chosen_learning_rates(results: dict) -> dict[str, str]:
    """Each arm's learning rate: the one whose runs have the best mean validation CIDEr-D over the seeds."""
    return {
        arm: max(by_rate, key=lambda rate: statistics.mean(run["validation"]["CIDEr"] for run in by_rate[rate]))
        for arm, by_rate in results["runs"].items()
    }


def test_runs(results: dict) -> dict[str, list[dict[str, float]]]:
    """The test scores of each arm's runs at its chosen learning rate, by arm (the warm start as `XE`)."""
    chosen = chosen_learning_rates(results)
    return {"XE": [results["warm_start"]["test"]]} | {
        arm: [run["test"] for run in by_rate[chosen[arm]]] for arm, by_rate in results["runs"].items()
    }


def render_tables(results: dict) -> list[str]:
    """The validation table of every arm and learning rate, the test table at the chosen ones, and the verdicts."""
    settings, chosen = results["settings"], chosen_learning_rates(results)
    keys = [METRIC_KEYS[metric] for metric in settings["metrics"]] + EXTRA_KEYS
    validation = {"XE": [results["warm_start"]["validation"]]} | {
        f"{arm}, lr {rate}": [run["validation"] for run in runs]
        for arm, by_rate in results["runs"].items()
        for rate, runs in by_rate.items()
    }
    test = {f"{arm} (lr {chosen[arm]})" if arm in chosen else arm: runs for arm, runs in test_runs(results).items()}
    columns = [(key, DISPLAY_NAMES[key]) for key in [*keys, "train_seconds"]]

    def table(runs: dict[str, list[dict[str, float]]]) -> str:
        rows = {name: summarise(scores, [key for key, _ in columns]) for name, scores in runs.items()}
        counts = {name: len(scores) for name, scores in runs.items()}
        return markdown_table(rows, counts, columns, "model", {"distinct_captions": 1, "train_seconds": 0})

    budget = (
        f"every RL arm {settings['policy_steps']} policy updates (batch 32), linear decay over the policy updates; "
        f"spider_pg's baseline pretrained {settings['baseline_pretraining_steps']} steps first"
    )
    return [
        f"Validation split ({settings['num_validation']} images), beam 3, mean ± s.d. over seeds; {budget}; each "
        f"arm's learning rate is the one of its best mean validation CIDEr-D\n\n" + table(validation),
        f"Test split ({settings['num_test']} images), beam 3, each arm at its chosen learning rate; warm start "
        f"{settings['xe_model']}; {results['minutes']:.0f} min in all with {settings['jobs']} job(s)\n\n"
        + table(test),
        verdict_lines(comparisons_of(results)),
    ]


def page_block(results: dict) -> str:
    """What docs/methods/spider_pg.md shows between this benchmark's markers."""
    selection = "each arm's learning rate chosen on validation, the verdicts read on test"
    return "\n\n".join([provenance_line(results, selection), *render_tables(results)])


def run_comparison(args) -> dict:
    """Trains the runs that are not cached, reads the others, and returns the results `--output` and the page keep."""
    # two processes on two cores run best on one thread each
    args.threads_per_job = max(1, (os.cpu_count() or 1) // args.jobs)
    # read once, so that every run and the report name the code as it was when the comparison started
    args.versions = {field: value for field, value in run_key("", []).items() if field not in ("recipe", "options")}
    torch.set_num_threads(args.threads_per_job)
    start = time.perf_counter()
    warm_start = _score_warm_start(args)
    arms = _arms(args)
    jobs = [
        (name, settings, seed, rate)
        for seed in args.seeds
        for name, settings in arms.items()
        for rate in args.learning_rates
    ]
    context = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no forked torch threads
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        futures = [pool.submit(_run_arm, args, *job) for job in jobs]
        scores = [future.result() for future in futures]
    runs: dict[str, dict[str, list]] = {}
    for (name, _, _, rate), run in zip(jobs, scores, strict=True):
        runs.setdefault(name, {}).setdefault(f"{rate:g}", []).append(run)
    # what the runs depend on, with paths inside the repository as the documented command writes them; not where
    # this invocation put its outputs
    settings = {name: value for name, value in vars(args).items() if name not in NOT_SETTINGS}
    if Path(args.eval_clip).resolve().is_relative_to(REPOSITORY):
        settings["eval_clip"] = str(Path(args.eval_clip).resolve().relative_to(REPOSITORY))
    return {
        "command": benchmark_command(),
        **args.versions,
        "seeds": args.seeds,
        "settings": json.loads(json.dumps(settings, default=str)),
        "warm_start": warm_start,
        "runs": runs,
        "minutes": (time.perf_counter() - start) / 60,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--num-validation", type=int, default=200)
    parser.add_argument("--num-test", type=int, default=500)
    parser.add_argument("--image-size", type=int, default=48)
    parser.add_argument("--xe-model", required=True, help="The saved XE model every RL run starts from.")
    # SCST's reproduction budget (1 epoch of 4000 images at batch 32) for every arm
    parser.add_argument("--policy-steps", type=int, default=125, help="Policy updates of every RL arm.")
    # SCST's reproduction rate and the spider_pg recipe's: each arm keeps the better on validation
    parser.add_argument(
        "--learning-rates", type=float, nargs="+", default=[2e-4, 5e-4],
        help="Learning rates every arm is trained at; each arm keeps the one of its best validation CIDEr-D.",
    )  # fmt: skip
    parser.add_argument("--baseline-pretraining-steps", type=int, default=50, help="spider_pg's, before them.")
    parser.add_argument("--bcmr", action="store_true", help="Add SCST and spider_pg with the BCMR reward mix.")
    parser.add_argument("--jobs", type=int, default=1, help="Runs trained at a time, in separate processes.")
    parser.add_argument("--metrics", nargs="+", default=list(METRIC_KEYS), choices=list(METRIC_KEYS))
    parser.add_argument("--eval-clip", default=str(REPOSITORY / EVALUATOR_CLIP), help="The evaluator CLIP.")
    parser.add_argument(
        "--output-dir", default="runs/compare_objectives", help="The cache: one folder per run (arm, rate and seed)."
    )
    parser.add_argument("--output", default=None, help="Optional JSON file for the per-seed scores.")
    parser.add_argument("--plot", default=None, help="Optional picture of CIDEr-D against the evaluator's R@1.")
    parser.add_argument("--card", default=None, help="Optional model card (README.md) to put the table into.")
    PAGE.add_arguments(parser)
    args = parser.parse_args()
    results, tables = PAGE.report(
        args, lambda: run_comparison(args), Path(args.output_dir), render_tables, page_block, comparisons_of
    )
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    if args.plot:
        keys = ["CIDEr", "t2i_R@1"]
        _plot({name: summarise(runs, keys) for name, runs in test_runs(results).items()}, Path(args.plot))
    if args.card:
        plot = Path(args.plot) if args.plot else None
        body = f"`{results['command']}`:\n\n" + "\n\n".join(tables)
        write_card_section(Path(args.card), "Against SCST on shapes", body, plot, "CIDEr-D against evaluator R@1")


if __name__ == "__main__":
    main()
