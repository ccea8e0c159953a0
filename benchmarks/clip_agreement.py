"""How far the evaluator CLIP agrees with the reward CLIP: retrieval of each, top-1 agreement, CLIP-S correlation.

    python benchmarks/clip_agreement.py [--reward checkpoints/shapes-clip-reward]
                                        [--evaluator checkpoints/shapes-clip-evaluator] [--output clip_agreement.json]

On the CLIPs' test split (1,000 shapes images rendered at 64 px): each CLIP's retrieval R@1/5/10 with every image's
most specific reference; how often the two rank the same image first for a caption (text -> image top-1
agreement, over the most specific references and over all five references of every image); and the Pearson and
Spearman correlations of their CLIP-S of matching (image, reference) pairs. A captioner trained on one CLIP's reward
is judged by the other only if the two agree where they are right but are not copies of each other. Any CLIP id
works in place of either.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from scipy.stats import pearsonr, spearmanr

from rlcaption.data import load_shapes
from rlcaption.metrics import clip_s, embed_images, embed_texts, load_clip, retrieval_recall
from rlcaption.shapes.dataset import most_specific_reference


def _embeddings(model_name: str, images, texts: list[str]):
    model, processor = load_clip(model_name)
    return embed_images(model, processor, images, batch_size=250), embed_texts(model, processor, texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reward", default="checkpoints/shapes-clip-reward")
    parser.add_argument("--evaluator", default="checkpoints/shapes-clip-evaluator")
    parser.add_argument("--output", default=None, help="Optional JSON file for the results.")
    args = parser.parse_args()

    start = time.perf_counter()
    # the CLIPs' own test split (their cards' retrieval numbers): 1,000 images rendered at 64 px
    test = load_shapes(num_test=1000, image_size=64)["test"]
    images = list(test["image"])
    specific = [most_specific_reference(captions) for captions in test["captions"]]
    all_references = [caption for captions in test["captions"] for caption in captions]
    owner = np.repeat(np.arange(len(images)), [len(captions) for captions in test["captions"]])

    results: dict[str, dict] = {}
    top1: dict[str, dict[str, np.ndarray]] = {}
    scores: dict[str, np.ndarray] = {}
    for role, name in (("reward", args.reward), ("evaluator", args.evaluator)):
        image_embeddings, text_embeddings = _embeddings(name, images, specific + all_references)
        specific_embeddings, reference_embeddings = text_embeddings[: len(specific)], text_embeddings[len(specific) :]
        results[role] = {"model": name, **retrieval_recall(specific_embeddings, image_embeddings)}
        top1[role] = {
            "specific": (specific_embeddings @ image_embeddings.T).argmax(dim=1).numpy(),
            "all": (reference_embeddings @ image_embeddings.T).argmax(dim=1).numpy(),
        }
        scores[role] = clip_s(image_embeddings[owner], reference_embeddings)

    agreement = {
        f"top1_agreement_{queries}": float(np.mean(top1["reward"][queries] == top1["evaluator"][queries]))
        for queries in ("specific", "all")
    }
    both_right = (top1["reward"]["specific"] == np.arange(len(images))) & (
        top1["evaluator"]["specific"] == np.arange(len(images))
    )
    agreement["both_right_specific"] = float(both_right.mean())
    agreement["clip_s_pearson"] = float(pearsonr(scores["reward"], scores["evaluator"]).statistic)
    agreement["clip_s_spearman"] = float(spearmanr(scores["reward"], scores["evaluator"]).statistic)
    agreement["clip_s_mean"] = {role: float(values.mean()) for role, values in scores.items()}
    report = {"retrieval": results, "agreement": agreement, "seconds": round(time.perf_counter() - start, 1)}

    print(f"{'CLIP':<10} {'model':<36} " + " ".join(f"{key:>9}" for key in results["reward"] if key != "model"))
    for role, row in results.items():
        values = " ".join(f"{value:>9.3f}" for key, value in row.items() if key != "model")
        print(f"{role:<10} {row['model']:<36} {values}")
    for key, value in agreement.items():
        print(f"{key:<28} {value if isinstance(value, dict) else f'{value:.3f}'}")
    if args.output:
        with open(args.output, "w") as file:
            json.dump(report, file, indent=2)


if __name__ == "__main__":
    main()
