"""benchmarks/bench_captioner_families.py: on the tiny captioners of every family, each gets a row of the table with
its parameters, positive step times, their ratios and the LoRA adapters' share of the parameters; the published
architectures written out in the script have their published sizes."""

import functools
from pathlib import Path

import pytest
import torch

from rlcaption.data import load_shapes
from tiny_vlms import TINY_VLM_FAMILIES, make_tiny_vlm

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def table_rows(table: str) -> list[dict[str, str]]:
    """The rows of a Markdown table, by column name."""
    lines = table.splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return [dict(zip(header, row, strict=True)) for row in cells]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return load_shapes(
        num_train=8, num_validation=8, num_test=8, image_size=48, seed=3, cache_dir=tmp_path_factory.mktemp("shapes")
    )


def test_the_table_has_every_family_with_positive_times(shapes, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_captioner_families as bench

    families = {
        family: bench.Family(family, None, functools.partial(make_tiny_vlm, family)) for family in TINY_VLM_FAMILIES
    }
    args = bench.parse_args(
        ["--device", "cpu", "--batch_size", "2", "--samples", "2", "--steps", "1", "--max_new_tokens", "4"]
    )
    costs = bench.measure_families(families, shapes["train"], args)
    rows = table_rows(bench.format_table(families, costs))

    assert [row["family"] for row in rows] == list(TINY_VLM_FAMILIES)
    for row in rows:
        model, _ = make_tiny_vlm(row["family"])
        xe, scst, lora = (costs[row["family"]][step] for step in bench.STEPS)
        assert row["parameters (vs published)"] == f"{sum(p.numel() for p in model.parameters()):,}"
        assert all(cost.milliseconds > 0 for cost in (xe, scst, lora))
        assert float(row["scst / xe"]) == pytest.approx(scst.milliseconds / xe.milliseconds, abs=0.005)
        assert float(row["scst + LoRA / xe"]) == pytest.approx(lora.milliseconds / xe.milliseconds, abs=0.005)
        # whole models train in xe and scst; under LoRA only the adapters, a small share of the model
        assert xe.trained_parameters == scst.trained_parameters == xe.parameters
        assert 0 < lora.trained_parameters < xe.parameters
        assert row["LoRA trained parameters"] == f"{lora.trained_parameters:,}"
        peaks = row["peak GiB: xe / scst / scst + LoRA"].split(" / ")
        assert len(peaks) == 3 and all(peak == "n/a" or float(peak) >= 0 for peak in peaks)


def test_the_published_architectures_have_their_published_sizes(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_captioner_families as bench

    # on the meta device: the parameters' shapes without drawing 0.5 B random weights
    with torch.device("meta"):
        for family in bench.published_families(["a red square above a blue circle"]).values():
            model, _ = family.build()
            parameters = sum(parameter.numel() for parameter in model.parameters())
            assert parameters == pytest.approx(family.published_parameters, rel=0.01), family.name


def test_an_image_size_the_vision_tower_cannot_read_is_refused(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_captioner_families as bench

    with pytest.raises(ValueError, match="multiple of 32 pixels"):
        bench.florence2_base(["a red square"], image_size=100)
    with pytest.raises(ValueError, match="multiple of 64 pixels"):
        bench.smolvlm_256m(["a red square"], image_size=96)


def test_a_row_that_ran_out_of_memory_says_so(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_captioner_families as bench

    families = {"florence2": bench.Family("Florence-2-base", 0.23e9, build=None)}
    measured = bench.StepCost(milliseconds=100.0, peak_bytes=2**30, parameters=231_000_000, trained_parameters=1000)
    out_of_memory = bench.StepCost(None, None, parameters=231_000_000, trained_parameters=231_000_000)
    costs = {"florence2": {"xe": measured, "scst": out_of_memory, "scst + LoRA": measured}}
    (row,) = table_rows(bench.format_table(families, costs))

    assert row["parameters (vs published)"] == "0.231 B (+0.4% of 0.23 B)"
    assert (row["xe ms"], row["scst ms"], row["scst / xe"]) == ("100", "out of memory", "n/a")
    assert row["scst + LoRA / xe"] == "1.00"
    assert row["peak GiB: xe / scst / scst + LoRA"] == "1.00 / n/a / 1.00"
