"""A paper-scale dry run: every recipe, from image features to each RL method, on a Karpathy-format dataset of 224-px
JPEG files with image encoders of the papers' sizes (random weights), timed stage by stage.

    python benchmarks/paper_scale.py --output-dir runs/paper-scale [--num-images 2000] [--steps 5] [--batch-size 16]
        [--encoders resnet152 vit_b16 regions] [--device cpu|cuda] [--tiny]

MS-COCO cannot be downloaded everywhere; this run stands in for it with inputs that cost what COCO's do per image:

1. `dataset`: `--num-images` shapes scenes drawn at 224 px, written as JPEG files with a `dataset_coco.json`-style
   Karpathy split (5% validation, 5% test images, 5 captions each), loaded by `load_karpathy` and saved with
   `save_to_disk`, as the README's "From shapes to COCO" does with COCO.
2. Image encoders of the papers' sizes with random weights, saved with their image processors so that they load
   without a download: a ResNet-152 (He et al. 2016; its 7x7x2048 grid at 224 px), a ViT-B/16 (Dosovitskiy et al.
   2021; its [CLS] and 14x14 patch tokens of 768), and 36 regions of 2048 per image (the bottom-up features of
   Anderson et al. 2018) written as a bottom-up attention TSV file.
3. For each of `--encoders`: its features (`rlcaption extract-features --pooling none`; the regions joined to the
   split by `add_region_features`), `train_xe.py` on them, then every RL recipe from that warm start, and
   `train_embedding.py` before `train_actor_critic.py`; with `vit_b16` also `train_xe.py --vision_model` on the
   images themselves. Each trains `--steps` optimizer steps of `--batch-size` images (a method with a pretraining
   phase gets 1 step of it more) and then scores the test split, as every recipe ends.

Each stage runs in a process of its own, forked from this one once torch and transformers are imported, so that a
stage pays neither their import nor the memory of the stages before it; its output is in `<output-dir>/logs/`. The
table gives per stage the images it trained on (or extracted features of), its seconds (loading, training and the
final test scoring; imports excluded) and images per second over them, the Trainer's own `train_samples_per_second`
(the training loop alone), the peak resident memory of the stage's process (or of one of its data-loading workers,
if larger) and, on a GPU, `torch.cuda.max_memory_allocated`. `train_embedding.py` trains on the CPU whatever
`--device` says. The encoders are untrained and the regions are noise: the run measures cost, not captions.

Disk: about 4 MB per image with all three encoders (grids are stored twice, as shards and as the dataset).
`--tiny` swaps the encoders and the captioners for tiny ones of the same layouts (48-px images), as the test suite
runs it.
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import random
import re
import resource
import runpy
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# imported once here, before any stage is forked, so that no stage imports them again (6 s a stage on 2 cores)
import torch  # noqa: F401
from transformers import (
    ConvNextImageProcessor,
    ResNetConfig,
    ResNetModel,
    ViTConfig,
    ViTImageProcessor,
    ViTModel,
)

import rlcaption.recipes  # noqa: F401
import rlcaption.trainer  # noqa: F401
from rlcaption import cli
from rlcaption.data import add_region_features, load_karpathy, open_region_features
from rlcaption.shapes.dataset import describe_scene, generate_split_scenes, render_scene

REPOSITORY = Path(__file__).resolve().parent.parent
EXAMPLES = REPOSITORY / "examples"
ENCODERS = ("resnet152", "vit_b16", "regions")
# forked, not spawned: a stage starts with everything imported; this process itself never runs a torch operation
# or touches CUDA, which a forked process could not use again
_FORK = multiprocessing.get_context("fork")
_TRAINER_SPEED = re.compile(r"'train_samples_per_second': '?([0-9.eE+-]+)")


@dataclass(frozen=True)
class Sizes:
    """The sizes of one form of the run: the papers' or the test suite's tiny one."""

    image_size: int
    resnet: ResNetConfig
    resnet_input: int
    vit: ViTConfig
    num_regions: int
    region_size: int
    captioner_hidden_size: int
    max_caption_length: int
    # options of the recipes' other networks (listener, value network, embedding) at this size
    auxiliary_options: dict[str, list[str]]


def paper_sizes() -> Sizes:
    return Sizes(
        image_size=224,
        # ResNet-152: bottleneck blocks 3, 8, 36, 3 (He et al. 2016, Table 1)
        resnet=ResNetConfig(depths=[3, 8, 36, 3], hidden_sizes=[256, 512, 1024, 2048], layer_type="bottleneck"),
        resnet_input=224,
        vit=ViTConfig(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12, num_attention_heads=12),
        num_regions=36,
        region_size=2048,
        captioner_hidden_size=512,  # the LSTM of Rennie et al. 2017 and most RL captioning papers
        max_caption_length=16,
        auxiliary_options={"value": ["--value_hidden_size", "512"]},
    )


def tiny_sizes() -> Sizes:
    return Sizes(
        image_size=48,
        resnet=ResNetConfig(embedding_size=8, depths=[1, 1], hidden_sizes=[16, 32], layer_type="basic"),
        resnet_input=32,
        vit=ViTConfig(
            image_size=32,
            patch_size=16,
            hidden_size=24,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=48,
        ),
        num_regions=4,
        region_size=32,
        captioner_hidden_size=16,
        max_caption_length=8,
        auxiliary_options={
            "value": ["--value_hidden_size", "8"],
            "listener": ["--listener_hidden_size", "8", "--joint_embedding_size", "8"],
            "embedding": ["--word_embedding_size", "8", "--hidden_size", "8", "--joint_embedding_size", "8"],
        },
    )


@dataclass
class StageResult:
    stage: str
    inputs: str
    images: int
    seconds: float
    peak_rss_bytes: int
    cuda_peak_bytes: int | None
    trainer_images_per_second: float | None

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds


# ----------------------------------------------------------------------------------------------------------------
# Stages in processes of their own
# ----------------------------------------------------------------------------------------------------------------


def _stage_process(work: Callable[[], None], log_path: Path, result_path: Path) -> None:
    """The body of a stage's process: `work()` with its output in `log_path`, then its time and peak memory in
    `result_path`."""
    with open(log_path, "w", encoding="utf-8") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    start = time.perf_counter()
    work()
    seconds = time.perf_counter() - start
    sys.stdout.flush()
    # ru_maxrss is in KiB on Linux; the workers of the data loader are the stage's children
    peak_rss = 1024 * max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    )
    cuda_peak = torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else None
    result_path.write_text(json.dumps({"seconds": seconds, "peak_rss_bytes": peak_rss, "cuda_peak_bytes": cuda_peak}))


def run_stage(output_dir: Path, stage: str, inputs: str, images: int, work: Callable[[], None]) -> StageResult:
    """Run `work` in a forked process and measure it; a failure raises with the end of the stage's log."""
    name = f"{stage}-{inputs}".replace(" ", "-")
    log_path, result_path = output_dir / "logs" / f"{name}.log", output_dir / "logs" / f"{name}.json"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    process = _FORK.Process(target=_stage_process, args=(work, log_path, result_path))
    process.start()
    process.join()
    log = log_path.read_text(encoding="utf-8", errors="replace") if log_path.is_file() else ""
    if process.exitcode != 0:
        raise RuntimeError(
            f"Stage {stage} on {inputs} failed (exit code {process.exitcode}); the end of {log_path}:\n{log[-4000:]}"
        )
    measured = json.loads(result_path.read_text())
    trainer_speeds = _TRAINER_SPEED.findall(log)
    result = StageResult(
        stage, inputs, images, measured["seconds"], measured["peak_rss_bytes"], measured["cuda_peak_bytes"],
        float(trainer_speeds[-1]) if trainer_speeds else None,
    )  # fmt: skip
    print(f"{stage} on {inputs}: {result.seconds:.1f} s, {result.images_per_second:.2f} images/s", file=sys.stderr)
    return result


def run_example(script: str, argv: Sequence[str]) -> Callable[[], None]:
    """`examples/<script>` as a user runs it, with `argv` on its command line."""

    def work() -> None:
        sys.argv = [str(EXAMPLES / script), *argv]
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")

    return work


def run_command(argv: Sequence[str]) -> Callable[[], None]:
    """The `rlcaption` command with `argv`."""

    def work() -> None:
        status = cli.main(list(argv))
        if status != 0:
            raise RuntimeError(f"rlcaption {' '.join(argv)} exited with {status}.")

    return work


# ----------------------------------------------------------------------------------------------------------------
# Inputs: the dataset, the encoders, the regions
# ----------------------------------------------------------------------------------------------------------------


def held_out_images(num_images: int) -> int:
    """Images of the validation split, and as many of the test split: 5%, as Karpathy's 5,000 of COCO's 123k are 4%."""
    return max(2, num_images // 20)


def write_karpathy_dataset(folder: Path, num_images: int, image_size: int, seed: int = 0) -> None:
    """`folder/images/*.jpg` and their captions in `folder/dataset_shapes.json` (a Karpathy split file), then the
    dataset `load_karpathy` makes of them in `folder/dataset` (`save_to_disk`)."""
    rng = random.Random(f"paper-scale/{seed}")
    scenes = generate_split_scenes(num_images, rng, seen_keys=set())
    num_held_out = held_out_images(num_images)
    (folder / "images").mkdir(parents=True)
    entries = []
    for index, scene in enumerate(scenes):
        split = "test" if index < num_held_out else "val" if index < 2 * num_held_out else "train"
        filename = f"shapes_{index:06d}.jpg"
        render_scene(scene, image_size).save(folder / "images" / filename, quality=90)
        sentences = [{"raw": caption, "tokens": caption.split()} for caption in describe_scene(scene, rng)]
        entries.append(
            {"filepath": "images", "filename": filename, "split": split, "cocoid": index, "sentences": sentences}
        )
    karpathy_json = folder / "dataset_shapes.json"
    karpathy_json.write_text(json.dumps({"dataset": "shapes", "images": entries}), encoding="utf-8")
    load_karpathy(karpathy_json, images_root=folder).save_to_disk(str(folder / "dataset"))


def save_encoders(folder: Path, sizes: Sizes, image_ids: Sequence[int]) -> None:
    """The ResNet and the ViT with random weights and their image processors, and random regions of every image in
    a bottom-up attention TSV file (`image_id, image_w, image_h, num_boxes, boxes, features`, arrays in base64)."""
    torch.manual_seed(0)
    ResNetModel(sizes.resnet).save_pretrained(folder / "resnet152")
    # as microsoft/resnet-152's: the shorter side to 224 / 0.875, then the central 224 x 224
    ConvNextImageProcessor(size={"shortest_edge": sizes.resnet_input}, crop_pct=0.875).save_pretrained(
        folder / "resnet152"
    )
    ViTModel(sizes.vit).save_pretrained(folder / "vit_b16")
    ViTImageProcessor(size={"height": sizes.vit.image_size, "width": sizes.vit.image_size}).save_pretrained(
        folder / "vit_b16"
    )
    generator = np.random.default_rng(0)
    (folder / "regions").mkdir(parents=True)
    with open(folder / "regions" / "regions_36.tsv", "w", encoding="ascii") as tsv:
        for image_id in image_ids:
            # non-negative, as the ReLU outputs the detector pools are
            features = np.abs(generator.normal(size=(sizes.num_regions, sizes.region_size))).astype(np.float32)
            corners = generator.uniform(0, sizes.image_size / 2, size=(sizes.num_regions, 2))
            extents = generator.uniform(4, sizes.image_size / 2, size=(sizes.num_regions, 2))
            boxes = np.concatenate([corners, corners + extents], axis=1).astype(np.float32)  # x1, y1, x2, y2
            fields = [image_id, sizes.image_size, sizes.image_size, sizes.num_regions]
            fields += [base64.b64encode(array.tobytes()).decode("ascii") for array in (boxes, features)]
            tsv.write("\t".join(str(field) for field in fields) + "\n")


def join_regions(karpathy_folder: Path, regions_tsv: Path, output_dir: Path) -> Callable[[], None]:
    """The regions joined to the Karpathy split by image id, the images kept for the CLIPs of WTF-RL."""

    def work() -> None:
        dataset = load_karpathy(karpathy_folder / "dataset_shapes.json", images_root=karpathy_folder)
        regions = open_region_features(regions_tsv)
        joined = add_region_features(dataset, regions, keep_images=True, cache_dir=output_dir / "cache")
        joined.save_to_disk(str(output_dir / "dataset"))

    return work


# ----------------------------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------------------------


def rl_recipes(sizes: Sizes, wtf_clips: list[str]) -> list[tuple[str, str, list[str], int]]:
    """`(stage, script, options, extra steps)` of every RL recipe after the XE warm start; `extra steps` are those of
    a pretraining phase, which `--max_steps` counts."""
    options = sizes.auxiliary_options
    return [
        ("scst", "train_scst.py", ["--reward_funcs", "cider"], 0),
        # CIDEr-D instead of the paper's SPIDEr: SPICE needs the Stanford CoreNLP jars, which a dry run need not
        # fetch; no METEOR in the test scores, whose Java start (10 s on 2 cores) would hide the method's cost
        ("spider_pg", "train_spider.py", ["--reward_funcs", "cider", "--eval_metrics", "cider", "bleu", "rouge_l"], 0),
        ("sle", "train_sle.py", [], 0),
        ("wtf", "train_wtf.py", ["--discriminator_pretraining_steps", "1", *wtf_clips], 1),
        ("psst", "train_psst.py", options.get("listener", []), 0),
    ]


def run(args: argparse.Namespace) -> list[StageResult]:
    sizes = tiny_sizes() if args.tiny else paper_sizes()
    output_dir = Path(args.output_dir)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise ValueError(f"--output-dir {output_dir} is not empty: name a new folder, or delete this one.")
    karpathy, encoders = output_dir / "karpathy", output_dir / "encoders"
    results = [
        run_stage(
            output_dir, "dataset", "JPEG files", args.num_images,
            lambda: write_karpathy_dataset(karpathy, args.num_images, sizes.image_size),
        )
    ]  # fmt: skip
    image_ids = [entry["cocoid"] for entry in json.loads((karpathy / "dataset_shapes.json").read_text())["images"]]
    run_stage(
        output_dir, "encoders", "random weights", len(image_ids), lambda: save_encoders(encoders, sizes, image_ids)
    )

    batch, steps = str(args.batch_size), args.steps
    common = [
        "--per_device_train_batch_size", batch, "--per_device_eval_batch_size", batch, "--save_strategy", "no",
        "--eval_strategy", "no", "--max_caption_length", str(sizes.max_caption_length), "--report_to", "none",
        "--disable_tqdm", "true", *(["--use_cpu"] if args.device == "cpu" else []),
    ]  # fmt: skip
    xe_options = ["--hidden_size", str(sizes.captioner_hidden_size), "--learning_rate", "5e-4", *common]
    wtf_clips = [
        "--reward_clip", str(REPOSITORY / "checkpoints" / "shapes-clip-reward"),
        "--eval_clip", str(REPOSITORY / "checkpoints" / "shapes-clip-evaluator"),
    ]  # fmt: skip

    def train(stage: str, inputs: str, script: str, options: list[str], extra_steps: int = 0) -> StageResult:
        total_steps = steps + extra_steps
        work = run_example(script, [*options, "--max_steps", str(total_steps)])
        return run_stage(output_dir, stage, inputs, total_steps * args.batch_size, work)

    runs = output_dir / "runs"
    for encoder in args.encoders:
        features = output_dir / "features" / encoder
        if encoder == "regions":
            work = join_regions(karpathy, encoders / "regions" / "regions_36.tsv", features)
            results.append(run_stage(output_dir, "features", encoder, args.num_images, work))
        else:
            extract = [
                "extract-features", "--dataset", str(karpathy / "dataset"), "--model", str(encoders / encoder),
                "--output-dir", str(features), "--pooling", "none", "--batch-size", batch, "--device", args.device,
            ]  # fmt: skip
            results.append(run_stage(output_dir, "features", encoder, args.num_images, run_command(extract)))
        warm_start = runs / f"xe-{encoder}"
        on_features = ["--image_features", str(features)]
        results.append(
            train("xe", encoder, "train_xe.py", ["--output_dir", str(warm_start), *on_features, *xe_options])
        )
        from_warm_start = ["--model_name_or_path", str(warm_start), *on_features, *common]
        for stage, script, options, extra_steps in rl_recipes(sizes, wtf_clips):
            output = ["--output_dir", str(runs / f"{stage}-{encoder}")]
            results.append(train(stage, encoder, script, [*output, *from_warm_start, *options], extra_steps))
        # Ren et al. 2017: the visual-semantic embedding first, on the warm start's features, then its reward alone
        embedding = runs / f"embedding-{encoder}"
        embedding_options = [
            "--captioner_name_or_path", str(warm_start), *on_features, "--output_dir", str(embedding),
            "--num_steps", str(steps), "--batch_size", batch, "--eval_batch_size", batch, "--logging_steps", "1",
            *sizes.auxiliary_options.get("embedding", []),
        ]  # fmt: skip
        work = run_example("train_embedding.py", embedding_options)
        results.append(run_stage(output_dir, "embedding", encoder, steps * args.batch_size, work))
        actor_critic = [
            "--output_dir", str(runs / f"actor_critic-{encoder}"), *from_warm_start, "--embedding_model",
            str(embedding), "--reward_funcs", "cider", "--reward_weights", "0", "--value_pretraining_steps", "1",
            *sizes.auxiliary_options["value"],
        ]  # fmt: skip
        results.append(train("actor_critic", encoder, "train_actor_critic.py", actor_critic, extra_steps=1))
    if "vit_b16" in args.encoders:
        # the ViT reads the images at every step: the cost of not extracting features first
        on_pixels = ["--dataset", str(karpathy / "dataset"), "--vision_model", str(encoders / "vit_b16")]
        options = ["--output_dir", str(runs / "xe-vit_b16-pixels"), *on_pixels, *xe_options]
        results.append(train("xe", "vit_b16 on images", "train_xe.py", options))
    return results


def format_table(results: Sequence[StageResult]) -> str:
    """The results as a Markdown table."""

    def mebibytes(value: int | None) -> str:
        return "–" if value is None else f"{value / 2**20:,.0f}"

    lines = [
        "| stage | input | images | seconds | images/s | training loop images/s | peak RSS MiB | peak GPU MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        trainer = "–" if result.trainer_images_per_second is None else f"{result.trainer_images_per_second:.3g}"
        lines.append(
            f"| {result.stage} | {result.inputs} | {result.images} | {result.seconds:.1f} | "
            f"{result.images_per_second:.3g} | {trainer} | {mebibytes(result.peak_rss_bytes)} | "
            f"{mebibytes(result.cuda_peak_bytes)} |"
        )
    return "\n".join(lines)


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True, help="A new folder for the dataset, features, runs and logs.")
    parser.add_argument("--num-images", type=int, default=2000, help="Images of the Karpathy-format dataset.")
    parser.add_argument("--steps", type=int, default=5, help="Optimizer steps of every training stage.")
    parser.add_argument("--batch-size", type=int, default=16, help="Images per step and per forward pass.")
    parser.add_argument(
        "--encoders", nargs="+", choices=ENCODERS, default=list(ENCODERS), help="Image inputs to run every recipe on."
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="Where the stages run.")
    parser.add_argument(
        "--tiny", action="store_true", help="Tiny encoders and captioners of the same layouts, at 48 px (tests)."
    )
    args = parser.parse_args(argv)
    num_train = args.num_images - 2 * held_out_images(args.num_images)
    if args.steps < 1 or args.batch_size < 2 or num_train < args.batch_size:
        raise SystemExit(
            f"--steps must be >= 1 and --batch-size >= 2 (the embedding's negatives), with at least --batch-size "
            f"training images; got --steps {args.steps}, --batch-size {args.batch_size} and {num_train} training "
            f"images of --num-images {args.num_images} (10% are held out)."
        )
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_arguments(argv)
    # every model is a local folder: no stage should wait on the Hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = run(args)
    device = "1 GPU" if args.device == "cuda" else f"CPU, {os.cpu_count()} cores"
    print(
        f"Paper-scale dry run on {device}: {args.num_images} images, {args.steps} steps of {args.batch_size} images "
        f"per training stage{' (tiny sizes)' if args.tiny else ''}"
    )
    print(format_table(results))


if __name__ == "__main__":
    main()
