"""Precomputed image features: run a transformers vision backbone once over a dataset and store pooled features.

Training on precomputed features (the `image_features` column) skips the image encoder at every step, as most RL
captioning work does (bottom-up or CNN features extracted once). Extraction is batched, shows a progress bar and is
resumable: features are written in shards, each atomically (a temporary file renamed into place), so a rerun after an
interruption computes only the missing shards.

Layout of `output_dir`:

```
output_dir/
  shards/manifest.json        model, shard size, split sizes: a rerun with other settings is refused
  shards/<split>/shard-00000.npy   float32 array of shape (rows in shard, feature size)
  dataset/                    the DatasetDict with the `image_features` column (`datasets.load_from_disk`)
```
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import datasets
import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoImageProcessor, AutoModel

from ..hub import check_pretrained_reference
from ..models.encoders import pool_image_features
from .images import convert_to_rgb
from .shapes import load_shapes, save_dataset_atomically

__all__ = [
    "configure_extract_features_parser",
    "extract_features",
    "run_extract_features",
]

FEATURES_COLUMN = "image_features"
_MANIFEST_VERSION = 1


def _encode_images(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """Pooled features of shape `(batch_size, feature_size)`; dual encoders (CLIP, SigLIP) use their image tower."""
    if hasattr(model, "get_image_features"):
        return pool_image_features(model.get_image_features(pixel_values=pixel_values))
    return pool_image_features(model(pixel_values=pixel_values))


def _as_dataset_dict(dataset: datasets.Dataset | datasets.DatasetDict) -> datasets.DatasetDict:
    if isinstance(dataset, datasets.DatasetDict):
        return dataset
    if isinstance(dataset, datasets.Dataset):
        return datasets.DatasetDict({str(dataset.split) if dataset.split is not None else "train": dataset})
    raise ValueError(f"Expected a datasets.Dataset or DatasetDict, got {type(dataset).__name__}.")


def _split_signature(dataset: datasets.Dataset) -> dict:
    """What identifies a split's content cheaply: its size and a digest of its image ids when it has them."""
    signature = {"num_rows": dataset.num_rows}
    if "image_id" in dataset.column_names:
        image_ids = np.asarray(dataset.with_format("numpy")["image_id"], dtype=np.int64)
        signature["image_id_sha256"] = hashlib.sha256(image_ids.tobytes()).hexdigest()
    return signature


def _write_atomically(path: Path, write) -> None:
    """Call `write(file_object)` on a temporary file next to `path`, then rename it to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:
            write(file)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _check_manifest(shards_dir: Path, manifest: dict) -> None:
    """Refuse to mix shards of another model, shard size or dataset in one `output_dir`."""
    path = shards_dir / "manifest.json"
    if path.is_file():
        existing = json.loads(path.read_text(encoding="utf-8"))
        for key in ("version", "model", "shard_size"):
            if existing.get(key) != manifest[key]:
                raise ValueError(
                    f"{shards_dir.parent} holds features extracted with {key}={existing.get(key)!r}, not "
                    f"{manifest[key]!r}. Use another --output-dir, or delete {shards_dir} to start over."
                )
        for split, signature in manifest["splits"].items():
            if split in existing["splits"] and existing["splits"][split] != signature:
                raise ValueError(
                    f"{shards_dir.parent} holds features of a different '{split}' split ({existing['splits'][split]} "
                    f"vs {signature}). Use another --output-dir, or delete {shards_dir} to start over."
                )
        manifest = {**manifest, "splits": {**existing["splits"], **manifest["splits"]}}
    _write_atomically(path, lambda file: file.write(json.dumps(manifest, indent=2).encode("utf-8")))


def _extract_shard(
    dataset: datasets.Dataset, start: int, stop: int, model, image_processor, batch_size: int, progress
) -> np.ndarray:
    """Features of rows `start:stop`, shape `(stop - start, feature_size)`, float32."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    images_only = dataset.select_columns(["image"])  # decode nothing else
    batches = []
    for batch_start in range(start, stop, batch_size):
        batch_stop = min(batch_start + batch_size, stop)
        images = [convert_to_rgb(image) for image in images_only[batch_start:batch_stop]["image"]]
        pixel_values = image_processor(images=images, return_tensors="pt")["pixel_values"]
        with torch.inference_mode():
            features = _encode_images(model, pixel_values.to(device=device, dtype=dtype))  # (B, D)
        batches.append(features.float().cpu().numpy())
        progress.update(batch_stop - batch_start)
    return np.concatenate(batches, axis=0)


def extract_features(
    dataset: datasets.Dataset | datasets.DatasetDict,
    model_name_or_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    batch_size: int = 32,
    split: str | None = None,
    device: str | torch.device | None = None,
    shard_size: int = 1024,
) -> datasets.DatasetDict:
    """Add a column `image_features` of pooled backbone features to a captioning dataset.

    Args:
        dataset (`datasets.DatasetDict` or `datasets.Dataset`): with an `image` column (`datasets.Image`).
        model_name_or_path (`str` or `os.PathLike`): a Hub id or local folder loadable with `AutoModel` and
            `AutoImageProcessor` (ViT, DINOv2, ResNet, CLIP, SigLIP, ...); the features are pooled by
            [`rlcaption.models.encoders.pool_image_features`], as the `"backbone"` encoder pools them.
        output_dir (`str` or `os.PathLike`): where shards and the resulting dataset are written (see the module
            docstring). Rerunning with the same arguments resumes: finished shards are not recomputed.
        batch_size (`int`, *optional*, defaults to 32): images per forward pass.
        split (`str`, *optional*): process only this split; all splits by default.
        device (`str` or `torch.device`, *optional*): defaults to `"cuda"` when available, else `"cpu"`.
        shard_size (`int`, *optional*, defaults to 1024): rows per shard, the unit of resumption.

    Returns:
        `datasets.DatasetDict`: the processed splits with all their columns plus `image_features` (list of
        `float32` of the backbone's feature size), also saved in `output_dir/dataset`.
    """
    if batch_size < 1 or shard_size < 1:
        raise ValueError(f"batch_size and shard_size must be positive, got {batch_size} and {shard_size}.")
    dataset_dict = _as_dataset_dict(dataset)
    if split is not None:
        if split not in dataset_dict:
            raise ValueError(f"Split {split!r} is not in the dataset; available splits: {list(dataset_dict)}.")
        dataset_dict = datasets.DatasetDict({split: dataset_dict[split]})
    for name, split_dataset in dataset_dict.items():
        if "image" not in split_dataset.column_names:
            raise ValueError(f"Split {name!r} has no 'image' column (columns: {split_dataset.column_names}).")

    output_dir = Path(output_dir)
    shards_dir = output_dir / "shards"
    manifest = {
        "version": _MANIFEST_VERSION,
        "model": str(model_name_or_path),
        "shard_size": shard_size,
        "splits": {name: _split_signature(split_dataset) for name, split_dataset in dataset_dict.items()},
    }
    _check_manifest(shards_dir, manifest)

    def shard_path(name: str, index: int) -> Path:
        return shards_dir / name / f"shard-{index:05d}.npy"

    todo = [
        (name, index)
        for name, split_dataset in dataset_dict.items()
        for index in range(math.ceil(split_dataset.num_rows / shard_size))
        if not shard_path(name, index).is_file()
    ]
    if todo:
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        local_files_only = check_pretrained_reference(model_name_or_path, option="--model")
        image_processor = AutoImageProcessor.from_pretrained(model_name_or_path, local_files_only=local_files_only)
        model = AutoModel.from_pretrained(model_name_or_path, local_files_only=local_files_only).to(device).eval()
        rows_todo = sum(min(shard_size, dataset_dict[name].num_rows - index * shard_size) for name, index in todo)
        with tqdm(total=rows_todo, desc="Extracting image features", unit="img") as progress:
            for name, index in todo:
                start = index * shard_size
                stop = min(start + shard_size, dataset_dict[name].num_rows)
                features = _extract_shard(
                    dataset_dict[name], start, stop, model, image_processor, batch_size, progress
                )
                _write_atomically(shard_path(name, index), lambda file, array=features: np.save(file, array))

    with_features = {}
    for name, split_dataset in dataset_dict.items():
        num_shards = math.ceil(split_dataset.num_rows / shard_size)
        features = np.concatenate([np.load(shard_path(name, index)) for index in range(num_shards)], axis=0)
        if FEATURES_COLUMN in split_dataset.column_names:
            split_dataset = split_dataset.remove_columns(FEATURES_COLUMN)
        feature_type = datasets.List(datasets.Value("float32"), length=features.shape[1])
        with_features[name] = split_dataset.add_column(FEATURES_COLUMN, list(features), feature=feature_type)
    result_path = output_dir / "dataset"
    if result_path.exists():
        # Shards are the source of truth; a previous result may predate them (e.g. another split selection).
        shutil.rmtree(result_path)
    save_dataset_atomically(datasets.DatasetDict(with_features), result_path)
    return datasets.load_from_disk(str(result_path))


def configure_extract_features_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the arguments of `rlcaption extract-features` to `parser`."""
    parser.description = (
        "Add a precomputed `image_features` column to a captioning dataset with any transformers vision backbone. "
        "Resumable: rerun the same command after an interruption."
    )
    parser.add_argument(
        "--dataset",
        required=True,
        help="`shapes` for the embedded synthetic dataset (default sizes), or a folder written by `save_to_disk`.",
    )
    parser.add_argument("--model", required=True, help="Hub id or local folder of the vision backbone.")
    parser.add_argument("--output-dir", required=True, help="Where shards and the resulting dataset are written.")
    parser.add_argument("--batch-size", type=int, default=32, help="Images per forward pass (default: 32).")
    parser.add_argument("--split", default=None, help="Process only this split (default: all splits).")
    parser.add_argument("--device", default=None, help="Device, e.g. `cpu` or `cuda:0` (default: cuda if available).")
    parser.add_argument("--shard-size", type=int, default=1024, help="Rows per resumable shard (default: 1024).")
    return parser


def run_extract_features(args: argparse.Namespace) -> datasets.DatasetDict:
    """Run `rlcaption extract-features` with parsed `args`."""
    if args.dataset == "shapes":
        dataset = load_shapes()
    elif os.path.isdir(args.dataset):
        dataset = datasets.load_from_disk(args.dataset)
    else:
        raise FileNotFoundError(
            f"--dataset {args.dataset!r} is neither `shapes` nor a folder written by `save_to_disk`."
        )
    result = extract_features(
        dataset,
        args.model,
        args.output_dir,
        batch_size=args.batch_size,
        split=args.split,
        device=args.device,
        shard_size=args.shard_size,
    )
    result_path = Path(args.output_dir) / "dataset"
    print(f"Saved {dict(result.num_rows)} rows with image_features to {result_path}; load with load_from_disk.")
    return result
