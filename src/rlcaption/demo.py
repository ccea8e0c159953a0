"""
The `make demo` / `rlcaption demo` job: on the embedded shapes dataset, train a ShowTellRL captioner with teacher
forcing (XE), continue with self-critical sequence training (SCST, CIDEr-D reward), and compare both on the test
split, greedy and beam search, then show captions of a few test images. Runs on a 2-core CPU in minutes.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

import torch

from .data import load_shapes
from .evaluation import caption_dataset
from .metrics import evaluate_captions
from .models import ShowTellRL, ShowTellRLConfig
from .processing import CaptionProcessor
from .trainer import RLCaptionConfig, RLCaptionTrainer

__all__ = ["DemoSettings", "run_demo"]


@dataclass
class DemoSettings:
    """Sizes and schedules of the demo; `quick()` is a smoke-test version of the same recipe."""

    num_train: int = 4000
    num_validation: int = 200
    num_test: int = 500
    image_size: int = 48
    cnn_channels: tuple[int, ...] = (16, 32, 32, 32)
    hidden_size: int = 128
    xe_epochs: float = 30
    xe_learning_rate: float = 2e-3
    scst_epochs: float = 3
    scst_learning_rate: float = 5e-4
    batch_size: int = 32
    num_samples_per_image: int = 5
    seed: int = 0

    @classmethod
    def quick(cls) -> DemoSettings:
        return cls(num_train=120, num_validation=20, num_test=20, hidden_size=32, xe_epochs=1, scst_epochs=1)


def _train(model, processor, shapes, output_dir: str, settings: DemoSettings, **objective_settings) -> None:
    args = RLCaptionConfig(
        output_dir=output_dir,
        use_cpu=True,
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=64,
        save_strategy="no",
        eval_strategy="no",
        logging_steps=25,
        disable_tqdm=True,
        seed=settings.seed,
        dataloader_num_workers=0,
        **objective_settings,
    )
    trainer = RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=shapes["train"])
    trainer.train()
    trainer.save_model(output_dir)
    processor.save_pretrained(output_dir)


def _score(model, processor, test_split, num_beams: int) -> tuple[dict[str, float], dict]:
    predictions, references = caption_dataset(
        model, processor, test_split, batch_size=100, do_sample=False, num_beams=num_beams, max_length=21
    )
    return evaluate_captions(predictions, references, metrics=["cider", "bleu"]), predictions


def run_demo(
    output_dir: str = "runs/demo", quick: bool = False, settings: DemoSettings | None = None
) -> dict[str, dict[str, float]]:
    """
    Trains XE then SCST on shapes, prints the comparison table and example captions, and returns the scores as
    `{"XE greedy": {"CIDEr": ..., "Bleu_4": ...}, ...}`. `settings` overrides the defaults (or `quick`).
    """
    if settings is None:
        settings = DemoSettings.quick() if quick else DemoSettings()
    torch.manual_seed(settings.seed)
    # Models this small gain nothing from intra-op threads, and lose ~10x when another process holds a core
    # (100 XE steps: 10 s with one thread, 119 s with two while a second process ran).
    torch.set_num_threads(1)
    start = time.perf_counter()

    # 1. data and vocabulary
    shapes = load_shapes(
        settings.num_train, settings.num_validation, settings.num_test, settings.image_size, seed=settings.seed
    )
    train_captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
    processor = CaptionProcessor.from_captions(train_captions, min_count=1, image_size=settings.image_size)
    print(f"[demo] shapes: {dict(shapes.num_rows)} images, vocabulary {len(processor.tokenizer)} words")

    # 2. teacher forcing
    tokenizer = processor.tokenizer
    config = ShowTellRLConfig(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        word_embedding_size=settings.hidden_size,
        encoder_type="cnn",
        image_size=settings.image_size,
        cnn_channels=list(settings.cnn_channels),
        dropout=0.2,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = ShowTellRL(config)
    xe_dir, scst_dir = os.path.join(output_dir, "xe"), os.path.join(output_dir, "scst")
    _train(
        model, processor, shapes, xe_dir, settings,
        objective="xe", num_train_epochs=settings.xe_epochs, learning_rate=settings.xe_learning_rate,
    )  # fmt: skip
    print(f"[demo] XE done at {time.perf_counter() - start:.0f} s")

    # 3. self-critical training from the XE weights
    xe_model = ShowTellRL.from_pretrained(xe_dir)
    model = ShowTellRL.from_pretrained(xe_dir)
    _train(
        model, processor, shapes, scst_dir, settings,
        objective="scst", reward_funcs=["cider"], num_samples_per_image=settings.num_samples_per_image,
        num_train_epochs=settings.scst_epochs, learning_rate=settings.scst_learning_rate,
    )  # fmt: skip
    print(f"[demo] SCST done at {time.perf_counter() - start:.0f} s")

    # 4. compare on test
    results, captions = {}, {}
    for name, trained in (("XE", xe_model), ("SCST", model)):
        for decoding, num_beams in (("greedy", 1), ("beam 3", 3)):
            results[f"{name} {decoding}"], captions[f"{name} {decoding}"] = _score(
                trained, processor, shapes["test"], num_beams
            )
    print(f"\nShapes test split ({shapes['test'].num_rows} images), CIDEr-D document frequencies from the test refs")
    print(f"| {'model':<14} | {'CIDEr-D':>8} | {'BLEU-4':>7} |")
    print(f"|{'-' * 16}|{'-' * 10}|{'-' * 9}|")
    for name, scores in results.items():
        print(f"| {name:<14} | {scores['CIDEr']:8.3f} | {scores['Bleu_4']:7.3f} |")

    print("\nExample test captions (beam 3):")
    for row in shapes["test"].select(range(4)):
        key = row["image_id"]
        print(f"  image {key}: references: {row['captions'][:2]} ...")
        print(f"      XE:   {captions['XE beam 3'][key]}")
        print(f"      SCST: {captions['SCST beam 3'][key]}")
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"\n[demo] total {time.perf_counter() - start:.0f} s, peak memory {peak_gib:.2f} GiB; models in {output_dir}"
    )
    return results
