"""Cost per step of the prompted captioners at their published sizes: milliseconds of one `xe` step, one `scst` step
(greedy baseline, 5 samples per image, CIDEr-D) and one `scst` step with LoRA adapters, through `RLCaptionTrainer`,
for Florence-2-base (0.23 B parameters) and SmolVLM-256M, with random weights.

    OMP_NUM_THREADS=2 python benchmarks/bench_captioner_families.py   # CPU: 2 images x 5 samples, 256-pixel images
    python benchmarks/bench_captioner_families.py --device cuda       # GPU: bf16, 32 x 5, published image sizes
        [--families florence2 smolvlm] [--batch_size 32] [--samples 5] [--steps 5] [--max_new_tokens 20]
        [--image_size 256] [--bf16 | --no-bf16] [--gradient_checkpointing]

Nothing is downloaded. Each model is built from its published architecture, written out below
(microsoft/Florence-2-base: a DaViT vision tower with BART-base-sized encoder and decoder, 768-pixel images, 577 image
tokens; HuggingFaceTB/SmolVLM-256M-Instruct: a SigLIP-base-patch16 vision tower at 512 pixels whose 1,024 patches a
pixel shuffle (scale factor 4) turns into 64 image tokens, and a SmolLM2-135M-sized text model with an untied output
layer), with its own processor class and a byte-level BPE tokenizer trained here on the shapes captions and the
prompts. The models' vocabularies have the published sizes, so embeddings and output layers are real-size; only the
tokenization differs (captions are tokenized into fewer, shorter pieces). SmolVLM reads each image as one view (no
image splitting), and every family gets the library's default caption prompt. On the CPU the processors resize images
to `--image_size` 256 pixels by default (65 image tokens for Florence-2, 16 for SmolVLM): the weights are the same at
any size, but a 768-pixel image costs Florence-2-base 20 s and 3.4 GB of forward and backward pass on two cores, once
per caption. On a GPU images have the published sizes unless `--image_size` says otherwise.

A step is a full optimizer step as the Trainer's inner loop runs it (`training_step`, gradient clipping, AdamW,
scheduler) on one collated batch of shapes images: `xe` teacher-forces the 5 references of each image; `scst` samples
`--samples` captions per image and decodes a greedy one as their baseline. Random weights sample captions that mostly
run to `--max_new_tokens`, the most expensive case. The `scst + LoRA` step trains rank-16 adapters (`use_peft` with
the config's defaults: every linear layer but the output layer). Each row builds its model afresh; its time is the
mean of `--steps` steps after one warm-up step. Peak memory is that of building the model and running the row's steps:
on the CPU the growth of the process's maximum resident set size (`resource.getrusage`, its high-water mark reset
before the row through `/proc/self/clear_refs`; "n/a" where that file is missing), on a GPU
`torch.cuda.max_memory_allocated`. The GPU target, SCST <= 2.5x XE in bf16 at 32 images x 5 samples, is printed
under the table, not enforced. A row whose batch does not fit the GPU reads "out of memory"; at the published image
sizes the language model reads every caption's image tokens (5 references or samples per image), so 32 images x 5
captions may need `--gradient_checkpointing` or a smaller `--batch_size`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

import datasets
import torch
import transformers
from gpu_check import markdown_table, optimizer_step, synchronize
from transformers import (
    CLIPImageProcessorPil,
    Florence2Config,
    Florence2ForConditionalGeneration,
    Florence2Processor,
    GPT2Tokenizer,
    ProcessorMixin,
    RobertaTokenizer,
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessorPil,
    SmolVLMProcessor,
)
from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE as SMOLVLM_CHAT_TEMPLATE

from rlcaption.data import load_shapes

# the tokenizers and processors are built as the test suite's tiny models' are
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_vlms import byte_level_bpe, no_video_processor  # noqa: E402

STEPS = ("xe", "scst", "scst + LoRA")
# A forward and backward pass of Florence-2-base over one 768-pixel image takes 20 s and 3.4 GB on two CPU cores, and a
# step passes 5 captions of each image (references or samples): the CPU reads smaller images by default.
CPU_IMAGE_SIZE = 256
SCST_TARGET = 2.5  # on a GPU, an SCST step in bf16 at 32 images x 5 samples should cost at most 2.5 XE steps


@dataclasses.dataclass(frozen=True)
class Family:
    """A captioner family as measured here: its published name and size, and how to build it with random weights."""

    name: str
    published_parameters: float | None
    build: Callable[[], tuple[torch.nn.Module, ProcessorMixin]]


@dataclasses.dataclass(frozen=True)
class StepCost:
    """One row's measurement: `milliseconds` per step (`None` where the GPU ran out of memory), the `peak_bytes` of
    building and training the model (`None` then, or where the platform cannot reset the high-water mark), and the
    model's parameters, all and trained."""

    milliseconds: float | None
    peak_bytes: int | None
    parameters: int
    trained_parameters: int


def florence2_base(
    captions: Sequence[str], image_size: int = 768
) -> tuple[Florence2ForConditionalGeneration, Florence2Processor]:
    """Florence-2-base with random weights, as microsoft/Florence-2-base's config.json has it, and its processor
    resizing images to `image_size` pixels (768 published; the weights do not depend on it)."""
    if image_size % 32 or not 32 <= image_size <= 50 * 32:
        raise ValueError(
            f"Florence-2 reads images of a multiple of 32 pixels (its DaViT strides) up to 1600 (50 learned positions "
            f"a side), got --image_size {image_size}; use e.g. 768 (published) or 256."
        )
    tokenizer = RobertaTokenizer(
        *byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>", "<image>"], 1000, captions),
        extra_special_tokens={"image_token": "<image>"},
    )
    # The four DaViT stages (strides 4, 2, 2, 2) leave a grid of side image_size / 32 (24 x 24 at 768 pixels): its
    # spatial tokens and the temporal one.
    image_processor = CLIPImageProcessorPil(
        size={"height": image_size, "width": image_size},
        do_center_crop=False,
        image_seq_length=(image_size // 32) ** 2 + 1,
    )
    processor = Florence2Processor(image_processor=image_processor, tokenizer=tokenizer)
    special_ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    # BART-base's sizes, with Florence-2's vocabulary (BART's and its 1,000 location tokens and task tokens)
    text_config = dict(
        model_type="bart", vocab_size=51289, d_model=768, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
        max_position_embeddings=1024, decoder_start_token_id=tokenizer.eos_token_id, forced_eos_token_id=None,
        **special_ids,
    )  # fmt: skip
    vision_config = dict(
        depths=[1, 1, 9, 1], patch_size=[7, 3, 3, 3], patch_stride=[4, 2, 2, 2], patch_padding=[3, 1, 1, 1],
        patch_prenorm=[False, True, True, True], embed_dim=[128, 256, 512, 1024], num_heads=[4, 8, 16, 32],
        num_groups=[4, 8, 16, 32], window_size=12, drop_path_rate=0.1, projection_dim=768, max_position_embeddings=50,
    )  # fmt: skip
    config = Florence2Config(
        text_config=text_config, vision_config=vision_config, image_token_id=tokenizer.image_token_id
    )
    torch.manual_seed(0)
    model = Florence2ForConditionalGeneration(config)
    model.generation_config.update(decoder_start_token_id=tokenizer.eos_token_id, **special_ids)
    return model, processor


def smolvlm_256m(
    captions: Sequence[str], image_size: int = 512
) -> tuple[SmolVLMForConditionalGeneration, SmolVLMProcessor]:
    """SmolVLM-256M with random weights, as HuggingFaceTB/SmolVLM-256M-Instruct's config.json has it, and its
    processor reading each image as one view of `image_size` pixels (512 published; the weights do not depend on
    it)."""
    if image_size % 64 or not 64 <= image_size <= 512:
        raise ValueError(
            f"SmolVLM-256M reads views of a multiple of 64 pixels (16-pixel patches shuffled 4 x 4) up to 512, got "
            f"--image_size {image_size}; use e.g. 512 (published) or 256."
        )
    special_tokens = [
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<image>", "<end_of_utterance>",
        "<global-img>",
    ]  # fmt: skip
    tokenizer = GPT2Tokenizer(
        *byte_level_bpe(special_tokens, 1000, captions),
        unk_token="<|endoftext|>",
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        extra_special_tokens=special_tokens[3:],
    )
    image_processor = SmolVLMImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": image_size}, max_image_size={"longest_edge": image_size}
    )
    with no_video_processor():
        processor = SmolVLMProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=None,
            image_seq_len=(image_size // 16) ** 2 // 4**2,  # 16-pixel patches, shuffled 4 x 4 into one token each
            chat_template=SMOLVLM_CHAT_TEMPLATE,
        )
    # `apply_chat_template` reads the video processor's frame sampling (SmolVLM's defaults) even without a video.
    processor.video_processor = SimpleNamespace(num_frames=64, fps=1)
    special_ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    vision_config = dict(
        hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=512,
        patch_size=16,
    )  # fmt: skip
    # SmolLM2-135M's sizes, with SmolVLM's vocabulary and an output layer of its own
    text_config = dict(
        model_type="llama", vocab_size=49280, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, tie_word_embeddings=False, **special_ids,
    )  # fmt: skip
    config = SmolVLMConfig(
        vision_config=vision_config,
        text_config=text_config,
        scale_factor=4,
        image_token_id=processor.image_token_id,
        tie_word_embeddings=False,
        **special_ids,
    )
    torch.manual_seed(0)
    model = SmolVLMForConditionalGeneration(config)
    model.generation_config.update(**special_ids)
    return model, processor


def published_families(captions: Sequence[str], image_size: int | None = None) -> dict[str, Family]:
    """The published captioners, reading images of `image_size` pixels (`None`: each one's published size)."""
    size = {} if image_size is None else {"image_size": image_size}
    return {
        "florence2": Family("Florence-2-base", 0.23e9, lambda: florence2_base(captions, **size)),
        "smolvlm": Family("SmolVLM-256M", 0.256e9, lambda: smolvlm_256m(captions, **size)),
    }


class PeakMemory:
    """The peak memory of what runs between `start()` and `peak_bytes()`, on `device`."""

    def __init__(self, device: torch.device):
        self.device = device
        self.baseline: int | None = 0

    def start(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            return
        # glibc keeps freed memory of earlier rows mapped: hand it back, so that this row's allocations show in the
        # resident set, then start the high-water mark (`ru_maxrss`) from the resident set as it is now.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")
        except OSError:
            self.baseline = None
            return
        self.baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

    def peak_bytes(self) -> int | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) - self.baseline
        if self.baseline is None:
            return None
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.baseline


def make_trainer(model, processor, dataset, step: str, args, output_dir: str) -> RLCaptionTrainer:
    config = RLCaptionConfig(
        output_dir=output_dir, use_cpu=args.device.type == "cpu", bf16=args.bf16,
        objective="xe" if step == "xe" else "scst", per_device_train_batch_size=args.batch_size, learning_rate=1e-5,
        max_caption_length=args.max_new_tokens, reward_funcs=["cider"], num_samples_per_image=args.samples,
        use_peft=step == "scst + LoRA", save_strategy="no", eval_strategy="no", report_to=[], disable_tqdm=True,
        seed=0, dataloader_num_workers=0, **({} if step == "xe" else {"baseline": "greedy"}),
        # named only when set: transformers warns of the field's new name whenever it is given
        **({"gradient_checkpointing": True} if args.gradient_checkpointing else {}),
    )  # fmt: skip
    trainer = RLCaptionTrainer(model=model, args=config, processing_class=processor, train_dataset=dataset)
    trainer.create_optimizer_and_scheduler(num_training_steps=1000)
    trainer.current_gradient_accumulation_steps = 1  # set by the Trainer's training loop, which is not run here
    return trainer


def measure_step(family: Family, step: str, dataset: datasets.Dataset, args, output_dir: str) -> StepCost:
    """Builds `family`'s model afresh and times `step` (one of `STEPS`): the mean of `args.steps` optimizer steps on
    one batch after a warm-up step."""
    memory = PeakMemory(args.device)
    memory.start()
    model, processor = family.build()
    parameters = sum(parameter.numel() for parameter in model.parameters())
    trainer = make_trainer(model, processor, dataset, step, args, output_dir)
    trained_parameters = sum(parameter.numel() for parameter in trainer.model.parameters() if parameter.requires_grad)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    seconds = []
    try:
        for repeat in range(1 + args.steps):
            torch.manual_seed(repeat)
            synchronize(args.device)
            start = time.perf_counter()
            optimizer_step(trainer, batch)
            synchronize(args.device)
            seconds.append(time.perf_counter() - start)
    except torch.OutOfMemoryError:
        # the batch does not fit this GPU: the table says so, and the other rows still run
        return StepCost(None, None, parameters, trained_parameters)
    peak_bytes = memory.peak_bytes()
    return StepCost(1000 * statistics.mean(seconds[1:]), peak_bytes, parameters, trained_parameters)


def measure_families(families: dict[str, Family], dataset: datasets.Dataset, args) -> dict[str, dict[str, StepCost]]:
    """`{family: {step: StepCost}}` for every family and each of `STEPS`, one row (model) at a time."""
    costs = {}
    with tempfile.TemporaryDirectory() as output_dir:
        for key, family in families.items():
            costs[key] = {}
            for step in STEPS:
                costs[key][step] = measure_step(family, step, dataset, args, output_dir)
                print(f"{family.name}, {step}: {_milliseconds(costs[key][step])} ms", file=sys.stderr, flush=True)
    return costs


def _milliseconds(cost: StepCost) -> str:
    return "out of memory" if cost.milliseconds is None else f"{cost.milliseconds:.0f}"


def _ratio(cost: StepCost, xe: StepCost) -> str:
    if cost.milliseconds is None or xe.milliseconds is None:
        return "n/a"
    return f"{cost.milliseconds / xe.milliseconds:.2f}"


def _gibibytes(peak_bytes: int | None) -> str:
    return "n/a" if peak_bytes is None else f"{peak_bytes / 2**30:.2f}"


def _parameters(count: int, published: float | None) -> str:
    if published is None:
        return f"{count:,}"
    return f"{count / 1e9:.3f} B ({count / published - 1:+.1%} of {published / 1e9:.2f} B)"


def format_table(families: dict[str, Family], costs: dict[str, dict[str, StepCost]]) -> str:
    """One Markdown row per family: parameters, ms per step and its ratio to XE, and peak memory, step by step."""
    headers = [
        "family", "parameters (vs published)", "xe ms", "scst ms", "scst / xe", "scst + LoRA ms", "scst + LoRA / xe",
        "LoRA trained parameters", "peak GiB: xe / scst / scst + LoRA",
    ]  # fmt: skip
    rows = []
    for key, family in families.items():
        xe, scst, lora = (costs[key][step] for step in STEPS)
        rows.append([
            family.name, _parameters(xe.parameters, family.published_parameters), _milliseconds(xe),
            _milliseconds(scst), _ratio(scst, xe), _milliseconds(lora), _ratio(lora, xe),
            f"{lora.trained_parameters:,}",
            " / ".join(_gibibytes(cost.peak_bytes) for cost in (xe, scst, lora)),
        ])  # fmt: skip
    return markdown_table(headers, rows)


def environment(args) -> str:
    """The versions and hardware a table was measured with, as a line to print under it."""
    if args.device.type == "cuda":
        hardware = torch.cuda.get_device_name(args.device)
    else:
        hardware = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    return (
        f"torch {torch.__version__}, transformers {transformers.__version__}, {hardware}; "
        f"{'bf16' if args.bf16 else 'fp32'}, {args.batch_size} images x {args.samples} samples, images of "
        f"{args.image_size or 'the published size of'} pixels, max_new_tokens {args.max_new_tokens}, "
        f"mean of {args.steps} step{'s' if args.steps > 1 else ''} after a warm-up"
        + (", gradient checkpointing" if args.gradient_checkpointing else "")
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["florence2", "smolvlm"], choices=["florence2", "smolvlm"])
    parser.add_argument("--device", default=None, help="`cpu` or `cuda` (default: `cuda` where available).")
    parser.add_argument("--batch_size", type=int, default=None, help="Images per step (default: 2 on CPU, 32 on GPU).")
    parser.add_argument("--samples", type=int, default=5, help="Sampled captions per image of `scst`.")
    parser.add_argument("--steps", type=int, default=None, help="Timed steps per row (default: 2 on CPU, 5 on GPU).")
    parser.add_argument(
        "--max_new_tokens",
        type=int,
        default=None,
        help="Longest caption, sampled or taught (default: 12 on CPU, 20 on GPU).",
    )
    parser.add_argument(
        "--image_size",
        type=int,
        default=None,
        help="Side of the images the processors resize to (default: 256 on CPU; on GPU the published 768 and 512).",
    )
    parser.add_argument(
        "--gradient_checkpointing",
        action="store_true",
        help="Recompute activations in the backward pass, for batches that do not fit otherwise.",
    )
    parser.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=None, help="Autocast to bf16 (default: on a GPU)."
    )
    args = parser.parse_args(argv)
    for name in ("batch_size", "samples", "steps", "max_new_tokens", "image_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}.")
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = args.device.type == "cuda"
    defaults = {
        "batch_size": 32 if on_gpu else 2,
        "steps": 5 if on_gpu else 2,
        "max_new_tokens": 20 if on_gpu else 12,
        "image_size": None if on_gpu else CPU_IMAGE_SIZE,
        "bf16": on_gpu,
    }
    for name, default in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory() as cache_dir:
        shapes = load_shapes(
            num_train=max(args.batch_size, 8), num_validation=8, num_test=8, image_size=64, seed=11,
            cache_dir=cache_dir,
        )  # fmt: skip
        captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
        available = published_families(captions, args.image_size)
        families = {key: available[key] for key in args.families}
        costs = measure_families(families, shapes["train"], args)
    print()
    print(format_table(families, costs))
    print(environment(args))
    if args.device.type == "cuda" and args.bf16:
        verdicts = []
        for key, family in families.items():
            ratio = _ratio(costs[key]["scst"], costs[key]["xe"])
            verdict = "not measured" if ratio == "n/a" else "met" if float(ratio) <= SCST_TARGET else "missed"
            verdicts.append(f"{family.name} {verdict}")
        print(f"target scst <= {SCST_TARGET}x xe: " + ", ".join(verdicts))


if __name__ == "__main__":
    main()
