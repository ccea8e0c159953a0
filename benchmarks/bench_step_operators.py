"""How many operators one optimizer step runs, and where: a count, not a timing, that tells on a CPU what a GPU's host
pays for. On a GPU a small captioner's RL step is bound by the host, which launches a kernel for nearly every operator
(views excepted); its decodings are replayed as CUDA graphs, one launch each, so what counts is the rest.

    python benchmarks/bench_step_operators.py [--model checkpoints/show-tell-rl-shapes-xe] [--images 32 128]

Each objective (`xe`, `scst` with 5 samples per image and the greedy baseline, `spider_pg` with M = 1 and K = 3, all
with CIDEr-D) trains its own copy of the model through `RLCaptionTrainer` on the same batch, as `gpu_check.py` sets
them up. After two warm-up steps, one full optimizer step runs under a `TorchDispatchMode` that counts every operator
dispatched (after autograd: the forward's and the backward pass's) by where it was called from, and those of them
that launch a kernel (views do not: on a GPU they cost the host a little, and the device nothing):

- decodings: sampling, greedy decoding and rollouts, which a GPU replays as CUDA graphs (unless the model's
  `generation_config.cuda_graphs` is False);
- scoring pass: the samples' teacher-forced pass (`sample_token_log_probs`); XE's teacher-forced pass and
  `spider_pg`'s forward pass of the policy are counted here too;
- backward pass: the loss's backward pass (for RL objectives nearly all of it the scoring pass's);
- other: everything else (rewards' tensors, losses, clipping, the optimizer step).

The kernels outside the decodings are what the host launches one by one on a GPU with the default settings (CPU
kernels stand in for the GPU's: a CPU runs an LSTM cell as several, a GPU as one fused kernel and its products); their
ratio to XE's is what the step budget's SCST / XE ratio approaches on a host-bound GPU.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import traceback
from pathlib import Path

import datasets
import torch
import transformers
from gpu_check import WARM_START, make_trainer, markdown_table, optimizer_step  # run as a script
from torch.utils._python_dispatch import TorchDispatchMode

from rlcaption import CaptionProcessor, ShowTellRL
from rlcaption.data import load_shapes

# the functions of the call stack that put an operator in a part, the first part that matches winning
PARTS = {
    "decodings": {"decode_steps", "sample_rollouts"},
    "backward pass": {"backward"},
    # `sample_token_log_probs`, XE's `caption_logits` and `spider_pg`'s forward pass of the policy
    "scoring pass": {"_scored_samples", "caption_logits", "ShowTellRL.forward"},
}


class OperatorCount(TorchDispatchMode):
    """Counts the operators dispatched inside it by [`PARTS`] of the call stack."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        stack = traceback.extract_stack()
        functions = {frame.name for frame in stack}
        if any(frame.name == "forward" and frame.filename.endswith("modeling_show_tell_rl.py") for frame in stack):
            functions.add("ShowTellRL.forward")
        part = next((part for part, names in PARTS.items() if functions & names), "other")
        self.counts[part, "operators"] += 1
        self.counts[part, "kernels"] += not _launches_no_kernel(func)
        return func(*args, **(kwargs or {}))


def _launches_no_kernel(func) -> bool:
    """Views (and the unsafe views and splits that autograd uses) only make a tensor header on the host."""
    return func.is_view or func.overloadpacket.__name__.startswith(("_unsafe_view", "unsafe_"))


def count_step(trainer) -> collections.Counter[str]:
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    for _ in range(2):
        optimizer_step(trainer, batch)
    counter = OperatorCount()
    with counter:
        optimizer_step(trainer, batch)
    return counter.counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=WARM_START, help="A ShowTellRL checkpoint folder.")
    parser.add_argument("--images", type=int, nargs="+", default=[32, 128], help="Batch sizes.")
    parser.add_argument("--objectives", nargs="+", default=["xe", "scst", "spider_pg"])
    args = parser.parse_args(argv)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    scratch = Path(tempfile.mkdtemp(prefix="bench_step_operators_"))
    shapes = load_shapes(num_train=max(args.images), num_validation=8, num_test=8, cache_dir=scratch / "datasets")
    rows = []
    for images in args.images:
        outside_xe = None
        for objective in args.objectives:
            model, processor = ShowTellRL.from_pretrained(args.model), CaptionProcessor.from_pretrained(args.model)
            trainer = make_trainer(
                objective, model, processor, shapes["train"], images, torch.device("cpu"), False, scratch
            )  # fmt: skip
            counts = count_step(trainer)
            parts = ("decodings", "scoring pass", "backward pass", "other")
            kernels = {part: counts[part, "kernels"] for part in parts}
            outside = sum(kernels.values()) - kernels["decodings"]
            operators = sum(counts[part, "operators"] for part in kernels) - counts["decodings", "operators"]
            outside_xe = outside if objective == "xe" else outside_xe
            ratio = f"{outside / outside_xe:.2f}x" if outside_xe else ""
            rows.append([objective, str(images), *map(str, kernels.values()), str(outside), ratio, str(operators)])
    headers = ["objective", "images", "kernels: in decodings", "scoring pass", "backward pass", "other"]
    print(markdown_table([*headers, "outside decodings", "/ XE's", "operators outside decodings (views too)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
