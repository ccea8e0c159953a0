"""
The `make demo` / `rlcaption demo` job: on the embedded shapes dataset, pretrain a CNN image encoder on the scene
annotations, train a ShowTellRL captioner that attends over its feature grid with teacher forcing (XE), continue with
self-critical sequence training (SCST, CIDEr-D reward), and compare both on the test split the way every method of
the library is judged: consensus metrics (CIDEr-D, BLEU-4), grounding in the scene (object F1, generic captions) and,
with an evaluator CLIP that no reward used, CLIP-S and text-to-image retrieval, and what the captions state (repeated
objects, sizes, relations). Writes the results as Markdown (`results.md`, the README's demo block) and a picture of
test images of distinct scenes with both models' captions (`captions.png`). Runs on a 2-core CPU in minutes.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

import torch

from ..data import load_shapes
from ..evaluation import caption_dataset, scene_grounding_scores
from ..metrics import clip_retrieval, clip_score, evaluate_captions, load_clip
from ..models import ShowTellRL
from ..processing import CaptionProcessor
from ..recipes import new_show_tell_rl, pretrain_on_scenes
from ..trainer import RLCaptionConfig, RLCaptionTrainer
from .dataset import most_specific_reference
from .demo_report import caption_habits, distinct_scene_indices, idle_cores, results_markdown
from .gallery import save_caption_gallery

__all__ = ["DEFAULT_EVALUATOR_CLIP", "DemoSettings", "run_demo", "score_captioner"]

# The project's evaluator CLIP (a checkpoint folder of this repository, or its Hub id): trained with another seed and
# image tower than the reward CLIP, and never used as a reward here, so it judges captions without being gamed.
DEFAULT_EVALUATOR_CLIP = "checkpoints/shapes-clip-evaluator"


@dataclass
class DemoSettings:
    """Sizes and schedules of the demo; `quick()` is a smoke-test version of the same recipe."""

    num_train: int = 4000
    num_validation: int = 200
    num_test: int = 500
    image_size: int = 48
    # four blocks: a 3x3 grid at 48 px, one feature cell per cell of the shapes layout for the attention to pick
    cnn_channels: tuple[int, ...] = (32, 64, 64, 64)
    hidden_size: int = 256
    scene_pretraining_steps: int = 400
    # the pretrained encoder stays fixed: its features already name every cell's object, and steps are ~2x faster
    freeze_image_encoder: bool = True
    xe_epochs: float = 5
    xe_learning_rate: float = 2e-3
    scst_epochs: float = 1
    scst_learning_rate: float = 5e-4
    batch_size: int = 32
    num_samples_per_image: int = 5
    seed: int = 0
    evaluator_clip: str | None = DEFAULT_EVALUATOR_CLIP
    num_gallery_images: int = 12
    # CPU threads of torch; None: the cores that are idle when the demo starts
    num_threads: int | None = None

    @classmethod
    def quick(cls) -> DemoSettings:
        return cls(
            num_train=120, num_validation=20, num_test=20, hidden_size=32, scene_pretraining_steps=20, xe_epochs=1,
            scst_epochs=1, num_gallery_images=4,
        )  # fmt: skip


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
        report_to=[],
        seed=settings.seed,
        dataloader_num_workers=0,
        **objective_settings,
    )
    trainer = RLCaptionTrainer(model=model, args=args, processing_class=processor, train_dataset=shapes["train"])
    trainer.train()
    trainer.save_model(output_dir)
    processor.save_pretrained(output_dir)


def score_captioner(
    model, processor, test_split, num_beams: int, evaluator_clip=None
) -> tuple[dict[str, float], dict]:
    """
    Captions `test_split` (greedy when `num_beams` is 1) and scores the captions as the library judges every method.

    Returns:
        `(scores, predictions)`: `CIDEr`, `Bleu_4`, the scene grounding keys when the split has a `scene` column, and,
        with `evaluator_clip` (a loaded `(model, processor)` pair), `CLIP-S` and the retrieval recalls `t2i_R@1`, ...
        of each image's caption among all the split's images; `predictions` keyed by `image_id`.
    """
    predictions, references = caption_dataset(
        model, processor, test_split, batch_size=100, do_sample=False, num_beams=num_beams, max_length=21
    )
    scores = evaluate_captions(predictions, references, metrics=["cider", "bleu"])
    scores.update(scene_grounding_scores(predictions, test_split))
    if evaluator_clip is not None:
        images = list(test_split["image"])
        captions = [predictions[image_id] for image_id in test_split["image_id"]]
        scores["CLIP-S"], _ = clip_score(images, captions, evaluator_clip)
        scores.update(clip_retrieval(images, captions, evaluator_clip))
    return scores, predictions


def _load_evaluator_clip(name_or_path: str | None):
    if name_or_path is None:
        return None
    if not os.path.isdir(name_or_path) and os.path.sep in name_or_path:
        print(
            f"[demo] no evaluator CLIP at {name_or_path!r} (run from the repository root, or pass another folder or "
            "Hub id): CLIP-S and retrieval are left out of the table."
        )
        return None
    return load_clip(name_or_path)


def run_demo(
    output_dir: str = "runs/demo", quick: bool = False, settings: DemoSettings | None = None
) -> dict[str, dict[str, float]]:
    """
    Trains XE then SCST on shapes, prints the comparison and example captions, writes `<output_dir>/results.md` (the
    same tables, what changes from XE to SCST, and how long the run took) and `<output_dir>/captions.png`, and
    returns the scores as `{"XE greedy": {"CIDEr": ..., "object_f1": ...}, ...}`. `settings` overrides the defaults
    (or `quick`).
    """
    if settings is None:
        settings = DemoSettings.quick() if quick else DemoSettings()
    torch.manual_seed(settings.seed)
    # A second thread speeds a training step up ~1.4x on an idle 2-core CPU, but slows it down ~2.3x while another
    # program computes on that core (threads wait for each other): take only the cores that are free now.
    num_threads = settings.num_threads or idle_cores()
    torch.set_num_threads(num_threads)
    print(f"[demo] {num_threads} torch thread(s) on {os.cpu_count()} core(s)")
    start = time.perf_counter()
    phase_ends = {}
    evaluator_clip = _load_evaluator_clip(settings.evaluator_clip)

    # 1. data and vocabulary
    shapes = load_shapes(
        settings.num_train, settings.num_validation, settings.num_test, settings.image_size, seed=settings.seed
    )
    train_captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
    processor = CaptionProcessor.from_captions(train_captions, min_count=1, image_size=settings.image_size)
    print(f"[demo] shapes: {dict(shapes.num_rows)} images, vocabulary {len(processor.tokenizer)} words")

    # 2. teacher forcing, after the encoder learns the scene cells
    model = new_show_tell_rl(
        processor, settings.image_size, settings.cnn_channels, settings.hidden_size, image_attention=True
    )
    pretraining = pretrain_on_scenes(
        model, processor, shapes["train"], settings.scene_pretraining_steps, settings.freeze_image_encoder,
        seed=settings.seed,
    )  # fmt: skip
    phase_ends["scene pretraining"] = time.perf_counter() - start
    print(
        f"[demo] image encoder pretrained on the scene annotations at {phase_ends['scene pretraining']:.0f} s: "
        + ", ".join(f"{name} {value:.3f}" for name, value in pretraining.items())
    )
    xe_dir, scst_dir = os.path.join(output_dir, "xe"), os.path.join(output_dir, "scst")
    _train(
        model, processor, shapes, xe_dir, settings,
        objective="xe", num_train_epochs=settings.xe_epochs, learning_rate=settings.xe_learning_rate,
    )  # fmt: skip
    phase_ends["XE"] = time.perf_counter() - start
    print(f"[demo] XE done at {phase_ends['XE']:.0f} s")

    # 3. self-critical training from the XE weights
    xe_model = ShowTellRL.from_pretrained(xe_dir)
    model = ShowTellRL.from_pretrained(xe_dir)  # the encoder stays frozen: the saved config says so
    _train(
        model, processor, shapes, scst_dir, settings,
        objective="scst", reward_funcs=["cider"], num_samples_per_image=settings.num_samples_per_image,
        num_train_epochs=settings.scst_epochs, learning_rate=settings.scst_learning_rate,
    )  # fmt: skip
    phase_ends["SCST"] = time.perf_counter() - start
    print(f"[demo] SCST done at {phase_ends['SCST']:.0f} s")

    # 4. compare on test
    test_split = shapes["test"]
    scenes = list(test_split["scene"])
    results, captions, habits = {}, {}, {}
    for name, trained in (("XE", xe_model.eval()), ("SCST", model.eval())):
        for decoding, num_beams in (("greedy", 1), ("beam 3", 3)):
            row = f"{name} {decoding}"
            results[row], captions[row] = score_captioner(trained, processor, test_split, num_beams, evaluator_clip)
            habits[row] = caption_habits([captions[row][key] for key in test_split["image_id"]], scenes)
            habits[row]["relation_accuracy"] = results[row]["relation_accuracy"]
    phase_ends["scoring"] = time.perf_counter() - start

    # 5. what a person would rather look at: test images of distinct scenes with both captions
    shown = test_split.select(distinct_scene_indices(scenes, settings.num_gallery_images))
    gallery_path = os.path.join(output_dir, "captions.png")
    save_caption_gallery(
        list(shown["image"]),
        {name: [captions[f"{name} greedy"][key] for key in shown["image_id"]] for name in ("XE", "SCST")},
        gallery_path,
        title="Shapes test images of distinct scenes: XE and SCST (CIDEr-D reward) greedy captions",
    )

    total = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak_gib = usage.ru_maxrss / 2**20
    phases, previous = [], 0.0
    for phase, end in phase_ends.items():
        phases.append(f"{phase} {end - previous:.0f} s")
        previous = end
    run_summary = (
        f"One run, seed {settings.seed}: {total:.0f} s ({', '.join(phases)}), CPU time {usage.ru_utime:.0f} s user + "
        f"{usage.ru_stime:.0f} s sys, {num_threads} torch thread(s) on {os.cpu_count()} core(s), peak memory "
        f"{peak_gib:.2f} GiB."
    )
    markdown = results_markdown(results, habits, test_split.num_rows, run_summary)
    results_path = os.path.join(output_dir, "results.md")
    with open(results_path, "w", encoding="utf-8") as file:
        file.write(markdown)
    print("\n" + markdown)
    print("Example test captions (greedy):")
    for row in shown.select(range(min(4, shown.num_rows))):
        key = row["image_id"]
        print(f"  image {key}: most specific reference: {most_specific_reference(row['captions'])!r}")
        print(f"      XE:   {captions['XE greedy'][key]}")
        print(f"      SCST: {captions['SCST greedy'][key]}")
    print(f"\n[demo] models in {output_dir}, results {results_path}, picture {gallery_path}")
    return results
