"""The embedded synthetic captioning dataset ("shapes").

Every image shows one to three coloured geometric shapes on a white background. Each object has a shape, a colour,
a size and a cell of a 3x3 grid; objects live in distinct cells and stay inside them, so they never overlap. Each
image comes with five reference captions of varied detail:

- generic captions that fit many images ("two shapes on a white background", "a picture of some colorful forms");
- mid-level captions naming colours and shapes ("a red circle and a blue square");
- specific captions adding sizes and a spatial relation ("a small red circle left of a large blue square").

Two references per image are generic, as in COCO, but each is composed from interchangeable parts (quantity,
adjective, noun, background, frame), so no generic sentence is shared by many images: copying one is not the
CIDEr-optimal caption, and a captioner that names the objects scores higher than one that does not
(`benchmarks/reference_specificity.py` measures it). Scenes come in families of
near-duplicates (one colour, shape, size or position changed) so that retrieval is hard and distinctiveness pays.
Scenes are unique across the whole dataset (train, validation and test never share a scene) and a family never
crosses splits.

The test split is generated first, then validation, then train, each from its own random stream, so the evaluation
splits depend only on `seed`, `image_size` and the sizes of the splits generated before them, never on `num_train`.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import datasets
from PIL import Image, ImageDraw

__all__ = [
    "BENCHMARK_IMAGE_SIZE",
    "BENCHMARK_NUM_TEST",
    "BENCHMARK_NUM_TRAIN",
    "BENCHMARK_NUM_VALIDATION",
    "COLORS",
    "SHAPES",
    "SHAPES_FORMAT_VERSION",
    "SIZES",
    "SceneObject",
    "describe_scene",
    "generate_split_scenes",
    "load_shapes",
    "most_specific_reference",
    "render_scene",
    "save_dataset_atomically",
    "shapes_cache_path",
    "shapes_features",
]

logger = datasets.utils.logging.get_logger(__name__)

# What `datasets.load_from_disk` raises for an incomplete or damaged directory: a missing file or folder (OSError),
# a truncated data file or state (pyarrow's ArrowInvalid and JSONDecodeError are ValueErrors), a split listing no
# data file (IndexError) or a state without an expected key (KeyError).
_UNREADABLE_DATASET_ERRORS = (OSError, ValueError, LookupError)

# The shapes benchmark, `load_shapes()`'s defaults: 48-pixel images (a 3x3 grid of 16-pixel cells), 4,000 training,
# 200 validation and 500 test images. Every recipe, model card, benchmark and the demo use it.
BENCHMARK_NUM_TRAIN = 4000
BENCHMARK_NUM_VALIDATION = 200
BENCHMARK_NUM_TEST = 500
BENCHMARK_IMAGE_SIZE = 48

# Bump whenever generation, rendering or captions change: it is part of the cache key, so stale caches are ignored.
SHAPES_FORMAT_VERSION = 3

SHAPES = ("circle", "square", "triangle", "star", "diamond", "hexagon")
# Clearly distinct hues on white; RGB values chosen so that even 5-pixel shapes keep their colour after resizing.
COLORS = {
    "red": (220, 30, 30),
    "green": (30, 150, 50),
    "blue": (30, 70, 225),
    "yellow": (235, 190, 0),
    "purple": (140, 50, 180),
    "orange": (245, 125, 0),
    "gray": (125, 125, 125),
}
SIZES = ("small", "large")
GRID_CELLS = 3
# Fraction of a grid cell covered by an object's circumscribed radius, per size.
_RADIUS_FRACTION = {"small": 0.26, "large": 0.45}
# Probabilities of 1, 2 and 3 objects. Only 756 one-object scenes exist: a small share keeps train and test alike up
# to ~15,000 images; beyond that, single-object scenes run out (in the split generated last) and more objects are used.
_OBJECT_COUNT_WEIGHTS = (0.05, 0.50, 0.45)
# Probabilities of a family having 0, 1 or 2 near-duplicate variants besides its base scene.
_VARIANT_COUNT_WEIGHTS = (0.3, 0.4, 0.3)
_ATTRIBUTES = ("color", "shape", "size", "position")
_MAX_ATTEMPTS = 50
SPLIT_GENERATION_ORDER = ("test", "validation", "train")


@dataclass(frozen=True)
class SceneObject:
    """One object of a scene.

    Args:
        shape (`str`): one of `SHAPES`.
        color (`str`): one of `COLORS`.
        size (`str`): `"small"` or `"large"`.
        row (`int`): grid row, 0 (top) to 2 (bottom).
        column (`int`): grid column, 0 (left) to 2 (right).
        x (`float`): horizontal offset of the centre from the cell centre, as a fraction of the free room in the cell
            (-1 to 1), so the same scene renders consistently at every image size.
        y (`float`): vertical offset, same convention.
    """

    shape: str
    color: str
    size: str
    row: int
    column: int
    x: float = 0.0
    y: float = 0.0

    @property
    def attributes(self) -> tuple[str, str, str, int, int]:
        """The attributes that define the scene (the jitter `x`, `y` does not)."""
        return (self.shape, self.color, self.size, self.row, self.column)


def scene_key(scene: tuple[SceneObject, ...]) -> tuple:
    """Order-independent identity of a scene: two scenes with the same key are the same scene."""
    return tuple(sorted(obj.attributes for obj in scene))


# ----------------------------------------------------------------------------------------------------------------
# Scene sampling
# ----------------------------------------------------------------------------------------------------------------


def _sample_object(rng: random.Random, row: int, column: int) -> SceneObject:
    return SceneObject(
        shape=rng.choice(SHAPES),
        color=rng.choice(tuple(COLORS)),
        size=rng.choice(SIZES),
        row=row,
        column=column,
        x=rng.uniform(-1.0, 1.0),
        y=rng.uniform(-1.0, 1.0),
    )


def _sample_scene(rng: random.Random, num_objects: int) -> tuple[SceneObject, ...]:
    cells = rng.sample([(row, column) for row in range(GRID_CELLS) for column in range(GRID_CELLS)], num_objects)
    return tuple(_sample_object(rng, row, column) for row, column in cells)


def _relation(first: SceneObject, second: SceneObject) -> str:
    """Spatial relation of `first` to `second`: "left of", "right of", "above" or "below".

    The dominant axis wins; diagonal neighbours are described horizontally (both readings are true, since objects
    never leave their grid cell).
    """
    column_delta = second.column - first.column
    row_delta = second.row - first.row
    if column_delta != 0 and abs(column_delta) >= abs(row_delta):
        return "left of" if column_delta > 0 else "right of"
    return "above" if row_delta > 0 else "below"


def _canonical_description(scene: tuple[SceneObject, ...]) -> tuple:
    """What the most specific caption says about a scene: the objects in order plus their location or relation."""
    objects = tuple((obj.size, obj.color, obj.shape) for obj in scene)
    if len(scene) == 1:
        return objects, (scene[0].row, scene[0].column)
    return objects, _relation(scene[0], scene[1])


def _mutate(scene: tuple[SceneObject, ...], rng: random.Random) -> tuple[SceneObject, ...]:
    """A near-duplicate of `scene`: one attribute (colour, shape, size or position) of one object changed."""
    index = rng.randrange(len(scene))
    obj = scene[index]
    attribute = rng.choice(_ATTRIBUTES)
    if attribute == "color":
        changed = replace(obj, color=rng.choice([color for color in COLORS if color != obj.color]))
    elif attribute == "shape":
        changed = replace(obj, shape=rng.choice([shape for shape in SHAPES if shape != obj.shape]))
    elif attribute == "size":
        changed = replace(obj, size="large" if obj.size == "small" else "small")
    else:
        occupied = {(other.row, other.column) for other in scene}
        free = [(r, c) for r in range(GRID_CELLS) for c in range(GRID_CELLS) if (r, c) not in occupied]
        row, column = rng.choice(free)
        changed = replace(obj, row=row, column=column)
    return scene[:index] + (changed,) + scene[index + 1 :]


def generate_split_scenes(num_scenes: int, rng: random.Random, seen_keys: set[tuple]) -> list[tuple[SceneObject, ...]]:
    """Sample `num_scenes` scenes grouped in near-duplicate families, none of whose keys is in `seen_keys`.

    Args:
        num_scenes (`int`): number of scenes to return.
        rng (`random.Random`): the split's random stream.
        seen_keys (`set[tuple]`): keys of scenes already used (by this or other splits); updated in place.

    Returns:
        `list[tuple[SceneObject, ...]]`: scenes in family order (a base scene followed by its variants). A variant
        differs from its base in exactly one attribute of one object and also in its most specific caption, so
        near-duplicates stay distinguishable in words.
    """
    scenes: list[tuple[SceneObject, ...]] = []
    while len(scenes) < num_scenes:
        base = _sample_unseen_base(rng, seen_keys)
        seen_keys.add(scene_key(base))
        scenes.append(base)
        num_variants = rng.choices(range(len(_VARIANT_COUNT_WEIGHTS)), weights=_VARIANT_COUNT_WEIGHTS)[0]
        for _ in range(min(num_variants, num_scenes - len(scenes))):
            for _attempt in range(_MAX_ATTEMPTS):
                variant = _mutate(base, rng)
                key = scene_key(variant)
                if key not in seen_keys and _canonical_description(variant) != _canonical_description(base):
                    seen_keys.add(key)
                    scenes.append(variant)
                    break
    return scenes


def _sample_unseen_base(rng: random.Random, seen_keys: set[tuple]) -> tuple[SceneObject, ...]:
    num_objects = rng.choices((1, 2, 3), weights=_OBJECT_COUNT_WEIGHTS)[0]
    # Small object counts have few distinct scenes (756 with one object): when they run out, add an object.
    while num_objects <= 3:
        for _attempt in range(_MAX_ATTEMPTS):
            scene = _sample_scene(rng, num_objects)
            if scene_key(scene) not in seen_keys:
                return scene
        num_objects += 1
    raise RuntimeError(f"Could not find an unused scene after {_MAX_ATTEMPTS} attempts per object count.")


# ----------------------------------------------------------------------------------------------------------------
# Captions
# ----------------------------------------------------------------------------------------------------------------

_COLOR_WORDS = {color: (color,) for color in COLORS} | {"gray": ("gray", "grey")}
_SIZE_WORDS = {"small": ("small", "little", "small"), "large": ("large", "big", "large")}
_RELATION_WORDS = {
    "left of": ("left of", "to the left of", "on the left of"),
    "right of": ("right of", "to the right of", "on the right of"),
    "above": ("above", "over"),
    "below": ("below", "under", "beneath"),
}
_SHORT_RELATION_WORDS = {
    "left of": ("left of",),
    "right of": ("right of",),
    "above": ("above", "over"),
    "below": ("below", "under", "beneath"),
}
_INVERSE_RELATION = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
_LOCATION_WORDS = {
    (0, 0): ("in the top left corner", "at the top left"),
    (0, 1): ("at the top", "near the top"),
    (0, 2): ("in the top right corner", "at the top right"),
    (1, 0): ("on the left", "on the left side"),
    (1, 1): ("in the center", "in the middle"),
    (1, 2): ("on the right", "on the right side"),
    (2, 0): ("in the bottom left corner", "at the bottom left"),
    (2, 1): ("at the bottom", "near the bottom"),
    (2, 2): ("in the bottom right corner", "at the bottom right"),
}
_COUNT_WORDS = {1: "one", 2: "two", 3: "three"}
# Generic references are composed from interchangeable parts, so that each wording is rare: if one generic sentence
# covered a large share of the images, copying it whole would be the CIDEr-optimal caption (a copied reference has
# cosine 1 with itself whatever its n-grams' rarity) and RL would teach a captioner to stop looking.
_GENERIC_QUANTITIES = {
    1: ("a single", "one", "a lone", "just one"),
    2: ("two", "a couple of", "some", "a pair of"),
    3: ("three", "a few", "some", "a group of three"),
}
_GENERIC_ADJECTIVES = ("", "colorful", "geometric", "simple", "flat")
_GENERIC_NOUNS = ("shape", "object", "figure", "form")
_GENERIC_PLACES = (
    "on a white background",
    "on a plain background",
    "on a blank background",
    "against a white backdrop",
    "on white paper",
    "on a white canvas",
)
_GENERIC_FRAMES = ("{}", "{}", "a picture of {}", "a drawing of {}", "an image of {}")
_NUM_GENERIC_CAPTIONS = 2


def _with_article(words: str) -> str:
    return f"{'an' if words[0] in 'aeiou' else 'a'} {words}"


def _noun_phrase(obj: SceneObject, rng: random.Random, with_size: bool) -> str:
    color = rng.choice(_COLOR_WORDS[obj.color])
    if with_size:
        return _with_article(f"{rng.choice(_SIZE_WORDS[obj.size])} {color} {obj.shape}")
    return _with_article(f"{color} {obj.shape}")


def _generic_caption(scene: tuple[SceneObject, ...], rng: random.Random) -> str:
    """A caption that fits every scene with this many objects: quantity, noun and background, no attribute."""
    quantity = rng.choice(_GENERIC_QUANTITIES[len(scene)])
    adjective = rng.choice(_GENERIC_ADJECTIVES)
    noun = rng.choice(_GENERIC_NOUNS) + ("s" if len(scene) > 1 else "")
    phrase = " ".join(word for word in (quantity, adjective, noun) if word)
    if rng.random() < 0.8:  # the background is usually, not always, mentioned
        phrase += " " + rng.choice(_GENERIC_PLACES)
    return rng.choice(_GENERIC_FRAMES).format(phrase)


def _mid_level_caption(scene: tuple[SceneObject, ...], rng: random.Random) -> str:
    if len(scene) == 1:
        phrase = _noun_phrase(scene[0], rng, with_size=False)
        without_article = phrase.split(" ", 1)[1]
        return rng.choice((phrase, f"{phrase} on a white background", f"a single {without_article}"))
    # Objects in any order: word-order variation between references.
    phrases = [_noun_phrase(obj, rng, with_size=False) for obj in rng.sample(scene, len(scene))]
    if len(phrases) == 2:
        return f"{phrases[0]} {rng.choice(('and', 'next to', 'with'))} {phrases[1]}"
    return f"{phrases[0]} {rng.choice(('next to', 'with'))} {phrases[1]} and {phrases[2]}"


def _specific_caption(scene: tuple[SceneObject, ...], rng: random.Random) -> str:
    if len(scene) == 1:
        location = _LOCATION_WORDS[(scene[0].row, scene[0].column)]
        return f"{_noun_phrase(scene[0], rng, with_size=True)} {rng.choice(location)}"
    first, second = scene[0], scene[1]
    relation = _relation(first, second)
    if rng.random() < 0.5:  # the same fact told from the other object
        first, second, relation = second, first, _INVERSE_RELATION[relation]
    # With three objects only the one-word relations fit in 16 words.
    relation_words = _RELATION_WORDS[relation] if len(scene) == 2 else _SHORT_RELATION_WORDS[relation]
    caption = (
        f"{_noun_phrase(first, rng, with_size=True)} {rng.choice(relation_words)} "
        f"{_noun_phrase(second, rng, with_size=True)}"
    )
    if len(scene) == 3:
        caption += f" and {_noun_phrase(scene[2], rng, with_size=True)}"
    return caption


def describe_scene(scene: tuple[SceneObject, ...], rng: random.Random) -> list[str]:
    """Five distinct reference captions for `scene`: two generic, and three mid-level or specific ones.

    Args:
        scene (`tuple[SceneObject, ...]`): the objects; the specific captions relate the first two.
        rng (`random.Random`): drives the choice of templates and synonyms.

    Returns:
        `list[str]`: five lower-case captions of at most 16 words, in random order.
    """
    num_specific = rng.choice((1, 2))
    makers = [_generic_caption] * _NUM_GENERIC_CAPTIONS + [_specific_caption] * num_specific
    makers += [_mid_level_caption] * (5 - len(makers))
    captions: list[str] = []
    for make_caption in makers:
        caption = make_caption(scene, rng)
        # A few retries for variety; a repeated reference is allowed when a scene has few phrasings left.
        for _attempt in range(10):
            if caption not in captions:
                break
            caption = make_caption(scene, rng)
        captions.append(caption)
    rng.shuffle(captions)
    return captions


def _attribute_words() -> frozenset[str]:
    words = set(SHAPES)
    for phrases in (*_COLOR_WORDS.values(), *_SIZE_WORDS.values(), *_RELATION_WORDS.values()):
        words.update(word for phrase in phrases for word in phrase.split())
    for phrases in _LOCATION_WORDS.values():
        words.update(word for phrase in phrases for word in phrase.split() if word not in {"in", "the", "at", "on"})
    return frozenset(words - {"of", "to", "the", "on"})


_ATTRIBUTE_WORDS = _attribute_words()


def most_specific_reference(captions: list[str]) -> str:
    """The reference that states the most about its scene: most colour, shape, size and position words, then longest.

    This is the query of the retrieval benchmarks (each image's most specific reference, ranked among all images).
    """
    if not captions:
        raise ValueError("most_specific_reference needs at least one caption.")
    return max(captions, key=lambda caption: (sum(word in _ATTRIBUTE_WORDS for word in caption.split()), len(caption)))


# ----------------------------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------------------------


def _polygon(center_x: float, center_y: float, radius: float, num_points: int, start_degrees: float) -> list:
    return [
        (
            center_x + radius * math.cos(math.radians(start_degrees + 360.0 * k / num_points)),
            center_y + radius * math.sin(math.radians(start_degrees + 360.0 * k / num_points)),
        )
        for k in range(num_points)
    ]


def _star(center_x: float, center_y: float, radius: float) -> list:
    outer = _polygon(center_x, center_y, radius, 5, -90.0)
    inner = _polygon(center_x, center_y, 0.45 * radius, 5, -90.0 + 36.0)
    return [point for pair in zip(outer, inner, strict=True) for point in pair]


def object_geometry(obj: SceneObject, image_size: int) -> tuple[float, float, float]:
    """Centre `(x, y)` and circumscribed radius of `obj` in pixels, in an `image_size` x `image_size` image."""
    cell = image_size / GRID_CELLS
    radius = _RADIUS_FRACTION[obj.size] * cell
    free_room = max(cell / 2.0 - radius - 0.5, 0.0)  # keeps the whole object inside its cell
    center_x = (obj.column + 0.5) * cell + obj.x * free_room
    center_y = (obj.row + 0.5) * cell + obj.y * free_room
    return center_x, center_y, radius


def render_scene(scene: tuple[SceneObject, ...], image_size: int) -> Image.Image:
    """Draw `scene` on a white RGB image of `image_size` x `image_size` pixels (no anti-aliasing)."""
    image = Image.new("RGB", (image_size, image_size), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for obj in scene:
        x, y, radius = object_geometry(obj, image_size)
        fill = COLORS[obj.color]
        if obj.shape == "circle":
            draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=fill)
        elif obj.shape == "square":
            half = radius / math.sqrt(2.0)
            draw.rectangle((x - half, y - half, x + half, y + half), fill=fill)
        elif obj.shape == "triangle":
            draw.polygon(_polygon(x, y + 0.15 * radius, radius, 3, -90.0), fill=fill)
        elif obj.shape == "star":
            draw.polygon(_star(x, y, radius), fill=fill)
        elif obj.shape == "diamond":
            draw.polygon(_polygon(x, y, radius, 4, -90.0), fill=fill)
        elif obj.shape == "hexagon":
            draw.polygon(_polygon(x, y, radius, 6, 0.0), fill=fill)
        else:
            raise ValueError(f"Unknown shape {obj.shape!r}; expected one of {SHAPES}.")
    return image


def _png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    # Low compression: these flat images compress well anyway and generation time matters more than disk.
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


# ----------------------------------------------------------------------------------------------------------------
# Dataset assembly and caching
# ----------------------------------------------------------------------------------------------------------------


def shapes_features() -> datasets.Features:
    """The columns of the shapes dataset: `image`, `captions` (5 strings), `image_id` and the structured `scene`."""
    return datasets.Features(
        {
            "image": datasets.Image(),
            "captions": datasets.List(datasets.Value("string")),
            "image_id": datasets.Value("int64"),
            "scene": datasets.List(
                {
                    "shape": datasets.Value("string"),
                    "color": datasets.Value("string"),
                    "size": datasets.Value("string"),
                    "row": datasets.Value("int8"),
                    "column": datasets.Value("int8"),
                    "x": datasets.Value("float32"),
                    "y": datasets.Value("float32"),
                }
            ),
        }
    )


def _validate_arguments(split_sizes: dict[str, int], image_size: int) -> None:
    for split, size in split_sizes.items():
        # bool is an int subclass, but `num_test=True` is a mistake, not one image
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(
                f"num_{split} must be an integer of at least 1 (every split needs an image: `datasets` cannot load "
                f"back an empty split it saved), got {size!r}."
            )
    if not isinstance(image_size, int) or image_size < 3 * GRID_CELLS * 4:
        raise ValueError(
            f"image_size must be an integer of at least {3 * GRID_CELLS * 4} pixels so that small shapes stay "
            f"recognisable, got {image_size!r}."
        )


def _generate(split_sizes: dict[str, int], image_size: int, seed: int) -> datasets.DatasetDict:
    seen_keys: set[tuple] = set()
    split_scenes = {}
    for split in SPLIT_GENERATION_ORDER:
        rng = random.Random(f"rlcaption-shapes/{seed}/{split}")
        scenes = generate_split_scenes(split_sizes[split], rng, seen_keys)
        split_scenes[split] = [(scene, describe_scene(scene, rng)) for scene in scenes]

    features = shapes_features()
    splits = {}
    next_image_id = 0
    for split in ("train", "validation", "test"):
        rows = {"image": [], "captions": [], "image_id": [], "scene": []}
        for scene, captions in split_scenes[split]:
            rows["image"].append({"bytes": _png_bytes(render_scene(scene, image_size)), "path": None})
            rows["captions"].append(captions)
            rows["image_id"].append(next_image_id)
            rows["scene"].append([asdict(obj) for obj in scene])
            next_image_id += 1
        splits[split] = datasets.Dataset.from_dict(rows, features=features, split=datasets.NamedSplit(split))
    return datasets.DatasetDict(splits)


def shapes_cache_path(
    num_train: int = BENCHMARK_NUM_TRAIN,
    num_validation: int = BENCHMARK_NUM_VALIDATION,
    num_test: int = BENCHMARK_NUM_TEST,
    image_size: int = BENCHMARK_IMAGE_SIZE,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """Where `load_shapes` with these arguments caches its dataset.

    The directory is `<cache_dir>/<key>`, with `cache_dir` defaulting to
    `datasets.config.HF_DATASETS_CACHE / "rlcaption_shapes"` and `key` a hash of all arguments and
    `SHAPES_FORMAT_VERSION`.
    """
    arguments = {
        "format_version": SHAPES_FORMAT_VERSION,
        "num_train": num_train,
        "num_validation": num_validation,
        "num_test": num_test,
        "image_size": image_size,
        "seed": seed,
    }
    key = hashlib.sha256(json.dumps(arguments, sort_keys=True).encode("utf-8")).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else Path(datasets.config.HF_DATASETS_CACHE) / "rlcaption_shapes"
    return root / f"v{SHAPES_FORMAT_VERSION}-{key}"


def _discard_directory(path: Path) -> None:
    """Move `path` aside, then delete it, so that no process ever reads a half-deleted directory."""
    doomed = path.with_name(f".{path.name}.discarded-{uuid.uuid4().hex}")
    try:
        os.replace(path, doomed)
    except FileNotFoundError:
        return  # another process discarded it first
    shutil.rmtree(doomed, ignore_errors=True)


def save_dataset_atomically(dataset: datasets.Dataset | datasets.DatasetDict, final_path: str | os.PathLike) -> None:
    """`save_to_disk` into a temporary sibling directory, load it back, then rename it: readers only ever see a
    complete dataset.

    If `final_path` appears meanwhile (another process saved the same dataset), that complete copy is kept.

    Raises:
        `RuntimeError`: if the saved copy cannot be loaded back (`save_to_disk` reports success for some datasets it
            cannot reload, e.g. one with an empty split); nothing is left at `final_path`.
    """
    final_path = Path(final_path)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    temporary_path = Path(tempfile.mkdtemp(prefix=f".{final_path.name}.tmp-", dir=final_path.parent))
    progress_bars_were_enabled = not datasets.utils.are_progress_bars_disabled()
    datasets.utils.disable_progress_bars()  # one bar per split for a few seconds of writing is noise
    try:
        dataset.save_to_disk(str(temporary_path))
        try:
            datasets.load_from_disk(str(temporary_path))  # memory-mapped: cheap, and the only proof it is readable
        except _UNREADABLE_DATASET_ERRORS as error:
            raise RuntimeError(
                f"The dataset saved for {final_path} cannot be loaded back ({type(error).__name__}: {error}), so it "
                "was not kept. Check the free disk space, and that no split of the dataset is empty."
            ) from error
        try:
            os.replace(temporary_path, final_path)
        except OSError:
            # Another process finished the same dataset first: its copy is complete and identical, keep it.
            if not final_path.is_dir():
                raise
    finally:
        if progress_bars_were_enabled:
            datasets.utils.enable_progress_bars()
        if temporary_path.exists():
            shutil.rmtree(temporary_path, ignore_errors=True)


def load_shapes(
    num_train: int = BENCHMARK_NUM_TRAIN,
    num_validation: int = BENCHMARK_NUM_VALIDATION,
    num_test: int = BENCHMARK_NUM_TEST,
    image_size: int = BENCHMARK_IMAGE_SIZE,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> datasets.DatasetDict:
    """Generate (or load from the cache) the synthetic shapes captioning dataset.

    The defaults are the shapes benchmark: the dataset every recipe, model card, benchmark and `rlcaption demo` train
    and score on, so `load_shapes()["test"]` is the split of the published checkpoints' cards.

    Args:
        num_train (`int`, *optional*, defaults to 4000): number of training images, at least 1.
        num_validation (`int`, *optional*, defaults to 200): number of validation images, at least 1.
        num_test (`int`, *optional*, defaults to 500): number of test images, at least 1.
        image_size (`int`, *optional*, defaults to 48): side of the square RGB images, in pixels (at least 36).
        seed (`int`, *optional*, defaults to 0): the dataset is a deterministic function of the arguments.
        cache_dir (`str` or `os.PathLike`, *optional*): directory holding the cached datasets; defaults to
            `datasets.config.HF_DATASETS_CACHE / "rlcaption_shapes"`. The cache is written atomically (a temporary
            directory, loaded back, then renamed into place), so an interrupted run never leaves a dataset a later
            run would trust; an entry that cannot be loaded (damaged since) is regenerated.

    Returns:
        `datasets.DatasetDict`: splits `train`, `validation` and `test` with columns `image` (`datasets.Image`),
        `captions` (list of 5 `str`), `image_id` (`int`, unique across splits: train first, then validation, then
        test) and `scene` (list of objects with `shape`, `color`, `size`, grid `row` and `column`, and the jitter
        `x`, `y` within the cell in [-1, 1]).

    Raises:
        `ValueError`: if a split size is not an integer of at least 1 or `image_size` is too small; nothing is written.

    Example:
        ```python
        >>> from rlcaption.data import load_shapes
        >>> shapes = load_shapes(num_train=100, num_validation=10, num_test=10)
        >>> shapes["train"][0]["captions"]  # doctest: +SKIP
        ['two shapes on a white background', 'a blue star next to a red circle', ...]
        ```
    """
    split_sizes = {"train": num_train, "validation": num_validation, "test": num_test}
    _validate_arguments(split_sizes, image_size)
    path = shapes_cache_path(num_train, num_validation, num_test, image_size, seed, cache_dir)
    if path.is_dir():
        try:
            return datasets.load_from_disk(str(path))
        except _UNREADABLE_DATASET_ERRORS as error:
            # Written before saves were checked, or damaged since: regenerating gives the same dataset.
            logger.warning(f"Regenerating the cached shapes dataset {path}: it cannot be loaded ({error!r}).")
            _discard_directory(path)
    save_dataset_atomically(_generate(split_sizes, image_size, seed), path)
    return datasets.load_from_disk(str(path))
