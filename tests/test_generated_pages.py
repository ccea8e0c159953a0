"""Each reproduction writes its page's tables and verdicts from its results: the pages hold exactly what the committed
results render, and the rendering is checked on hand-made results."""

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import psst_reproduction  # noqa: E402
import reproduction  # noqa: E402
import verdicts  # noqa: E402

GENERATED = sorted(path.stem for path in (BENCHMARKS / "results").glob("*.json"))


@pytest.mark.parametrize("script", GENERATED)
def test_every_page_block_and_readme_verdict_is_what_its_committed_results_render(script):
    benchmark = importlib.import_module(script)
    generated = benchmark.PAGE
    results = json.loads(generated.results.read_text())
    again = (
        f"run `python benchmarks/{script}.py --from-results {generated.results.relative_to(BENCHMARKS.parent)} --page`"
    )
    page = reproduction.read_page_block(generated.page, generated.script)
    assert page == benchmark.page_block(results).strip(), f"{generated.page} is not what its results render: {again}"
    cell = verdicts.summary_cell(benchmark.comparisons_of(results))
    assert reproduction.read_readme_verdict(generated.objective) == cell, f"the README's row is stale: {again}"


@pytest.mark.parametrize(
    "script",
    ["psst_reproduction", "compare_objectives", "sle_reproduction", "wtf_reproduction", "actor_critic_reproduction"],
)
def test_every_reproduction_names_its_page_its_results_and_its_row_of_the_readme(script):
    generated = importlib.import_module(script).PAGE
    assert generated.page.parent == BENCHMARKS.parent / "docs" / "methods" and generated.page.is_file()
    assert generated.script == f"{script}.py" and generated.results == BENCHMARKS / "results" / f"{script}.json"
    reproduction.read_readme_verdict(generated.objective)  # the README has the row


def test_a_methods_table_row_gets_its_verdicts_and_keeps_its_other_cells(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(
        "| method | paper | objective | page | in short |\n|---|---|---|---|---|\n"
        "| PSST | Vered et al. | `psst` | [psst](psst.md) | old words |\n"
        "| SCST | Rennie et al. | `scst` | [scst](scst.md) | other words |\n"
    )
    monkeypatch.setattr(reproduction, "README", readme)
    reproduction.write_readme_verdict("psst", "new verdicts")
    assert readme.read_text().split("\n")[2] == "| PSST | Vered et al. | `psst` | [psst](psst.md) | new verdicts |"
    assert reproduction.read_readme_verdict("scst") == "other words"
    with pytest.raises(ValueError, match="no row whose objective is `sle`"):
        reproduction.write_readme_verdict("sle", "x")


def test_a_page_block_is_replaced_between_its_markers_and_nothing_else(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Method\n\nprose\n\n<!-- bench.py: begin -->\nold table\n<!-- bench.py: end -->\n\nmore prose\n")
    reproduction.write_page_block(page, "bench.py", "| new | table |\n")
    assert page.read_text() == (
        "# Method\n\nprose\n\n<!-- bench.py: begin -->\n| new | table |\n<!-- bench.py: end -->\n\nmore prose\n"
    )
    assert reproduction.read_page_block(page, "bench.py") == "| new | table |"
    with pytest.raises(ValueError, match="has no block of other.py: add the lines `<!-- other.py: begin -->`"):
        reproduction.write_page_block(page, "other.py", "x")


def _scores(recall: float, cider: float) -> dict[str, float]:
    return {
        "listener_R@1": recall / 2, "listener_R@10": recall, "CIDEr": cider,
        "greedy_listener_R@10": recall, "greedy_CIDEr": cider,
    }  # fmt: skip


def test_psst_renders_the_chosen_runs_and_their_verdicts_from_its_results():
    seeds = [0, 1, 2]
    control, feedback = 1e-6, 50e-3
    # psst gains 0.10, 0.12 and 0.08 of listener R@10 from the control to λ = 0.05 on test: reproduced
    test_recall = {control: [0.80, 0.70, 0.75], feedback: [0.90, 0.82, 0.83]}
    runs = {
        psst_reproduction.run_name("psst", lam, 0.25): [
            {"validation": _scores(0.9 + 0.01 * seed, 2.5), "test": _scores(test_recall[lam][seed], 2.4)}
            for seed in seeds
        ]
        for lam in (control, feedback)
    }
    results = {
        "command": "python benchmarks/psst_reproduction.py --ways psst", "code": "git:abc", "seeds": seeds,
        "max_steps": 125, "lambdas": [control, feedback], "rho_lambda": 200e-3, "fixed_cider": 2.5,
        "warm_ups": [{"validation": _scores(0.5, 2.2), "test": _scores(0.4, 2.1)} for _ in seeds],
        "runs": runs, "chosen_lambda": {"psst": [feedback] * 3},
    }  # fmt: skip
    block = psst_reproduction.page_block(results)
    assert block.startswith("Generated from `python benchmarks/psst_reproduction.py --ways psst` at git:abc (seeds 0")
    # test R@10 0.90, 0.82, 0.83: mean 0.85, s.d. √((0.05² + 0.03² + 0.02²) / 2) = 0.044
    assert "| psst (λ × 1e3 of each seed: 50, 50, 50) | 3 | 0.425 ± 0.022 | 0.850 ± 0.044 |" in block
    assert "| XE + warmed-up listener | 3 | 0.200 ± 0.000 | 0.400 ± 0.000 |" in block
    [comparison] = psst_reproduction.comparisons_of(results)
    assert comparison.difference == pytest.approx(0.10) and comparison.test == "paired"
    assert comparison.verdict == "reproduced" and comparison.sentence() in block


def test_lookahead_is_judged_only_where_validation_chose_a_lambda_below_one():
    actor_critic = importlib.import_module("actor_critic_reproduction")
    headlines = actor_critic._headlines({"actor-critic (embedding)": 1.0, "actor-critic (CIDEr-D)": 0.8})
    lookahead = [headline for headline in headlines if headline.metric.startswith("CIDEr-D, lookahead")]
    assert [(h.first, h.second) for h in lookahead] == [("actor-critic (CIDEr-D), λ = 0.8", "actor-critic (CIDEr-D)")]
    assert len(headlines) == 3  # the two comparisons with SCST besides
