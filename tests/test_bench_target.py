"""`make bench` runs what it can: a benchmark whose COCO captions are not in DATA_DIR is skipped, naming the file."""

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_bench_skips_the_benchmarks_whose_captions_are_missing_and_runs_the_others(tmp_path):
    # an installed environment whose python only says what it was asked to run
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text('#!/bin/sh\necho "ran $*"\n')
    (venv / "bin" / "python").chmod(0o755)
    setup_digest = hashlib.md5((REPOSITORY / "setup.py").read_bytes()).hexdigest()[:8]
    (venv / f".installed-{setup_digest}").touch()
    data_dir = tmp_path / "data"
    (data_dir / "coco-val2014-captions").mkdir(parents=True)
    (data_dir / "coco-val2014-captions" / "karpathy_test_captions.json").write_text("[]")

    result = subprocess.run(
        ["make", "-s", "bench", f"VENV={venv}", f"DATA_DIR={data_dir}"],
        cwd=REPOSITORY, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout.splitlines() == [
        f"ran benchmarks/bench_metrics.py --data-dir {data_dir}",
        "make bench: skipped benchmarks/tokenizer_agreement.py: "
        f"{data_dir}/coco-val2014-captions/val2014_imgid_to_captions.json not found; "
        "run make bench DATA_DIR=<folder holding coco-val2014-captions/>",
        "ran benchmarks/bench_shapes.py",
        "ran benchmarks/bench_rollouts.py",
    ]
