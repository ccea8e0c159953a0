"""Launches the two-process scripts of this folder with `accelerate launch`, as users launch the recipes."""

import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def launch_on_two_processes(
    script: str, *arguments: str, config_file: str | None = None
) -> subprocess.CompletedProcess:
    """Runs `script` of this folder on two CPU processes (gloo): DDP, or what the accelerate `config_file` sets up."""
    accelerate = Path(sys.executable).with_name("accelerate")
    with socket.socket() as probe:  # a fresh port: a killed run's port may still be held
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        str(accelerate), "launch", *(["--config_file", config_file] if config_file else ["--multi_gpu"]),
        "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
        str(HERE / script), *arguments,
    ]  # fmt: skip
    env = {
        **os.environ,
        # the caller's path after the tests' folders: a checkout other than the installed one stays the one tested
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
