"""Quality of XE, SCST and spider_pg (Liu et al. 2017) on the shapes test split, averaged over several seeds.

    python benchmarks/compare_objectives.py [--seeds 0 1 2] [--num-train 2000] [--xe-epochs 3] [--rl-epochs 1]
                                            [--output compare_objectives.json]

For each seed: a ShowTellRL of the demo's size is trained with teacher forcing (XE), then, from the same XE weights,
with SCST (5 samples per image, greedy baseline) and with spider_pg (M = 1 sampled caption per image, K = 3 rollouts
per prefix, learned baseline), both with the CIDEr-D reward and the same learning rate and number of epochs. The
three models caption the test split with beam search (3 beams) and are scored with CIDEr-D, BLEU-4, ROUGE-L and
METEOR (Java). The dataset is the same for every seed (`--data-seed`); the seed changes the initialisation, the data
order and the sampling. The table gives the mean and the sample standard deviation over seeds.

`--xe-model FOLDER` starts every seed's SCST and spider_pg from one saved XE model (with its processor) instead of
training XE per seed: the spread then measures the RL runs only (the XE row has none). Use the shapes sizes the XE
model was trained with (the recipe's: `--num-train 4000 --num-validation 200 --num-test 500`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import datasets
import torch

from rlcaption.data import load_shapes
from rlcaption.evaluation import evaluate_model
from rlcaption.models import ShowTellRL, ShowTellRLConfig
from rlcaption.processing import CaptionProcessor
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer

METRIC_KEYS = {"cider": "CIDEr", "bleu": "Bleu_4", "rouge_l": "ROUGE_L", "meteor": "METEOR"}
DISPLAY_NAMES = {"CIDEr": "CIDEr-D", "Bleu_4": "BLEU-4", "ROUGE_L": "ROUGE-L", "METEOR": "METEOR"}


def _new_model(processor: CaptionProcessor, image_size: int, seed: int) -> ShowTellRL:
    torch.manual_seed(seed)
    tokenizer = processor.tokenizer
    config = ShowTellRLConfig(
        vocab_size=len(tokenizer), hidden_size=128, word_embedding_size=128,
        image_size=image_size, cnn_channels=[16, 32, 32, 32], dropout=0.2, max_caption_length=20,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return ShowTellRL(config)


def _train(model, processor, train_split, output_dir: str, seed: int, **settings) -> float:
    args = RLCaptionConfig(
        output_dir=output_dir, use_cpu=True, per_device_train_batch_size=32, save_strategy="no", logging_steps=50,
        disable_tqdm=True, seed=seed, dataloader_num_workers=0, reward_funcs=["cider"], **settings,
    )  # fmt: skip
    trainer = RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=train_split)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model(output_dir)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--num-validation", type=int, default=200)
    parser.add_argument("--num-test", type=int, default=500)
    parser.add_argument("--image-size", type=int, default=48)
    parser.add_argument("--xe-model", default=None, help="A saved XE model shared by all seeds (see above).")
    parser.add_argument("--xe-epochs", type=float, default=3.0)
    parser.add_argument("--xe-learning-rate", type=float, default=2e-3)
    parser.add_argument("--rl-epochs", type=float, default=1.0)
    parser.add_argument("--rl-learning-rate", type=float, default=2e-4)
    parser.add_argument("--metrics", nargs="+", default=list(METRIC_KEYS), choices=list(METRIC_KEYS))
    parser.add_argument("--output", default=None, help="Optional JSON file for the per-seed scores and the summary.")
    args = parser.parse_args()
    datasets.disable_progress_bars()
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    shapes = load_shapes(
        args.num_train, args.num_validation, args.num_test, image_size=args.image_size, seed=args.data_seed
    )
    if args.xe_model is not None:
        processor = CaptionProcessor.from_pretrained(args.xe_model)
    else:
        captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
        processor = CaptionProcessor.from_captions(captions, min_count=1, image_size=args.image_size)
    rl_settings = {"num_train_epochs": args.rl_epochs, "learning_rate": args.rl_learning_rate}
    runs: dict[str, list[dict[str, float]]] = {"XE": [], "SCST": [], "spider_pg": []}
    with tempfile.TemporaryDirectory() as work_dir:
        for seed in args.seeds:
            models, seconds = {}, {}
            if args.xe_model is not None:
                xe_dir = args.xe_model
                models["XE"], seconds["XE"] = ShowTellRL.from_pretrained(xe_dir), 0.0
            else:
                xe_dir = os.path.join(work_dir, f"xe-{seed}")
                models["XE"] = _new_model(processor, args.image_size, seed)
                seconds["XE"] = _train(
                    models["XE"], processor, shapes["train"], xe_dir, seed, objective="xe",
                    num_train_epochs=args.xe_epochs, learning_rate=args.xe_learning_rate,
                )  # fmt: skip
            models["SCST"] = ShowTellRL.from_pretrained(xe_dir)
            seconds["SCST"] = _train(
                models["SCST"], processor, shapes["train"], os.path.join(work_dir, f"scst-{seed}"), seed,
                objective="scst", num_samples_per_image=5, baseline="greedy", **rl_settings,
            )  # fmt: skip
            models["spider_pg"] = ShowTellRL.from_pretrained(xe_dir)
            seconds["spider_pg"] = _train(
                models["spider_pg"], processor, shapes["train"], os.path.join(work_dir, f"spider-{seed}"), seed,
                objective="spider_pg", num_paths_per_image=1, num_rollouts=3, **rl_settings,
            )  # fmt: skip
            for name, model in models.items():
                scores = evaluate_model(
                    model.eval(), processor, shapes["test"], metrics=args.metrics, num_beams=3, max_length=21
                )
                row = {METRIC_KEYS[metric]: float(scores[METRIC_KEYS[metric]]) for metric in args.metrics}
                runs[name].append({**row, "train_seconds": seconds[name]})
                print(f"[seed {seed}] {name}: {row} ({seconds[name]:.0f} s of training)", flush=True)

    keys = [METRIC_KEYS[metric] for metric in args.metrics]
    summary = {
        name: {
            key: {
                "mean": statistics.mean(run[key] for run in scores),
                "std": statistics.stdev(run[key] for run in scores) if len(scores) > 1 else 0.0,
            }
            for key in [*keys, "train_seconds"]
        }
        for name, scores in runs.items()
    }
    warm_start = args.xe_model or f"XE {args.xe_epochs:g} epochs"
    print(
        f"\nshapes test split ({args.num_test} images), beam 3, mean ± std over seeds {args.seeds}; warm start "
        f"{warm_start}, then SCST / spider_pg {args.rl_epochs:g} epoch(s) of {args.num_train} images at lr "
        f"{args.rl_learning_rate:g}"
    )
    header = " | ".join(f"{DISPLAY_NAMES[key]:>15}" for key in keys)
    print(f"| {'model':<10} | {header} | {'train s':>8} |")
    print(f"|{'-' * 12}|" + "|".join("-" * 17 for _ in keys) + f"|{'-' * 10}|")
    for name, stats in summary.items():
        cells = " | ".join(f"{stats[key]['mean']:7.3f} ± {stats[key]['std']:5.3f}" for key in keys)
        print(f"| {name:<10} | {cells} | {stats['train_seconds']['mean']:8.0f} |")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump({"settings": vars(args), "runs": runs, "summary": summary}, handle, indent=2)


if __name__ == "__main__":
    main()
