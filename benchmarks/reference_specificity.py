"""Does CIDEr-D reward seeing on shapes? Leave-one-out CIDEr-D of each kind of reference, and of a blind captioner.

    python benchmarks/reference_specificity.py [--num-train 8000 --num-test 1000] [--output reference_specificity.json]

For every test image, each reference is scored as a candidate against the image's other four references (CIDEr-D,
document frequencies from all test references, as the COCO evaluation does for the evaluated corpus):

- the two generic references (no colour and no shape named),
- the most specific reference (`most_specific_reference`: sizes, colours, shapes and a relation or location).

A captioner that sees and names the objects should beat one that copies generic sentences: the most specific
reference must win on average by a clear margin. The table also scores, against all five references, the best
*blind* captioner built from generic sentences: for each object count, the generic training reference with the
highest mean CIDEr-D on the training images of that count (a count-only captioner, which needs no colour or shape),
and the oracle that outputs each image's most specific reference.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict

import numpy as np

from rlcaption.metrics import CiderD, DocumentFrequencies, compute_cider_d, normalize_caption
from rlcaption.shapes.dataset import COLORS, SHAPES, load_shapes, most_specific_reference

_OBJECT_WORDS = set(COLORS) | {"grey"} | set(SHAPES)


def is_generic(caption: str) -> bool:
    return not _OBJECT_WORDS & set(caption.split())


def leave_one_out_scores(references: list[list[str]]) -> tuple[list[float], list[float], list[float]]:
    """Per image: mean leave-one-out CIDEr-D of its generic references, of its most specific one, of the rest."""
    tokenized = [[normalize_caption(caption) for caption in captions] for captions in references]
    scorer = CiderD(DocumentFrequencies.from_references(tokenized))
    generic, specific, mid_level = [], [], []
    for key, captions in enumerate(tokenized):
        most_specific = normalize_caption(most_specific_reference(references[key]))
        others = [[c for j, c in enumerate(captions) if j != i] for i in range(len(captions))]
        scores = scorer.score(captions, others, keys=[(key, i) for i in range(len(captions))])
        generic.append(float(np.mean([s for c, s in zip(captions, scores, strict=True) if is_generic(c)])))
        specific.append(float(scores[captions.index(most_specific)]))
        rest = [s for c, s in zip(captions, scores, strict=True) if not is_generic(c) and c != most_specific]
        mid_level.append(float(np.mean(rest)) if rest else float("nan"))
    return generic, specific, mid_level


def best_generic_caption_per_count(train) -> dict[int, str]:
    """For each object count, the generic training reference with the highest mean CIDEr-D on that count's images."""
    by_count: dict[int, list[list[str]]] = defaultdict(list)
    for captions, scene in zip(train["captions"], train["scene"], strict=True):
        by_count[len(scene)].append([normalize_caption(caption) for caption in captions])
    best = {}
    for count, references in by_count.items():
        candidates = Counter(c for captions in references for c in captions if is_generic(c))
        frequent = [caption for caption, _ in candidates.most_common(40)]
        keys = list(range(len(references)))
        means = []
        for candidate in frequent:
            score, _ = compute_cider_d(dict.fromkeys(keys, candidate), dict(zip(keys, references, strict=True)))
            means.append(score)
        best[count] = frequent[int(np.argmax(means))]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-train", type=int, default=8000)
    parser.add_argument("--num-validation", type=int, default=1000)
    parser.add_argument("--num-test", type=int, default=1000)
    parser.add_argument("--output", default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    shapes = load_shapes(args.num_train, args.num_validation, args.num_test)
    test = shapes["test"]
    generic, specific, mid_level = leave_one_out_scores(test["captions"])
    generic, specific = np.array(generic), np.array(specific)

    best_generic = best_generic_caption_per_count(shapes["train"])
    keys = list(range(test.num_rows))
    references = {
        key: [normalize_caption(c) for c in captions] for key, captions in zip(keys, test["captions"], strict=True)
    }
    blind = {key: best_generic[len(scene)] for key, scene in zip(keys, test["scene"], strict=True)}
    oracle = {
        key: normalize_caption(most_specific_reference(c)) for key, c in zip(keys, test["captions"], strict=True)
    }
    blind_score, _ = compute_cider_d(blind, references)
    oracle_score, _ = compute_cider_d(oracle, references)
    sentence_counts = Counter(c for captions in shapes["train"]["captions"] for c in set(captions) if is_generic(c))
    top_sentence, top_count = sentence_counts.most_common(1)[0]

    figures = {
        "test_images": test.num_rows,
        "loo_cider_generic_mean": float(generic.mean()),
        "loo_cider_most_specific_mean": float(specific.mean()),
        "loo_cider_mid_level_mean": float(np.nanmean(mid_level)),
        "share_specific_beats_generic": float((specific > generic).mean()),
        "blind_count_only_captioner_cider": blind_score,
        "blind_captions": {str(count): caption for count, caption in sorted(best_generic.items())},
        "oracle_most_specific_cider": oracle_score,
        "most_frequent_generic_sentence": top_sentence,
        "most_frequent_generic_sentence_share_of_train_images": top_count / shapes["train"].num_rows,
    }
    print(f"Shapes test split, {test.num_rows} images; CIDEr-D document frequencies from the test references\n")
    print("| candidate | CIDEr-D | against |")
    print("|---|---|---|")
    print(f"| generic references (mean of 2) | {generic.mean():.3f} | the other four references |")
    print(f"| mid-level references | {np.nanmean(mid_level):.3f} | the other four references |")
    print(f"| most specific reference | {specific.mean():.3f} | the other four references |")
    print(f"| best count-only generic caption | {blind_score:.3f} | all five references |")
    print(f"| most specific reference (oracle) | {oracle_score:.3f} | all five references (includes itself) |")
    print(
        f"\nThe most specific reference beats the image's generic ones on {100 * (specific > generic).mean():.1f}% of "
        f"images (ratio of means {specific.mean() / generic.mean():.2f}x)."
    )
    print(
        f"Most frequent generic sentence: {top_sentence!r}, on {100 * top_count / shapes['train'].num_rows:.1f}% of "
        "training images."
    )
    print(f"Best blind captions per object count: {best_generic}")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)


if __name__ == "__main__":
    main()
