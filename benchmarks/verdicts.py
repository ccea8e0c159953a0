"""
The one rule by which every reproduction judges a headline: is one arm's metric, over seeds, above another's?

For each headline, the difference of the two arms' means with its confidence interval and two-sided p-value, from
Student's t distribution:

- **paired by seed** where both arms ran the same seeds on the same data order (from the same warm start, with the
  same batches): the interval of the mean of the per-seed differences, on n - 1 degrees of freedom. Pairing removes
  what the seed does to both arms alike;
- **Welch** otherwise: the difference of two independent means, with the Welch–Satterthwaite degrees of freedom.

The verdict is read off the interval only, in one vocabulary:

- "reproduced": the interval excludes 0 on the side of the paper's direction;
- "opposite": the interval excludes 0 on the other side;
- "not separated at N seeds": the interval holds 0.

Multiple comparisons: a page tests a family of headlines, each named before its runs. Each interval is a Bonferroni
interval for its family (confidence 1 - 0.05 / m for m headlines), so that the chance of any false "reproduced" or
"opposite" on a page stays at most 5%; the p-values printed are the unadjusted ones, next to the family size.

A reproduction names its headlines as [`Headline`]s and judges its per-seed runs with [`judge_headlines`]; a table
published as mean ± standard deviation only (no per-seed scores kept) can still be judged with Welch's interval
by [`compare_summaries`].
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats

__all__ = [
    "Comparison",
    "Headline",
    "compare_arms",
    "compare_family",
    "compare_summaries",
    "judge_headlines",
    "summary_cell",
    "verdict_lines",
]

# Which way the paper says the difference goes: first arm above the second (+1) or below it (-1).
DIRECTIONS = {"higher": 1, "lower": -1}


@dataclass(frozen=True)
class Comparison:
    """The difference `first - second` of two arms' means over seeds, with its interval and verdict."""

    metric: str
    first: str
    second: str
    difference: float
    low: float
    high: float
    p_value: float
    confidence: float
    test: str  # "paired" or "Welch"
    num_seeds: int  # the smaller arm's
    verdict: str

    def sentence(self) -> str:
        """One line for a page: the verdict with the numbers it was read from."""
        return (
            f"{self.metric}: {self.first} − {self.second} = {self.difference:+.3f} "
            f"[{self.low:+.3f}, {self.high:+.3f}] ({self.confidence:.1%} {self.test} interval, "
            f"p = {self.p_value:.3g}): {self.verdict}"
        )


def compare_arms(
    first: Mapping[int, float] | Sequence[float],
    second: Mapping[int, float] | Sequence[float],
    direction: str = "higher",
    paired: bool = True,
    confidence: float = 0.95,
    metric: str = "",
    names: tuple[str, str] = ("first", "second"),
) -> Comparison:
    """
    Judges `first - second` by the rule of the module docstring.

    Args:
        first, second: each arm's metric per seed: `{seed: value}`, or values in seed order. With `paired`, both must
            hold the same seeds (mappings are matched by seed, sequences by position).
        direction (`str`): the paper's claim, `"higher"` (first above second) or `"lower"`.
        paired (`bool`): whether the arms share seeds and data order; False gives Welch's interval.
        confidence (`float`): the interval's confidence; [`compare_family`] lowers 0.05 by the family's size.

    Raises:
        `ValueError`: an arm with fewer than 2 seeds, paired arms with different seeds, or an unknown direction.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {list(DIRECTIONS)}, not {direction!r}.")
    if paired:
        first_values, second_values = _paired_values(first, second)
    else:
        first_values, second_values = list(_values(first)), list(_values(second))
    if min(len(first_values), len(second_values)) < 2:
        raise ValueError(
            f"{metric or 'A comparison'} needs at least 2 seeds per arm to estimate a spread; got "
            f"{len(first_values)} and {len(second_values)}."
        )
    if paired:
        differences = [a - b for a, b in zip(first_values, second_values, strict=True)]
        difference = statistics.fmean(differences)
        standard_error = statistics.stdev(differences) / math.sqrt(len(differences))
        degrees_of_freedom = len(differences) - 1
    else:
        difference = statistics.fmean(first_values) - statistics.fmean(second_values)
        variance_first = statistics.variance(first_values) / len(first_values)
        variance_second = statistics.variance(second_values) / len(second_values)
        standard_error = math.sqrt(variance_first + variance_second)
        degrees_of_freedom = _welch_degrees_of_freedom(
            variance_first, variance_second, len(first_values), len(second_values)
        )
    return _comparison(
        difference, standard_error, degrees_of_freedom, confidence, direction, metric, names,
        test="paired" if paired else "Welch", num_seeds=min(len(first_values), len(second_values)),
    )  # fmt: skip


def compare_summaries(
    first: tuple[float, float, int],
    second: tuple[float, float, int],
    direction: str = "higher",
    confidence: float = 0.95,
    metric: str = "",
    names: tuple[str, str] = ("first", "second"),
) -> Comparison:
    """
    Welch's interval of `first - second` from each arm's `(mean, sample standard deviation, number of seeds)`: how a
    table that kept no per-seed scores is judged. Where the arms shared seeds, the paired interval of
    [`compare_arms`] on the per-seed scores is the sharper one; this one ignores what the seed does to both arms.

    Raises:
        `ValueError`: an arm with fewer than 2 seeds or an unknown direction.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {list(DIRECTIONS)}, not {direction!r}.")
    (first_mean, first_sd, first_n), (second_mean, second_sd, second_n) = first, second
    if min(first_n, second_n) < 2:
        raise ValueError(
            f"{metric or 'A comparison'} needs at least 2 seeds per arm to estimate a spread; got {first_n} and "
            f"{second_n}."
        )
    variance_first, variance_second = first_sd**2 / first_n, second_sd**2 / second_n
    return _comparison(
        first_mean - second_mean, math.sqrt(variance_first + variance_second),
        _welch_degrees_of_freedom(variance_first, variance_second, first_n, second_n), confidence, direction, metric,
        names, test="Welch", num_seeds=min(first_n, second_n),
    )  # fmt: skip


def _comparison(
    difference: float,
    standard_error: float,
    degrees_of_freedom: float,
    confidence: float,
    direction: str,
    metric: str,
    names: tuple[str, str],
    test: str,
    num_seeds: int,
) -> Comparison:
    """The interval and p-value of a difference from its standard error on Student's t, and its verdict."""
    if standard_error == 0:
        # every seed gave the same difference: no spread to be uncertain about
        low = high = difference
        p_value = 0.0 if difference != 0 else 1.0
    else:
        half_width = stats.t.ppf(0.5 + confidence / 2, degrees_of_freedom) * standard_error
        low, high = difference - half_width, difference + half_width
        p_value = float(2 * stats.t.sf(abs(difference) / standard_error, degrees_of_freedom))
    return Comparison(
        metric=metric,
        first=names[0],
        second=names[1],
        difference=difference,
        low=float(low),
        high=float(high),
        p_value=p_value,
        confidence=confidence,
        test=test,
        num_seeds=num_seeds,
        verdict=_verdict(low, high, DIRECTIONS[direction], num_seeds),
    )


def compare_family(headlines: Sequence[Mapping], confidence: float = 0.95) -> list[Comparison]:
    """
    Judges a page's family of headlines together: each one's [`compare_arms`] keyword arguments, at the Bonferroni
    confidence `1 - (1 - confidence) / len(headlines)`.
    """
    family_confidence = 1 - (1 - confidence) / max(len(headlines), 1)
    return [compare_arms(**headline, confidence=family_confidence) for headline in headlines]


@dataclass(frozen=True)
class Headline:
    """
    One claim of a paper that a reproduction tests: `first` against `second` on the score `key`, in the paper's
    `direction` (`"higher"`: first above second). `metric` is the score's name on the page (default `key`).
    """

    key: str
    first: str
    second: str
    direction: str = "higher"
    metric: str = ""


def judge_headlines(
    runs: Mapping[str, Mapping[int, Mapping[str, float]]], headlines: Sequence[Headline], confidence: float = 0.95
) -> list[Comparison]:
    """
    Judges a page's headlines as one family ([`compare_family`]) from its runs, `{arm: {seed: scores}}`. Two arms
    that hold the same seeds are paired by seed (every reproduction starts each seed's arms from the same warm start
    with the same data order), others get Welch's interval. A headline whose arm is missing, lacks the score or has
    fewer than 2 seeds cannot be judged and is left out of the family (a reproduction run with one seed judges
    nothing).
    """
    judged = []
    for headline in headlines:
        arms = [runs.get(headline.first, {}), runs.get(headline.second, {})]
        per_seed = [
            {seed: scores[headline.key] for seed, scores in arm.items() if scores.get(headline.key) is not None}
            for arm in arms
        ]
        if min(len(values) for values in per_seed) < 2:
            continue
        judged.append(
            {
                "first": per_seed[0],
                "second": per_seed[1],
                "direction": headline.direction,
                "paired": set(per_seed[0]) == set(per_seed[1]),
                "metric": headline.metric or headline.key,
                "names": (headline.first, headline.second),
            }
        )
    return compare_family(judged, confidence)


def verdict_lines(comparisons: Sequence[Comparison]) -> str:
    """The verdicts of a page's family as Markdown: a line saying how they were judged, then one item each."""
    if not comparisons:
        return "Verdicts: none (every headline needs at least 2 seeds of each arm)."
    header = (
        f"Verdicts by the rule of `benchmarks/verdicts.py`: {len(comparisons)} headline(s) judged as one family, each "
        f"interval at {comparisons[0].confidence:.2%} (Bonferroni); p-values unadjusted."
    )
    return "\n".join([header, "", *(f"- {comparison.sentence()}" for comparison in comparisons)])


def summary_cell(comparisons: Sequence[Comparison]) -> str:
    """The verdicts of a page's family in one Markdown table cell, as the README's Methods table shows them."""
    return "; ".join(
        f"{comparison.first} − {comparison.second}, {comparison.metric}: {comparison.verdict} "
        f"({comparison.difference:+.3f} [{comparison.low:+.3f}, {comparison.high:+.3f}])"
        for comparison in comparisons
    )


def _verdict(low: float, high: float, sign: int, num_seeds: int) -> str:
    if low > 0 or high < 0:
        above = low > 0
        return "reproduced" if above == (sign > 0) else "opposite"
    return f"not separated at {num_seeds} seeds"


def _values(arm: Mapping[int, float] | Sequence[float]) -> list[float]:
    return [float(value) for value in (arm.values() if isinstance(arm, Mapping) else arm)]


def _paired_values(
    first: Mapping[int, float] | Sequence[float], second: Mapping[int, float] | Sequence[float]
) -> tuple[list[float], list[float]]:
    if isinstance(first, Mapping) and isinstance(second, Mapping):
        if set(first) != set(second):
            raise ValueError(
                f"Paired arms must hold the same seeds; got {sorted(first)} and {sorted(second)}. Run the missing "
                "seeds, or compare with paired=False (Welch) if the arms do not share seeds and data order."
            )
        seeds = sorted(first)
        return [float(first[seed]) for seed in seeds], [float(second[seed]) for seed in seeds]
    first_values, second_values = _values(first), _values(second)
    if len(first_values) != len(second_values):
        raise ValueError(
            f"Paired arms must hold the same seeds; got {len(first_values)} and {len(second_values)} values. "
            "Compare with paired=False (Welch) if the arms do not share seeds and data order."
        )
    return first_values, second_values


def _welch_degrees_of_freedom(variance_first: float, variance_second: float, n_first: int, n_second: int) -> float:
    """Welch–Satterthwaite, from each mean's variance (the sample variance over its count)."""
    total = variance_first + variance_second
    if total == 0:
        return float(n_first + n_second - 2)
    return total**2 / (variance_first**2 / (n_first - 1) + variance_second**2 / (n_second - 1))
