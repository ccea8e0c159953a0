"""
What `rlcaption demo` reports besides the scores: what the captions state (repeated objects, sizes, relations), a
choice of test images of distinct scenes for its picture, the CPU threads it trains with, and its results as a
Markdown block (`results.md`) that the README includes as it is.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from .grounding import ground_caption

__all__ = [
    "CAPTION_HABIT_COLUMNS",
    "README_BLOCK_BEGIN",
    "README_BLOCK_END",
    "SCORE_COLUMNS",
    "caption_habits",
    "distinct_scene_indices",
    "idle_cores",
    "readme_with_demo_block",
    "results_markdown",
]

# (score key, header) of the comparison table; a column is shown when any row has the key
SCORE_COLUMNS = (
    ("CIDEr", "CIDEr-D"),
    ("Bleu_4", "BLEU-4"),
    ("object_f1", "object F1"),
    ("generic_share", "generic"),
    ("parse_failure_share", "parse failures"),
    ("CLIP-S", "CLIP-S"),
    ("t2i_R@1", "t2i R@1"),
)
# (key, header): what RL changes in the wording, beyond the scores: the shares of `caption_habits` and the scene
# grounding's accuracy of the relations stated
CAPTION_HABIT_COLUMNS = (
    ("repeated_object_share", "names an object more often than the image has it"),
    ("size_share", "states a size"),
    ("relation_share", "states a relation"),
    ("relation_accuracy", "the relation is right"),
)


def caption_habits(captions: Sequence[str], scenes: Sequence[Any]) -> dict[str, float]:
    """
    The share of `captions` that name a colour-shape pair more often than their scene holds it ("an orange square
    and an orange square" for one orange square), that state the size of an object, and that state a spatial
    relation, as `rlcaption.shapes.grounding` parses them.

    Args:
        captions (`Sequence[str]`): one caption per image.
        scenes (`Sequence`): the matching rows of the shapes `scene` column.

    Returns:
        `{"repeated_object_share": ..., "size_share": ..., "relation_share": ...}`, each in [0, 1].
    """
    if len(captions) != len(scenes) or not captions:
        raise ValueError(f"caption_habits needs one scene per caption, got {len(captions)} and {len(scenes)}.")
    repeated = sizes = relations = 0
    for caption, scene in zip(captions, scenes, strict=True):
        parse = ground_caption(caption, scene).parse
        present = Counter((obj["color"], obj["shape"]) for obj in scene)
        named = Counter((mention.color, mention.shape) for mention in parse.mentions)
        repeated += any(count > present[pair] for pair, count in named.items() if count > 1)
        sizes += any(mention.size is not None for mention in parse.mentions)
        relations += parse.relation is not None
    return {
        "repeated_object_share": repeated / len(captions),
        "size_share": sizes / len(captions),
        "relation_share": relations / len(captions),
    }


def _near_duplicates(first: Sequence[Mapping[str, Any]], second: Sequence[Mapping[str, Any]]) -> bool:
    """Whether two scenes differ in at most one object (how the dataset's near-duplicate families are made)."""
    if len(first) != len(second):
        return False

    def attributes(obj):
        return (obj["shape"], obj["color"], obj["size"], obj["row"], obj["column"])

    shared = Counter(map(attributes, first)) & Counter(map(attributes, second))
    return sum(shared.values()) >= len(first) - 1


def distinct_scene_indices(scenes: Sequence[Sequence[Mapping[str, Any]]], count: int) -> list[int]:
    """
    The first `count` indices of `scenes`, in order, skipping every scene that is a near-duplicate (at most one
    object changed) of one already taken, so that a picture of them shows `count` different scenes.
    """
    chosen: list[int] = []
    for index, scene in enumerate(scenes):
        if len(chosen) == count:
            break
        if not any(_near_duplicates(scene, scenes[other]) for other in chosen):
            chosen.append(index)
    return chosen


def _cpu_times() -> tuple[int, int] | None:
    """`(idle, total)` jiffies of all CPUs since boot from /proc/stat, or `None` where it cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return idle, sum(fields[:8])  # guest time is already counted in user time


def idle_cores(sample_seconds: float = 0.5) -> int:
    """
    The number of this process's cores that sat idle over the next `sample_seconds` (at least 1): how many threads
    can compute without waiting for another program. All of this process's cores where /proc/stat is unreadable.
    """
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    before = _cpu_times()
    time.sleep(sample_seconds)
    after = _cpu_times()
    if before is None or after is None or after[1] <= before[1]:
        return usable
    idle_share = (after[0] - before[0]) / (after[1] - before[1])
    return max(1, min(usable, round(idle_share * (os.cpu_count() or usable))))


def _table(rows: Mapping[str, Mapping[str, float]], columns: Sequence[tuple[str, str]], first: str) -> list[str]:
    shown = [(key, header) for key, header in columns if any(key in scores for scores in rows.values())]
    lines = [f"| {first} | " + " | ".join(header for _, header in shown) + " |", "|---|" + "---|" * len(shown)]
    for name, scores in rows.items():
        # a ratio with nothing to count (no relation stated) is nan: shown as a dash
        cells = [f"{scores[key]:.3f}" if scores.get(key, math.nan) == scores.get(key) else "–" for key, _ in shown]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _change(name: str, before: float, after: float, as_percent: bool = False) -> str:
    if as_percent:
        return f"{name} {before:.0%} → {after:.0%}"
    return f"{name} {before:.3f} → {after:.3f}"


def results_markdown(
    scores: Mapping[str, Mapping[str, float]],
    habits: Mapping[str, Mapping[str, float]],
    num_test_images: int,
    run_summary: str,
) -> str:
    """
    The demo's results as Markdown: the score table (rows `"XE greedy"`, `"SCST beam 3"`, ...), the table of
    [`caption_habits`], a line of what changes from XE to SCST in greedy decoding, and `run_summary` (how the run
    went: time, threads, seed).
    """
    xe, scst = scores["XE greedy"], scores["SCST greedy"]
    xe_habits, scst_habits = habits["XE greedy"], habits["SCST greedy"]
    changes = [_change(header, xe[key], scst[key]) for key, header in SCORE_COLUMNS if key in xe and key in scst]
    changes += [
        _change(header, xe_habits[key], scst_habits[key], as_percent=True)
        for key, header in CAPTION_HABIT_COLUMNS
        if key.endswith("_share")
    ]
    lines = [
        f"Shapes test split ({num_test_images} images); CLIP-S and text-to-image R@1 by the evaluator CLIP:",
        "",
        *_table(scores, SCORE_COLUMNS, "model"),
        "",
        f"What the captions state (share of the {num_test_images} captions):",
        "",
        *_table(habits, CAPTION_HABIT_COLUMNS, "model"),
        "",
        "From XE to SCST, greedy: " + "; ".join(changes) + ".",
        "",
        run_summary,
    ]
    return "\n".join(lines) + "\n"


README_BLOCK_BEGIN = "<!-- demo results: written by `make readme-demo` from runs/demo/results.md; do not edit -->"
README_BLOCK_END = "<!-- end of demo results -->"


def readme_with_demo_block(readme: str, results: str, picture: str) -> str:
    """
    `readme` with the text between [`README_BLOCK_BEGIN`] and [`README_BLOCK_END`] replaced by `results` (a demo's
    `results.md`) and the picture at the path `picture`.

    Raises:
        `ValueError`: when `readme` lacks either marker, or has them out of order.
    """
    begin, end = readme.find(README_BLOCK_BEGIN), readme.find(README_BLOCK_END)
    if begin < 0 or end < begin:
        raise ValueError(f"The README needs the lines {README_BLOCK_BEGIN!r} and then {README_BLOCK_END!r}.")
    block = f"{results.strip()}\n\n![Shapes test images with the XE and SCST greedy captions]({picture})\n"
    return readme[: begin + len(README_BLOCK_BEGIN)] + "\n\n" + block + "\n" + readme[end:]
