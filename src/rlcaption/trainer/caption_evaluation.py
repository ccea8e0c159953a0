"""
Evaluation and prediction of [`RLCaptionTrainer`]: beam-search captions of a split scored by the caption metrics, the
diversity metrics and an evaluator CLIP, beside the teacher-forced loss of the references.

The Trainer's own `evaluate` and `predict` run the model's forward on labels and compare logits; a captioner is judged
on the captions it decodes instead.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import gather_object
from torch import nn
from transformers import GenerationConfig
from transformers.trainer_utils import PredictionOutput

from ..data.collator import CaptionCollator
from ..evaluation import (
    caption_set_batches,
    caption_set_prefix,
    caption_set_scores,
    check_image_ids,
    clip_scores,
    diversity_scores,
    scene_grounding_scores,
    with_image_ids,
)
from ..generation.decoding import caption_logits, evaluation_mode, generate_captions, image_inputs_of
from ..metrics import check_java, check_spice, evaluate_captions, load_clip
from ..metrics.corpus import resolve_metric_names
from ..objectives.xe import label_smoothed_cross_entropy
from ..rl_config import SET_DIVERSITY_METRICS, split_eval_metrics

__all__ = ["CaptionEvaluationMixin", "CaptionedSplit"]


@dataclass
class CaptionedSplit:
    """
    The beam-search captions of a split, gathered from every process, one entry per image id.

    Args:
        captions: the best beam of each image.
        beams: the `eval_num_beams` best beams of each image, when a diversity metric compares them.
        references: the references of each image.
        loss: the teacher-forced cross-entropy of the references, averaged over their tokens; `None` when the
            collator does not tokenize references.
    """

    captions: dict[Any, str]
    beams: dict[Any, list[str]] | None
    references: dict[Any, list[str]]
    loss: float | None


class CaptionEvaluationMixin:
    """[`RLCaptionTrainer`]'s `evaluate`, `predict` and `caption_dataset`, and the checks they need before training."""

    def _prepare_evaluation(self, eval_dataset) -> None:
        """
        Fails before any training time is spent when evaluation could not run: a Java metric without Java, an
        evaluator CLIP that does not load or an evaluation split without the images it scores. Loads that CLIP once.
        """
        caption_metrics, _ = split_eval_metrics(self.args.eval_metrics)
        needed = resolve_metric_names(caption_metrics) if caption_metrics else []
        for metric, check in (("meteor", lambda: check_java(8)), ("spice", check_spice)):
            if metric in needed:
                try:
                    check()
                except RuntimeError as error:
                    raise RuntimeError(
                        f"eval_metrics={self.args.eval_metrics!r} needs {metric.upper()}, which cannot run here: "
                        f"{error} Or leave it out of eval_metrics."
                    ) from error
        self._eval_clip = None
        if self.args.eval_clip is None:
            return
        splits = eval_dataset.values() if isinstance(eval_dataset, Mapping) else [eval_dataset]
        for split in splits:
            column_names = getattr(split, "column_names", None)
            if column_names is not None and "image" not in column_names:
                raise ValueError(
                    f"eval_clip={self.args.eval_clip!r} scores captions against their images, but the evaluation "
                    f"split has no `image` column (columns {column_names}); keep the images or unset eval_clip."
                )
        clip_model, clip_processor = load_clip(self.args.eval_clip)
        self._eval_clip = (clip_model.to(self.args.device), clip_processor)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """
        Captions the evaluation split with beam search (`args.eval_num_beams`) and logs and returns, keyed
        `f"{metric_key_prefix}_{name}"`: `loss` (the teacher-forced cross-entropy of the references, as the `xe`
        objective computes it), the `args.eval_metrics` (caption and diversity metrics), the scene grounding metrics
        (`object_f1`, ...) when the split has a `scene` column, CLIP-S and retrieval recall with `args.eval_clip`,
        the scores of `args.eval_caption_sets` (several captions per image, Chen & Jin's Table 4: `sample5_CIDEr`,
        `beam5_Div-2`, ...) and `num_images`. A dict of splits is evaluated split by split, each prefixed with its
        name.
        """
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, dict):
            metrics = {}
            for name, split in dataset.items():
                metrics.update(self.evaluate(split, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        if dataset is None:
            raise ValueError("evaluate() needs an eval_dataset (given to the trainer or to this call).")
        dataset = with_image_ids(dataset)
        with self._all_references_collated():
            dataloader = self.get_eval_dataloader(dataset)
        metrics, _ = self._score_split(dataset, dataloader, metric_key_prefix)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test") -> PredictionOutput:
        """
        Captions every row of `test_dataset` as [`evaluate`] does, and scores the captions the same way, without
        logging.

        Returns:
            `PredictionOutput` with `predictions` the caption of each row (`list[str]`, in row order), `label_ids`
            the references of each row (`list[list[str]]`) and `metrics` as [`evaluate`] returns them, keyed
            `f"{metric_key_prefix}_{name}"`.
        """
        dataset = with_image_ids(test_dataset)
        with self._all_references_collated():
            dataloader = self.get_test_dataloader(dataset)
        metrics, split = self._score_split(dataset, dataloader, metric_key_prefix)
        if hasattr(dataset, "column_names"):
            row_ids = list(dataset["image_id"])
        else:
            row_ids = [row["image_id"] for row in dataset]
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        return PredictionOutput(
            predictions=[split.captions[key] for key in row_ids],
            label_ids=[split.references[key] for key in row_ids],
            metrics=metrics,
        )

    def caption_dataset(self, dataset) -> tuple[dict[Any, str], dict[Any, list[str]]]:
        """
        Beam-search captions (`args.eval_num_beams` beams, at most `args.max_caption_length` tokens; the model's own
        generation settings are ignored, as in [`sample_captions`]) for every image of `dataset`, sharded over
        processes, then gathered.

        Returns:
            `(predictions, references)` keyed by `image_id`, or by row index for a dataset without that column, as
            [`rlcaption.metrics.evaluate_captions`] takes them.
        """
        dataloader = self.get_eval_dataloader(with_image_ids(dataset))
        split = self._caption_split(dataloader, score_references=False)
        return split.captions, split.references

    def _score_split(self, dataset, dataloader, prefix: str) -> tuple[dict[str, float], CaptionedSplit]:
        split = self._caption_split(dataloader, score_references=True)
        caption_metrics, diversity_metrics = split_eval_metrics(self.args.eval_metrics)
        scores = {}
        if caption_metrics:
            scores.update(evaluate_captions(split.captions, split.references, metrics=caption_metrics))
        scores.update(diversity_scores(split.captions, split.beams, diversity_metrics))
        scores.update(scene_grounding_scores(split.captions, dataset))
        if self._eval_clip is not None:
            scores.update(clip_scores(split.captions, dataset, self._eval_clip))
        for decoding in self.args.eval_caption_sets:
            sets, references = self._caption_sets(dataloader, decoding)
            set_scores = caption_set_scores(sets, references, dataset)
            set_prefix = caption_set_prefix(decoding, self.args.eval_caption_set_size)
            scores.update({set_prefix + name: value for name, value in set_scores.items()})
        metrics = {} if split.loss is None else {f"{prefix}_loss": split.loss}
        metrics.update({f"{prefix}_{name}": float(value) for name, value in scores.items()})
        metrics[f"{prefix}_num_images"] = float(len(split.captions))
        return metrics, split

    def _caption_split(self, dataloader: Iterable[Mapping[str, Any]], score_references: bool) -> CaptionedSplit:
        model = self._generation_model()
        _, diversity_metrics = split_eval_metrics(self.args.eval_metrics)
        keep_beams = any(name in SET_DIVERSITY_METRICS for name in diversity_metrics)
        returned = self.args.eval_num_beams if keep_beams else 1
        beam_search = GenerationConfig(
            do_sample=False,
            num_beams=self.args.eval_num_beams,
            num_return_sequences=returned,
            max_new_tokens=self.args.max_caption_length,
        )
        records = []  # (image_id, beams, references, (loss sum, token count) or None), one per row
        for batch in dataloader:
            batch = self._prepare_inputs(batch)
            check_image_ids(batch)
            texts = generate_captions(model, self.processing_class, image_inputs_of(batch), beam_search).texts
            losses = None
            if score_references and "caption_input_ids" in batch:
                losses = self._reference_losses(model, batch)
            for row, image_id in enumerate(batch["image_id"]):
                beams = texts[row * returned : (row + 1) * returned]
                records.append((image_id, beams, batch["references"][row], None if losses is None else losses[row]))
        if self.accelerator.num_processes > 1:
            records = gather_object(records)
        # Uneven splits are padded with repeated rows across processes: keep each image once.
        unique = {}
        for record in records:
            unique.setdefault(record[0], record)
        losses = [loss for _, _, _, loss in unique.values() if loss is not None]
        return CaptionedSplit(
            captions={key: beams[0] for key, beams, _, _ in unique.values()},
            beams={key: beams for key, beams, _, _ in unique.values()} if keep_beams else None,
            references={key: references for key, _, references, _ in unique.values()},
            loss=sum(total for total, _ in losses) / sum(count for _, count in losses) if losses else None,
        )

    def _caption_sets(self, dataloader, decoding: str) -> tuple[dict[Any, list[str]], dict[Any, list[str]]]:
        """`args.eval_caption_set_size` captions of every image, sharded over processes, then gathered."""
        records = caption_set_batches(
            self._generation_model(), self.processing_class, dataloader, decoding,
            set_size=self.args.eval_caption_set_size, max_new_tokens=self.args.max_caption_length,
            seed=self.args.seed + self.accelerator.process_index,
        )  # fmt: skip
        if self.accelerator.num_processes > 1:
            records = gather_object(records)
        sets, references = {}, {}
        for image_id, captions, image_references in records:  # padded repeats of uneven splits: the first counts
            sets.setdefault(image_id, captions)
            references.setdefault(image_id, image_references)
        return sets, references

    @torch.no_grad()
    def _reference_losses(self, model: nn.Module, batch: Mapping[str, Any]) -> list[tuple[float, int]]:
        """
        For each image of `batch`: the summed teacher-forced cross-entropy of its references' tokens, as the `xe`
        objective computes it (`label_smoothing_factor` included), and the number of those tokens.
        """
        input_ids, attention_mask = batch["caption_input_ids"], batch["caption_attention_mask"]
        image_index = batch["caption_image_index"]
        with evaluation_mode(model):
            logits = caption_logits(model, image_inputs_of(batch), input_ids, attention_mask, image_index=image_index)
        targets = input_ids[:, 1:].masked_fill(attention_mask[:, 1:] == 0, -100)
        losses = []
        for row in range(len(batch["references"])):
            captions = image_index == row
            count = int((targets[captions] != -100).sum())
            mean = label_smoothed_cross_entropy(
                logits[captions], targets[captions], smoothing=self.args.label_smoothing_factor
            )
            losses.append((float(mean) * count, count))
        return losses

    @contextmanager
    def _all_references_collated(self) -> Iterator[None]:
        """
        While an evaluation data loader is built, a [`CaptionCollator`] that draws `captions_per_image` references
        for XE steps is replaced by a copy that keeps all of them: `eval_loss` then scores every reference, the same
        ones at every evaluation.
        """
        collator = self.data_collator
        if isinstance(collator, CaptionCollator) and collator.captions_per_image is not None:
            every_reference = copy.copy(collator)
            every_reference.captions_per_image = None
            self.data_collator = every_reference
        try:
            yield
        finally:
            self.data_collator = collator
