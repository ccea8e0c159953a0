"""Precomputed image features: run a transformers vision backbone once over a dataset and store its pooled features
or its grid of features.

Training on precomputed features (the `image_features` column) skips the image encoder at every step, as most RL
captioning work does (bottom-up or CNN features extracted once). Extraction is batched, shows a progress bar and is
resumable: features are written in shards, each atomically (a temporary file renamed into place), so a rerun after an
interruption computes only the missing shards. Once a split's shards are complete they are converted into its Arrow
folder in `dataset/` and deleted, so a finished extraction holds its features once; its images are referenced, not
copied, when they are files (see [`rlcaption.data.image_references`]). Released region features (bottom-up
attention) are read by `rlcaption.data.regions` instead.

Layout of `output_dir`:

```
output_dir/
  shards/manifest.json        model (a local folder as its absolute path), pooling, shard size, split sizes: a
                              rerun with other settings is refused; the backbone's image processor settings and
                              `feature_shape`, the shape of one image's features, once extraction has started
                              (written only once the backbone has loaded, so a mistyped --model locks nothing);
                              `splits_in_dataset`, the splits converted into `dataset/`
  shards/<split>/shard-00000.npy   float32 array of shape (rows in shard, feature size) when pooled, or
                              (rows in shard, num positions, feature size) with pooling "none"; only while the
                              split is being extracted
  dataset/                    the DatasetDict with the `image_features` column
                              ([`rlcaption.data.loading.load_saved_dataset`]); `dataset/<split>/image_references.json`
                              records the folder its image paths are relative to
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
from ..models.show_tell_rl.encoders import POOLING_MODES, encode_images_with_backbone
from ..shapes.dataset import load_shapes, save_dataset_atomically
from .image_references import image_root, with_image_paths_relative_to, write_image_references
from .images import rgb_for_image_processor
from .loading import load_saved_dataset

__all__ = [
    "describe_feature_extractor",
    "extract_features",
    "read_feature_extractor",
    "run_extract_features",
]

FEATURES_COLUMN = "image_features"
_MANIFEST_VERSION = 1
# Settings a manifest written before they could be chosen was extracted with.
_SETTINGS_OF_OLDER_MANIFESTS = {"pooling": "auto"}


def _load_backbone(model_name_or_path: str | os.PathLike, device: torch.device, option: str = "--model"):
    """`(image_processor, model)` of a backbone, the model in evaluation mode on `device`."""
    local_files_only = check_pretrained_reference(model_name_or_path, option=option)
    image_processor = AutoImageProcessor.from_pretrained(model_name_or_path, local_files_only=local_files_only)
    model = AutoModel.from_pretrained(model_name_or_path, local_files_only=local_files_only).to(device).eval()
    return image_processor, model


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


def _resolved_model(model_name_or_path: str | os.PathLike) -> str:
    """A local backbone folder as its absolute path, so that `backbones/resnet` and `/data/backbones/resnet` name one
    backbone; a Hub id as given."""
    return str(Path(model_name_or_path).resolve()) if os.path.isdir(model_name_or_path) else str(model_name_or_path)


def _same_model(recorded: str, given: str) -> bool:
    return recorded == given or _resolved_model(recorded) == given


def _merged_manifest(shards_dir: Path, manifest: dict) -> dict:
    """The manifest of `shards_dir` updated with `manifest`, refusing shards of another model, pooling, shard size or
    dataset in one `output_dir`. Writes nothing: the manifest is written once the backbone has loaded, so that a
    mistyped --model leaves no trace that would refuse the corrected command."""
    path = shards_dir / "manifest.json"
    if not path.is_file():
        return manifest
    existing = {**_SETTINGS_OF_OLDER_MANIFESTS, **json.loads(path.read_text(encoding="utf-8"))}
    for key in ("version", "model", "pooling", "shard_size"):
        same = _same_model(existing[key], manifest[key]) if key == "model" else existing.get(key) == manifest[key]
        if not same:
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
    return {**existing, **manifest, "splits": {**existing["splits"], **manifest["splits"]}}


def _write_manifest(shards_dir: Path, manifest: dict) -> None:
    encoded = json.dumps(manifest, indent=2).encode("utf-8")
    _write_atomically(shards_dir / "manifest.json", lambda file: file.write(encoded))


def _record_feature_shape(shards_dir: Path, shard: Path, shape: tuple[int, ...]) -> None:
    """Write the shape of one image's features in the manifest, or refuse a shard whose shape differs from it."""
    manifest = json.loads((shards_dir / "manifest.json").read_text(encoding="utf-8"))
    recorded = manifest.get("feature_shape")
    if recorded is None:
        _write_manifest(shards_dir, {**manifest, "feature_shape": list(shape)})
    elif tuple(recorded) != shape:
        raise ValueError(
            f"The backbone gave features of shape {shape} per image for {shard}, unlike the {tuple(recorded)} of "
            f"the shards already in {shards_dir}: the image processor must resize every image to the same size. "
            f"Delete {shards_dir} to start over."
        )


def _extract_shard(
    dataset: datasets.Dataset,
    start: int,
    stop: int,
    model,
    image_processor,
    batch_size: int,
    pooling: str,
    progress,
) -> np.ndarray:
    """Features of rows `start:stop`, float32, of shape `(stop - start, feature_size)`, or `(stop - start,
    num_positions, feature_size)` with `pooling="none"`."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    images_only = dataset.select_columns(["image"])  # decode nothing else
    batches = []
    for batch_start in range(start, stop, batch_size):
        batch_stop = min(batch_start + batch_size, stop)
        images = [
            rgb_for_image_processor(image, image_processor) for image in images_only[batch_start:batch_stop]["image"]
        ]
        pixel_values = image_processor(images=images, return_tensors="pt")["pixel_values"]
        with torch.inference_mode():
            features = encode_images_with_backbone(
                model, pixel_values.to(device=device, dtype=dtype), pooling
            )  # (B, [N,] D)
        batches.append(features.float().cpu().numpy())
        progress.update(batch_stop - batch_start)
    return np.concatenate(batches, axis=0)


def _features_dataset(shard_paths: list[Path], num_rows: int, cache_dir: Path) -> datasets.Dataset:
    """The shards' rows as a one-column dataset, written to `cache_dir` shard by shard: grids of a whole split
    (COCO's 123k ResNet grids are 49 GB) never sit in memory at once."""
    shapes = [np.load(path, mmap_mode="r").shape for path in shard_paths]
    for path, shape in zip(shard_paths, shapes, strict=True):
        if shape[1:] != shapes[0][1:]:
            raise ValueError(
                f"Shard {path} holds features of shape {shape[1:]} per image, unlike {shapes[0][1:]} in "
                f"{shard_paths[0]}. Delete {path.parent.parent} to extract them again."
            )
    if sum(shape[0] for shape in shapes) != num_rows:
        raise ValueError(
            f"The shards in {shard_paths[0].parent} hold {sum(shape[0] for shape in shapes)} rows for a split of "
            f"{num_rows}. Delete {shard_paths[0].parent.parent} to extract them again."
        )
    per_image = shapes[0][1:]
    if len(per_image) == 1:
        feature_type = datasets.List(datasets.Value("float32"), length=per_image[0])
    else:
        feature_type = datasets.Array2D(shape=per_image, dtype="float32")

    def rows(paths: tuple[str, ...]):
        for path in paths:
            yield from ({FEATURES_COLUMN: features} for features in np.load(path, mmap_mode="r"))

    return datasets.Dataset.from_generator(
        rows,
        features=datasets.Features({FEATURES_COLUMN: feature_type}),
        # a tuple, not a list: `datasets` would split a list into one generator call per item
        gen_kwargs={"paths": tuple(str(path) for path in shard_paths)},
        cache_dir=str(cache_dir),
    )


def extract_features(
    dataset: datasets.Dataset | datasets.DatasetDict,
    model_name_or_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    batch_size: int = 32,
    split: str | None = None,
    device: str | torch.device | None = None,
    shard_size: int = 1024,
    pooling: str = "auto",
) -> datasets.DatasetDict:
    """Add a column `image_features` of pooled backbone features, or of their grids, to a captioning dataset.

    Args:
        dataset (`datasets.DatasetDict` or `datasets.Dataset`): with an `image` column (`datasets.Image`).
        model_name_or_path (`str` or `os.PathLike`): a Hub id or local folder loadable with `AutoModel` and
            `AutoImageProcessor` (ViT, DINOv2, ResNet, CLIP, SigLIP, ...); the features are pooled by
            [`rlcaption.models.show_tell_rl.encoders.pool_image_features`], as the `"backbone"` encoder pools them.
        output_dir (`str` or `os.PathLike`): where shards and the resulting dataset are written (see the module
            docstring). Rerunning with the same arguments resumes: finished shards are not recomputed.
        batch_size (`int`, *optional*, defaults to 32): images per forward pass.
        split (`str`, *optional*): process only this split; all splits by default.
        device (`str` or `torch.device`, *optional*): defaults to `"cuda"` when available, else `"cpu"`.
        shard_size (`int`, *optional*, defaults to 1024): rows per shard, the unit of resumption.
        pooling (`str`, *optional*, defaults to `"auto"`): `"auto"` stores one vector per image; `"none"` keeps the
            grid an attention decoder reads: a CNN's feature map flattened (a ResNet-152's 7x7x2048 at 224 px is
            49x2048), a transformer's tokens (ViT-B/16: the [CLS] token and 14x14 patch tokens, 197x768), a dual
            encoder's vision tower tokens (before its projection).

    Returns:
        `datasets.DatasetDict`: the processed splits with all their columns plus `image_features`, also saved in
        `output_dir/dataset` (image files referenced rather than copied, see the module docstring): a list of
        `float32` of the backbone's feature size per image, or with `pooling="none"` an `Array2D` of shape
        `(num_positions, feature_size)` (also recorded as `feature_shape` in `output_dir/shards/manifest.json`).
    """
    if batch_size < 1 or shard_size < 1:
        raise ValueError(f"batch_size and shard_size must be positive, got {batch_size} and {shard_size}.")
    if pooling not in POOLING_MODES:
        raise ValueError(f"Unknown pooling {pooling!r}; expected one of {POOLING_MODES} (--pooling).")
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
        "model": _resolved_model(model_name_or_path),
        "pooling": pooling,
        "shard_size": shard_size,
        "splits": {name: _split_signature(split_dataset) for name, split_dataset in dataset_dict.items()},
    }
    manifest = _merged_manifest(shards_dir, manifest)

    def shard_path(name: str, index: int) -> Path:
        return shards_dir / name / f"shard-{index:05d}.npy"

    result_path = output_dir / "dataset"
    stored = {
        name
        for name in manifest.get("splits_in_dataset", [])
        if name in dataset_dict and (result_path / name).is_dir()
    }
    todo = [
        (name, index)
        for name, split_dataset in dataset_dict.items()
        if name not in stored
        for index in range(math.ceil(split_dataset.num_rows / shard_size))
        if not shard_path(name, index).is_file()
    ]
    if not todo:
        _write_manifest(shards_dir, manifest)
    else:
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        image_processor, model = _load_backbone(model_name_or_path, device)
        # recorded so that a captioner trained on these features can process new photos exactly as they were
        _write_manifest(shards_dir, {**manifest, "image_processor": json.loads(image_processor.to_json_string())})
        rows_todo = sum(min(shard_size, dataset_dict[name].num_rows - index * shard_size) for name, index in todo)
        with tqdm(total=rows_todo, desc="Extracting image features", unit="img") as progress:
            for name, index in todo:
                start = index * shard_size
                stop = min(start + shard_size, dataset_dict[name].num_rows)
                features = _extract_shard(
                    dataset_dict[name], start, stop, model, image_processor, batch_size, pooling, progress
                )
                _record_feature_shape(shards_dir, shard_path(name, index), features.shape[1:])
                _write_atomically(shard_path(name, index), lambda file, array=features: np.save(file, array))

    cache_dir = Path(tempfile.mkdtemp(prefix=".features-cache-", dir=output_dir))
    try:
        for name, split_dataset in dataset_dict.items():
            if name not in stored:
                num_shards = math.ceil(split_dataset.num_rows / shard_size)
                shard_paths = [shard_path(name, index) for index in range(num_shards)]
                _store_split(split_dataset, shard_paths, result_path / name, cache_dir / name)
                _record_split_in_dataset(shards_dir, name)
            # the features are in `dataset/` now: their shards would be a second copy (left by an interruption here)
            shutil.rmtree(shards_dir / name, ignore_errors=True)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    _write_split_list(result_path, dataset_dict)
    saved = load_saved_dataset(result_path)
    return datasets.DatasetDict({name: saved[name] for name in dataset_dict})


def _store_split(
    split_dataset: datasets.Dataset, shard_paths: list[Path], split_folder: Path, cache_dir: Path
) -> None:
    """Save `split_dataset` with the features of its shards in `split_folder`, its images referenced where they are
    files (their paths, relative to a root recorded beside them) rather than copied."""
    features = _features_dataset(shard_paths, split_dataset.num_rows, cache_dir)
    if FEATURES_COLUMN in split_dataset.column_names:
        split_dataset = split_dataset.remove_columns(FEATURES_COLUMN)
    root = image_root(split_dataset) if "image" in split_dataset.column_names else None
    if root is not None:
        split_dataset = with_image_paths_relative_to(split_dataset, root)
    with_features = datasets.concatenate_datasets([split_dataset, features], axis=1, split=split_dataset.split)
    if split_folder.exists():
        # an earlier version's copy, or one an interruption left unrecorded: the shards are the source of truth
        shutil.rmtree(split_folder)
    save_dataset_atomically(with_features, split_folder)
    if root is not None:
        write_image_references(split_folder, root)


def _record_split_in_dataset(shards_dir: Path, name: str) -> None:
    """Mark split `name` as saved in `dataset/`, so that its shards can go and a rerun skips it."""
    manifest = json.loads((shards_dir / "manifest.json").read_text(encoding="utf-8"))
    in_dataset = manifest.get("splits_in_dataset", [])
    _write_manifest(
        shards_dir, {**manifest, "splits_in_dataset": [*in_dataset, name] if name not in in_dataset else in_dataset}
    )


def _write_split_list(result_path: Path, dataset_dict: datasets.DatasetDict) -> None:
    """Write the `dataset_dict.json` that makes `result_path` a `DatasetDict` of the splits saved in it: the ones
    extracted now and any of earlier runs (each split is saved in its own folder, as `DatasetDict.save_to_disk`
    lays them out)."""
    list_path = result_path / datasets.config.DATASETDICT_JSON_FILENAME
    listed = json.loads(list_path.read_text(encoding="utf-8"))["splits"] if list_path.is_file() else []
    splits = [name for name in listed if (result_path / name).is_dir()]
    splits += [name for name in dataset_dict if name not in splits]
    encoded = json.dumps({"splits": splits}).encode("utf-8")
    _write_atomically(list_path, lambda file: file.write(encoded))


def read_feature_extractor(folder: str | os.PathLike) -> dict | None:
    """
    What made the features of an `extract-features` output folder (or of its `dataset/`), from its manifest: the
    record a captioner trained on them keeps in its config (`image_feature_extractor`), so that it can caption photos.

    Returns:
        `dict` with `model` (Hub id or absolute folder of the backbone), `image_processor` (its settings as saved in
        `preprocessor_config.json`; absent from manifests of older versions), `pooling`, `layout` (`"pooled"` or
        `"grid"`) and `feature_shape`; `None` for a folder without a manifest (e.g. region features).
    """
    folder = Path(folder)
    if folder.name == "dataset" and not (folder / "shards").is_dir():
        folder = folder.parent
    path = folder / "shards" / "manifest.json"
    if not path.is_file():
        return None
    manifest = {**_SETTINGS_OF_OLDER_MANIFESTS, **json.loads(path.read_text(encoding="utf-8"))}
    recorded_keys = ("model", "image_processor", "pooling", "feature_shape")
    record = {key: manifest[key] for key in recorded_keys if key in manifest}
    record["layout"] = "grid" if record["pooling"] == "none" else "pooled"
    return record


def describe_feature_extractor(record: dict | None) -> str:
    """`record` ([`read_feature_extractor`]) in words, as errors name it."""
    if record is None:
        return "features with no recorded extractor (e.g. region features)"
    return f"{record['layout']} features (pooling {record['pooling']!r}) of the backbone {record['model']!r}"


def run_extract_features(args: argparse.Namespace) -> datasets.DatasetDict:
    """Run `rlcaption extract-features` with parsed `args`."""
    if args.dataset == "shapes":
        dataset = load_shapes()
    elif os.path.isdir(args.dataset):
        dataset = load_saved_dataset(args.dataset)
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
        pooling=args.pooling,
    )
    result_path = Path(args.output_dir) / "dataset"
    print(
        f"Saved {dict(result.num_rows)} rows with image_features to {result_path}; name {args.output_dir} as "
        "--image_features or --dataset, or load it with rlcaption.data.loading.load_saved_dataset."
    )
    return result
