"""benchmarks/verdicts.py: the one rule by which reproductions judge a headline, against scipy's t-tests."""

import math
from pathlib import Path

import pytest
from scipy import stats

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def verdicts(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import verdicts

    return verdicts


def test_a_paired_interval_by_hand(verdicts):
    # per-seed differences 1, 2, 3: mean 2, standard deviation 1, t(0.975, 2 df) = 4.3027
    comparison = verdicts.compare_arms({0: 3.0, 1: 5.0, 2: 7.0}, {0: 2.0, 1: 3.0, 2: 4.0})
    half_width = 4.302652729911275 / math.sqrt(3)
    assert comparison.difference == pytest.approx(2.0)
    assert (comparison.low, comparison.high) == pytest.approx((2 - half_width, 2 + half_width))
    assert comparison.verdict == "not separated at 3 seeds"
    assert comparison.test == "paired"


def test_paired_and_welch_agree_with_scipy(verdicts):
    first = [2.489, 2.501, 2.478, 2.512, 2.495]
    second = [2.426, 2.445, 2.410, 2.452, 2.433]
    paired = verdicts.compare_arms(first, second)
    reference = stats.ttest_rel(first, second)
    assert paired.p_value == pytest.approx(reference.pvalue)
    assert (paired.low, paired.high) == pytest.approx(tuple(reference.confidence_interval(0.95)))

    welch = verdicts.compare_arms(first, second, paired=False)
    reference = stats.ttest_ind(first, second, equal_var=False)
    assert welch.p_value == pytest.approx(reference.pvalue)
    assert (welch.low, welch.high) == pytest.approx(tuple(reference.confidence_interval(0.95)))
    assert welch.test == "Welch"


def test_pairing_matches_seeds_not_positions(verdicts):
    by_seed = verdicts.compare_arms({0: 1.0, 1: 2.0, 2: 4.0}, {2: 3.5, 0: 0.5, 1: 1.6})
    in_order = verdicts.compare_arms([1.0, 2.0, 4.0], [0.5, 1.6, 3.5])
    assert (by_seed.low, by_seed.high, by_seed.p_value) == pytest.approx(
        (in_order.low, in_order.high, in_order.p_value)
    )


def test_the_words_come_from_the_interval_and_the_papers_direction(verdicts):
    higher = [1.0, 1.1, 1.2, 1.05, 1.15]
    lower = [0.5, 0.6, 0.55, 0.52, 0.58]
    assert verdicts.compare_arms(higher, lower, direction="higher").verdict == "reproduced"
    assert verdicts.compare_arms(higher, lower, direction="lower").verdict == "opposite"
    assert verdicts.compare_arms(lower, higher, direction="lower").verdict == "reproduced"
    noisy = verdicts.compare_arms([1.0, 0.0, 1.0], [0.5, 0.6, 0.4], direction="higher")
    assert noisy.verdict == "not separated at 3 seeds"
    assert noisy.low < 0 < noisy.high


def test_a_family_widens_every_interval_by_bonferroni(verdicts):
    headline = {"first": [1.0, 1.3, 1.1, 1.25], "second": [0.9, 1.0, 1.05, 1.0]}
    (alone,) = verdicts.compare_family([headline])
    in_family = verdicts.compare_family([headline] * 4)
    assert alone.confidence == pytest.approx(0.95)
    assert in_family[0].confidence == pytest.approx(1 - 0.05 / 4)
    assert in_family[0].high - in_family[0].low > alone.high - alone.low
    assert in_family[0].p_value == pytest.approx(alone.p_value)  # the unadjusted p-value is reported


def test_a_constant_difference_has_no_spread(verdicts):
    comparison = verdicts.compare_arms([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])
    assert (comparison.low, comparison.high, comparison.verdict) == (1.0, 1.0, "reproduced")
    assert verdicts.compare_arms([1.0, 2.0], [1.0, 2.0]).verdict == "not separated at 2 seeds"


def test_bad_input_is_refused_with_the_fix(verdicts):
    with pytest.raises(ValueError, match="same seeds.*paired=False"):
        verdicts.compare_arms({0: 1.0, 1: 2.0}, {0: 1.0, 2: 2.0})
    with pytest.raises(ValueError, match="same seeds"):
        verdicts.compare_arms([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="at least 2 seeds"):
        verdicts.compare_arms([1.0], [2.0], paired=False)
    with pytest.raises(ValueError, match="direction"):
        verdicts.compare_arms([1.0, 2.0], [1.0, 2.0], direction="up")


def test_the_sentence_names_the_numbers_and_the_verdict(verdicts):
    comparison = verdicts.compare_arms([2.5, 2.49, 2.51], [2.43, 2.42, 2.44], metric="CIDEr-D", names=("SCST", "PG"))
    sentence = comparison.sentence()
    assert sentence.startswith("CIDEr-D: SCST − PG = +0.070 [")
    assert sentence.endswith(": reproduced")
    assert "95.0% paired interval" in sentence


def test_a_published_mean_and_deviation_is_judged_by_welch_as_scipy_does(verdicts):
    comparison = verdicts.compare_summaries((2.441, 0.028, 3), (2.150, 0.033, 3), metric="CIDEr-D")
    reference = stats.ttest_ind_from_stats(2.441, 0.028, 3, 2.150, 0.033, 3, equal_var=False)
    assert comparison.p_value == pytest.approx(reference.pvalue)
    # the same interval as from per-seed values with those means and deviations
    first = [2.441 - 0.028, 2.441, 2.441 + 0.028]
    second = [2.150 - 0.033, 2.150, 2.150 + 0.033]
    from_values = verdicts.compare_arms(first, second, paired=False)
    assert (comparison.low, comparison.high) == pytest.approx((from_values.low, from_values.high))
    assert comparison.test == "Welch" and comparison.verdict == "reproduced"
    with pytest.raises(ValueError, match="at least 2 seeds"):
        verdicts.compare_summaries((1.0, 0.1, 1), (0.5, 0.1, 3))


def test_headlines_are_judged_as_one_family_paired_where_the_seeds_are_shared(verdicts):
    runs = {
        "SLE": {0: {"Div-2": 0.26, "CIDEr": 2.39}, 1: {"Div-2": 0.27, "CIDEr": 2.40}, 2: {"Div-2": 0.25}},
        "SLL": {0: {"Div-2": 0.22, "CIDEr": 2.41}, 1: {"Div-2": 0.23, "CIDEr": 2.42}, 2: {"Div-2": 0.21}},
        "SLL, more seeds": {seed: {"Div-2": 0.20 + seed / 100} for seed in range(5)},
        "one seed": {0: {"Div-2": 0.5}},
    }
    headlines = [
        verdicts.Headline("Div-2", "SLE", "SLL", metric="Div-2 of the samples"),
        verdicts.Headline("CIDEr", "SLE", "SLL", direction="lower"),
        verdicts.Headline("Div-2", "SLE", "SLL, more seeds"),
        verdicts.Headline("Div-2", "one seed", "SLL"),  # cannot be judged: left out of the family
        verdicts.Headline("Div-2", "SLE", "an arm that did not run"),
    ]
    div2, cider, unpaired = verdicts.judge_headlines(runs, headlines)
    family = 1 - 0.05 / 3
    expected = verdicts.compare_arms([0.26, 0.27, 0.25], [0.22, 0.23, 0.21], confidence=family)
    assert (div2.low, div2.high, div2.test) == pytest.approx((expected.low, expected.high, "paired"))
    assert div2.metric == "Div-2 of the samples" and div2.confidence == pytest.approx(family)
    # the seeds where both arms have the score are paired: seeds 0 and 1, every difference −0.02
    assert (cider.difference, cider.num_seeds, cider.verdict) == pytest.approx((-0.02, 2, "reproduced"))
    assert unpaired.test == "Welch" and unpaired.num_seeds == 3
