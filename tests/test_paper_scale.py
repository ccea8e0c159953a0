"""benchmarks/paper_scale.py in its tiny form: every stage, from the Karpathy-format JPEG files and the features to
each RL recipe, runs as a user launches it and reports its speed and memory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
TRAINING_STAGES = ["xe", "scst", "spider_pg", "sle", "wtf", "psst", "embedding", "actor_critic"]


def table_rows(output: str) -> list[dict[str, str]]:
    """The rows of the Markdown table the benchmark prints, by column name."""
    lines = [line for line in output.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return [dict(zip(header, row, strict=True)) for row in cells]


# regions in the main suite; the ViT's grid and images (the same stages, twice the time) with the slow tests
@pytest.mark.slow  # eight training stages
@pytest.mark.parametrize("encoder", ["regions", "vit_b16"])
def test_the_tiny_dry_run_reports_every_stage(encoder, tmp_path):
    env = {
        **os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join([str(REPOSITORY / "src"), os.environ.get("PYTHONPATH", "")]),
    }  # fmt: skip
    result = subprocess.run(
        [
            sys.executable, str(REPOSITORY / "benchmarks" / "paper_scale.py"), "--tiny", "--num-images", "12",
            "--steps", "1", "--batch-size", "4", "--encoders", encoder,
            "--output-dir", str(tmp_path / "run"),
        ],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    expected = [("dataset", "JPEG files")]
    expected += [("features", encoder), *((stage, encoder) for stage in TRAINING_STAGES)]
    if encoder == "vit_b16":
        expected.append(("xe", "vit_b16 on images"))
    assert [(row["stage"], row["input"]) for row in rows] == expected
    for row in rows:
        assert float(row["images/s"]) > 0 and float(row["peak RSS MiB"].replace(",", "")) > 0, row
    # the Trainer's own speed, for every stage it trains; the GPU column stays empty on the CPU
    trained_by_the_trainer = [row for row in rows if row["stage"] in TRAINING_STAGES and row["stage"] != "embedding"]
    assert all(float(row["training loop images/s"]) > 0 for row in trained_by_the_trainer)
    assert {row["peak GPU MiB"] for row in rows} == {"–"}
    # a training stage trains on steps x batch images, 1 step more for a method's pretraining phase
    images = {(row["stage"], row["input"]): int(row["images"]) for row in rows}
    assert images["scst", encoder] == 4 and images["wtf", encoder] == 8 and images["features", encoder] == 12
