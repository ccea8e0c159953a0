"""Caption metrics and the CIDEr-D reward, side by side with pycocoevalcap 1.2: time and agreement.

    python benchmarks/bench_metrics.py --data-dir ../shared/data --output bench_metrics.json [--clock cpu]

Part 1 (corpus metrics): the 5,000 Karpathy-test images of COCO; references = each image's captions except the 5th,
candidates = (a) the held-out 5th caption of the same image, (b) the 5th caption of another image (a fixed
shuffle). Captions are tokenized once with `normalize_caption`; both implementations score the same tokens. Each row
gives the time of ours and of pycocoevalcap, their ratio, and the largest |difference| over the corpus score and all
per-image scores. METEOR runs when Java and `rlcaption.metrics.meteor` are available.

Part 2 (training loop): `--num-batches` batches of `--batch-size` raw captions for random images, scored by the
`cider` reward (document frequencies of the 5,000 images' references computed once, reference vectors cached per
`image_id`, raw captions tokenized inside the reward, the tokenizer's memo of recent captions cleared before every
batch) and by pycocoevalcap's `CiderScorer` per batch with the same document frequencies and pre-tokenized captions
(its `ref_len` set to log(number of images in the df corpus), as self-critical.pytorch's CiderD does). The first pass
over the batches builds the reference vectors of each image on first sight ("references uncached"); the second pass
finds them all cached, as from the second epoch of training on.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer
from pycocoevalcap.rouge.rouge import Rouge

from rlcaption.metrics import tokenization
from rlcaption.metrics.bleu import compute_bleu
from rlcaption.metrics.cider import CiderD, DocumentFrequencies, compute_cider_d
from rlcaption.metrics.rouge import compute_rouge_l
from rlcaption.metrics.tokenization import normalize_caption
from rlcaption.rewards import get_reward


class FixedDocumentFrequencyCiderScorer(CiderScorer):
    """pycocoevalcap's scorer with document frequencies from a training corpus (self-critical.pytorch's CiderD).

    `compute_cider` overwrites `ref_len` with log(number of evaluated images); the property ignores that write so the
    reference code runs unmodified with `ref_len = log(number of images in the df corpus)`.
    """

    ref_len = property(lambda self: self._fixed_ref_len, lambda self, value: None)

    def __init__(self, document_frequency: defaultdict, num_documents: int):
        super().__init__(n=4, sigma=6.0)
        self.document_frequency = document_frequency
        self._fixed_ref_len = np.log(float(num_documents))


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def clear_tokenizer_cache() -> None:
    """Forget the tokenizer's memo of recent captions, so every batch tokenizes its completions from scratch (as
    freshly sampled captions are) although this benchmark draws them from a small pool."""
    memo = getattr(tokenization, "_tokenize_cached", None)
    if memo is not None:
        memo.cache_clear()


def timed(function: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> tuple[object, float]:
    start = clock()
    result = function()
    return result, clock() - start


def load_karpathy_test(data_dir: Path) -> tuple[list[int], dict[int, list[str]], dict[int, str], dict[int, str]]:
    """Image ids, raw references (all but the 5th caption), held-out 5th captions, and shuffled 5th captions."""
    path = data_dir / "coco-val2014-captions" / "karpathy_test_captions.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; pass --data-dir pointing at the shared data directory.")
    images = json.loads(path.read_text())
    image_ids = [image["image_id"] for image in images]
    references = {image["image_id"]: image["captions"][:4] + image["captions"][5:] for image in images}
    held_out = {image["image_id"]: image["captions"][4] for image in images}
    donors = image_ids[:]
    random.Random(0).shuffle(donors)
    shuffled = {image_id: held_out[donor] for image_id, donor in zip(image_ids, donors, strict=True)}
    return image_ids, references, held_out, shuffled


def max_delta(ours_corpus, ours_per_image: dict, theirs_corpus, theirs_per_image, keys: list) -> float:
    ours = np.concatenate([np.ravel(ours_corpus), np.ravel([ours_per_image[key] for key in keys])])
    theirs = np.concatenate([np.ravel(theirs_corpus), np.ravel(theirs_per_image)])
    return float(np.abs(ours - theirs).max())


def corpus_rows(
    keys: list[int],
    predictions: dict[int, str],
    references: dict[int, list[str]],
    with_meteor: bool,
    clock: Callable[[], float],
) -> list[dict]:
    """Time and agreement of each corpus metric on tokenized inputs."""
    theirs_predictions = {key: [predictions[key]] for key in keys}
    rows = []

    def add(metric: str, ours: Callable, theirs: Callable, compare: Callable) -> None:
        ours_result, ours_seconds = timed(ours, clock)
        theirs_result, theirs_seconds = timed(theirs, clock)
        rows.append(
            {
                "metric": metric,
                "ours_s": ours_seconds,
                "reference_s": theirs_seconds,
                "speedup": theirs_seconds / ours_seconds,
                "max_abs_delta": compare(ours_result, theirs_result),
            }
        )

    add(
        "BLEU-1..4",
        lambda: compute_bleu(predictions, references),
        lambda: Bleu(4).compute_score(references, theirs_predictions, verbose=0),
        lambda ours, theirs: max(
            max_delta(ours[0][n], {k: v[n] for k, v in ours[1].items()}, theirs[0][n], theirs[1][n], keys)
            for n in range(4)
        ),
    )
    add(
        "ROUGE-L",
        lambda: compute_rouge_l(predictions, references),
        lambda: Rouge().compute_score(references, theirs_predictions),
        lambda ours, theirs: max_delta(*ours, *theirs, keys),
    )
    add(
        "CIDEr-D",
        lambda: compute_cider_d(predictions, references),
        lambda: Cider().compute_score(references, theirs_predictions),
        lambda ours, theirs: max_delta(*ours, *theirs, keys),
    )
    if with_meteor:
        from pycocoevalcap.meteor.meteor import Meteor

        from rlcaption.metrics.meteor import MeteorScorer

        def ours_meteor():
            scorer = MeteorScorer()
            try:
                return scorer.score(predictions, references)
            finally:
                scorer.close()

        def theirs_meteor():
            scorer = Meteor()
            try:
                return scorer.compute_score(references, theirs_predictions)
            finally:
                del scorer  # its __del__ stops the JVM

        add(
            "METEOR (incl. JVM start)",
            ours_meteor,
            theirs_meteor,
            lambda ours, theirs: max_delta(*ours, *theirs, keys),
        )
    return rows


def training_loop_rows(
    image_ids: list[int],
    raw_references: dict[int, list[str]],
    raw_candidates: dict[int, list[str]],
    num_batches: int,
    batch_size: int,
    clock: Callable[[], float],
) -> list[dict]:
    """The `cider` reward vs pycocoevalcap's CiderScorer per batch, same document frequencies."""
    tokenized_references = {key: [normalize_caption(r) for r in refs] for key, refs in raw_references.items()}
    document_frequencies = DocumentFrequencies.from_references(tokenized_references[key] for key in image_ids)
    # built once and shared by every batch's reference scorer, so its cost is not charged to the reference
    reference_df = defaultdict(
        float, {ngram: float(document_frequencies[ngram]) for ngram in document_frequencies.index}
    )

    generator = random.Random(1)
    batches = []
    for _ in range(num_batches):
        batch_ids = [generator.choice(image_ids) for _ in range(batch_size)]
        batch_candidates = [generator.choice(raw_candidates[image_id]) for image_id in batch_ids]
        batches.append((batch_ids, batch_candidates))

    reward = get_reward("cider", document_frequencies=document_frequencies)
    ours_values, ours_seconds = [], 0.0
    for batch_ids, batch_candidates in batches:
        references = [raw_references[image_id] for image_id in batch_ids]
        clear_tokenizer_cache()
        values, seconds = timed(
            lambda: reward(completions=batch_candidates, references=references, image_id=batch_ids),  # noqa: B023
            clock,
        )
        ours_values.append(values)
        ours_seconds += seconds
    # the same batches again: every image's references are now cached, as after the first epoch of training
    warm_seconds = 0.0
    for batch_ids, batch_candidates in batches:
        references = [raw_references[image_id] for image_id in batch_ids]
        clear_tokenizer_cache()
        _, seconds = timed(
            lambda: reward(completions=batch_candidates, references=references, image_id=batch_ids),  # noqa: B023
            clock,
        )
        warm_seconds += seconds

    # the scorer alone on pre-tokenized candidates (what the reference is given), references cached
    scorer = CiderD(document_frequencies)
    tokenized_batches = [
        (batch_ids, [normalize_caption(c) for c in batch_candidates]) for batch_ids, batch_candidates in batches
    ]
    for batch_ids, batch_candidates in tokenized_batches:  # fill the cache first, as in the warm reward pass
        scorer.score(batch_candidates, [tokenized_references[image_id] for image_id in batch_ids], keys=batch_ids)
    scorer_seconds = 0.0
    for batch_ids, batch_candidates in tokenized_batches:
        references = [tokenized_references[image_id] for image_id in batch_ids]
        _, seconds = timed(lambda: scorer.score(batch_candidates, references, keys=batch_ids), clock)  # noqa: B023
        scorer_seconds += seconds

    theirs_seconds, deltas = 0.0, []
    for (batch_ids, batch_candidates), values in zip(tokenized_batches, ours_values, strict=True):

        def reference_batch():
            reference = FixedDocumentFrequencyCiderScorer(reference_df, document_frequencies.num_documents)
            for image_id, candidate in zip(batch_ids, batch_candidates, strict=True):  # noqa: B023
                reference += (candidate, tokenized_references[image_id])
            return reference.compute_cider()

        theirs_values, seconds = timed(reference_batch, clock)
        theirs_seconds += seconds
        deltas.append(float(np.abs(np.asarray(values) - np.asarray(theirs_values)).max()))

    max_abs_delta = max(deltas)
    label = f"{num_batches} x {batch_size}"
    return [
        {
            "metric": f"cider reward, raw captions, references uncached ({label})",
            "ours_s": ours_seconds,
            "reference_s": theirs_seconds,
            "speedup": theirs_seconds / ours_seconds,
            "max_abs_delta": max_abs_delta,
        },
        {
            "metric": f"cider reward, raw captions, references cached ({label})",
            "ours_s": warm_seconds,
            "reference_s": theirs_seconds,
            "speedup": theirs_seconds / warm_seconds,
            "max_abs_delta": max_abs_delta,
        },
        {
            "metric": f"CiderD.score, tokenized captions, references cached ({label})",
            "ours_s": scorer_seconds,
            "reference_s": theirs_seconds,
            "speedup": theirs_seconds / scorer_seconds,
            "max_abs_delta": max_abs_delta,
        },
    ]


def java_available() -> bool:
    try:
        from rlcaption.metrics.java import check_java

        check_java(8)
    except (ImportError, RuntimeError) as error:
        print(f"METEOR skipped: {error}", file=sys.stderr)
        return False
    return True


def print_table(rows: list[dict]) -> None:
    width = max(len(row["metric"]) for row in rows)
    print(f"{'metric':<{width}}  {'ours s':>9}  {'reference s':>11}  {'speedup':>8}  {'max |delta|':>11}")
    for row in rows:
        print(
            f"{row['metric']:<{width}}  {row['ours_s']:>9.3f}  {row['reference_s']:>11.3f}  "
            f"{row['speedup']:>7.1f}x  {row['max_abs_delta']:>11.2e}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"), help="the shared data directory")
    parser.add_argument("--output", type=Path, default=None, help="write the table as JSON to this file")
    parser.add_argument("--num-batches", type=int, default=200, help="training-loop batches")
    parser.add_argument("--batch-size", type=int, default=250, help="captions per training-loop batch")
    parser.add_argument("--skip-meteor", action="store_true", help="do not run METEOR (Java)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="`wall` (elapsed time) or `cpu` (this process's CPU time, steadier on a shared machine; it does not "
        "count Java subprocesses, so METEOR is skipped)",
    )
    args = parser.parse_args(argv)
    clock = CLOCKS[args.clock]

    image_ids, raw_references, held_out, shuffled = load_karpathy_test(args.data_dir)
    tokenized_references, tokenize_seconds = timed(
        lambda: {key: [normalize_caption(r) for r in refs] for key, refs in raw_references.items()}
    )
    print(f"{len(image_ids)} images; references tokenized once in {tokenize_seconds:.2f} s")
    with_meteor = not args.skip_meteor and args.clock == "wall" and java_available()

    table = []
    for name, candidates in (("held-out 5th caption", held_out), ("shuffled captions", shuffled)):
        predictions = {key: normalize_caption(candidates[key]) for key in image_ids}
        for row in corpus_rows(image_ids, predictions, tokenized_references, with_meteor, clock):
            row["metric"] = f"{row['metric']} [{name}]"
            table.append(row)
    candidate_pool = {key: [held_out[key], shuffled[key]] for key in image_ids}
    table += training_loop_rows(image_ids, raw_references, candidate_pool, args.num_batches, args.batch_size, clock)

    print_table(table)
    if args.output is not None:
        summary = {"rows": table, "num_images": len(image_ids), "clock": args.clock}
        args.output.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
