import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def test_scst_runs_in_two_cpu_processes_with_synchronised_weights(tmp_path):
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [
        str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29517",
        str(HERE / "two_process_training.py"), str(tmp_path / "out"), str(tmp_path / "cache"),
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    reports = [json.loads((tmp_path / "out" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["world_size"] == 2
        assert report["backend"] == "gloo"
        assert report["changed"]
        # every validation image is captioned once, whichever process captioned it
        assert report["eval_num_images"] == 6
    # DDP keeps the replicas identical after the updates
    assert reports[0]["parameter_sum"] == pytest.approx(reports[1]["parameter_sum"], rel=0, abs=1e-9)
