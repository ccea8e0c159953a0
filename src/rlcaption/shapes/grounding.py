"""Scene grounding of captions of the embedded shapes dataset: are the objects, sizes and relations it states true?

Every image of `rlcaption.data.load_shapes` comes with its `scene` (the objects' colour, shape, size and grid cell),
so a caption can be checked against the truth instead of against other captions. `parse_shapes_caption` reads a
caption with the dataset's own vocabulary and grammar (imported from `rlcaption.shapes.dataset`, never copied);
`ground_caption` checks one parsed caption against its scene; `scene_grounding` pools a corpus:

- object precision / recall / F1 on (colour, shape) pairs, the same on colour alone and on shape alone;
- the accuracy of the sizes, the relation, the location and the count the captions state;
- the share of generic captions (no colour, no shape) and of captions the grammar cannot parse.

What counts as a parse failure, exactly: the caption is tokenized like every metric does (lower case, punctuation
dropped), then it fails when it is empty, holds a word outside the dataset's vocabulary, or is not a sentence of this
grammar (the generator's parts, composable more freely than the generator does, e.g. a frame around any description):

    caption      := [FRAME] (generic | objects) [PLACE]
    generic      := QUANTITY [ADJECTIVE] NOUN              singular NOUN after a quantity of one, plural otherwise
    objects      := ONE mention-body [LOCATION]            "a single red circle": a count, then a single object
                  | ARTICLE mention-body [LOCATION]        one object, optionally located
                  | ARTICLE mention-body (RELATION | CONNECTOR) mention (CONNECTOR mention)*
    mention      := ARTICLE mention-body
    mention-body := [SIZE] COLOR SHAPE

with FRAME `a picture of` | `a drawing of` | `an image of`; PLACE a generic background (`on a white background`,
`on white paper`, ...); QUANTITY a generic quantity or count word (`one`, `a single`, `a couple of`, `some`, `a group
of three`, ...) and ONE one of those meaning one; ADJECTIVE `colorful` | `geometric` | `simple` | `flat`; NOUN
`shape` | `object` | `figure` | `form`, or its plural in `s`; ARTICLE `a` or `an`, as the dataset writes it before
the next word (`an orange`, `a large`); SIZE `small` | `little` | `large` | `big`; COLOR a colour (`grey` is `gray`);
SHAPE a shape; RELATION a relation phrase of the dataset (`left of`, `to the right of`, `over`, `beneath`, ...);
CONNECTOR `and` | `next to` | `with`; LOCATION a location phrase of the dataset (`in the top left corner`, `near the
bottom`, ...). Where phrases overlap ("on the left" / "on the left of") the longest one is read. So `"a red"` (a
colour with no shape after it), `"a red red circle"`, `"red circle"` (no article), `"a orange circle"`, `"two shape"`,
`"a red circle left of"` (a dangling relation) and `"a red circle and a a blue"` all fail.

A caption that fails states nothing: it lowers object recall (its image's objects go unmatched), never precision,
and is counted in `parse_failure_share`. "some" and "a few" state no number of objects; every other quantity does.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any, TypeVar

from ..metrics.tokenization import tokenize_caption
from .dataset import (
    _COLOR_WORDS,
    _COUNT_WORDS,
    _GENERIC_ADJECTIVES,
    _GENERIC_FRAMES,
    _GENERIC_NOUNS,
    _GENERIC_PLACES,
    _GENERIC_QUANTITIES,
    _LOCATION_WORDS,
    _RELATION_WORDS,
    _SHORT_RELATION_WORDS,
    _SIZE_WORDS,
    COLORS,
    GRID_CELLS,
    SHAPES,
    SIZES,
    SceneObject,
    _with_article,
)

__all__ = [
    "SCENE_GROUNDING_KEYS",
    "CaptionGrounding",
    "ObjectMention",
    "ParsedShapesCaption",
    "ground_caption",
    "parse_shapes_caption",
    "relation_holds",
    "scene_grounding",
]

K = TypeVar("K", bound=Hashable)
# One image's objects: rows of the `scene` column of `rlcaption.data.load_shapes`, or `SceneObject`s.
Scene = Sequence[Mapping[str, Any] | SceneObject]

# The keys `scene_grounding` returns, in report order.
SCENE_GROUNDING_KEYS = (
    "object_precision",
    "object_recall",
    "object_f1",
    "color_precision",
    "color_recall",
    "color_f1",
    "shape_precision",
    "shape_recall",
    "shape_f1",
    "size_accuracy",
    "relation_accuracy",
    "location_accuracy",
    "count_accuracy",
    "generic_share",
    "parse_failure_share",
    "num_captions",
    "num_sizes_checked",
    "num_relations_checked",
    "num_locations_checked",
    "num_counts_checked",
)

# ----------------------------------------------------------------------------------------------------------------
# The dataset's vocabulary, as phrase tables (tuples of words) built from the generator's own tables
# ----------------------------------------------------------------------------------------------------------------

Phrase = tuple[str, ...]

_COLOR_BY_WORD = {word: color for color, words in _COLOR_WORDS.items() for word in words}
_SIZE_BY_WORD = {word: size for size, words in _SIZE_WORDS.items() for word in words}
_SHAPE_WORDS = frozenset(SHAPES)
_ARTICLES = frozenset({"a", "an"})
_RELATION_BY_PHRASE = {
    tuple(phrase.split()): relation
    for table in (_RELATION_WORDS, _SHORT_RELATION_WORDS)
    for relation, phrases in table.items()
    for phrase in phrases
}
_LOCATION_BY_PHRASE = {tuple(phrase.split()): cell for cell, phrases in _LOCATION_WORDS.items() for phrase in phrases}
# `_mid_level_caption` joins objects with these words; the generator has no table of them to import.
_CONNECTOR_PHRASES = frozenset({("and",), ("next", "to"), ("with",)})
_PLACE_PHRASES = frozenset(tuple(place.split()) for place in _GENERIC_PLACES)
_FRAME_PHRASES = frozenset(tuple(frame.replace("{}", "").split()) for frame in _GENERIC_FRAMES) - {()}
_GENERIC_ADJECTIVE_WORDS = frozenset(adjective for adjective in _GENERIC_ADJECTIVES if adjective)
_GENERIC_SINGULAR_NOUNS = frozenset(_GENERIC_NOUNS)
_GENERIC_PLURAL_NOUNS = frozenset(noun + "s" for noun in _GENERIC_NOUNS)  # the generator's plural: noun + "s"
# "some" and "a few" say "more than one" without a number ("some" describes two and three objects alike), so they
# state no count; every other quantity names exactly one number.
_VAGUE_QUANTITIES = frozenset({("some",), ("a", "few")})


def _quantity_table() -> dict[Phrase, int | None]:
    counts_by_phrase: dict[Phrase, set[int]] = {}
    quantities = [(count, phrase) for count, phrases in _GENERIC_QUANTITIES.items() for phrase in phrases]
    quantities += [(count, word) for count, word in _COUNT_WORDS.items()]
    for count, phrase in quantities:
        counts_by_phrase.setdefault(tuple(phrase.split()), set()).add(count)
    return {
        phrase: None if phrase in _VAGUE_QUANTITIES or len(counts) > 1 else next(iter(counts))
        for phrase, counts in counts_by_phrase.items()
    }


_COUNT_BY_QUANTITY = _quantity_table()


def _after_mention_table() -> dict[Phrase, tuple[str, Any]]:
    """What may follow an object, by phrase: `("relation", name)`, `("connector", None)`, `("location", (row,
    column))` or `("place", None)`. Phrases overlap ("on the left" / "on the left of"): the longest match wins."""
    table: dict[Phrase, tuple[str, Any]] = {phrase: ("connector", None) for phrase in _CONNECTOR_PHRASES}
    table |= {phrase: ("relation", relation) for phrase, relation in _RELATION_BY_PHRASE.items()}
    table |= {phrase: ("location", cell) for phrase, cell in _LOCATION_BY_PHRASE.items()}
    table |= {phrase: ("place", None) for phrase in _PLACE_PHRASES}
    return table


_AFTER_MENTION = _after_mention_table()


def _vocabulary() -> frozenset[str]:
    phrases: list[Iterable[Phrase]] = [
        _RELATION_BY_PHRASE,
        _LOCATION_BY_PHRASE,
        _CONNECTOR_PHRASES,
        _PLACE_PHRASES,
        _FRAME_PHRASES,
        _COUNT_BY_QUANTITY,
    ]
    words = {word for table in phrases for phrase in table for word in phrase}
    words |= set(_COLOR_BY_WORD) | set(_SIZE_BY_WORD) | _SHAPE_WORDS | _ARTICLES
    return frozenset(words | _GENERIC_ADJECTIVE_WORDS | _GENERIC_SINGULAR_NOUNS | _GENERIC_PLURAL_NOUNS)


_VOCABULARY = _vocabulary()


# ----------------------------------------------------------------------------------------------------------------
# Parsing
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectMention:
    """One object a caption names.

    Args:
        color (`str`): one of `rlcaption.shapes.dataset.COLORS` (`"grey"` is read as `"gray"`).
        shape (`str`): one of `rlcaption.shapes.dataset.SHAPES`.
        size (`str`, *optional*): `"small"` or `"large"` (`"little"` and `"big"` are read as such); `None` when the
            caption states no size.
    """

    color: str
    shape: str
    size: str | None = None


@dataclass(frozen=True)
class ParsedShapesCaption:
    """What a caption of the shapes dataset states, as read by [`parse_shapes_caption`].

    Args:
        caption (`str`): the caption as given.
        mentions (`tuple[ObjectMention, ...]`): the objects named, in caption order; empty for a generic or a
            failed caption.
        relation (`str`, *optional*): `"left of"`, `"right of"`, `"above"` or `"below"`: where `mentions[0]` is
            relative to `mentions[1]` ("a red circle over a blue square" gives `"above"`).
        location (`tuple[int, int]`, *optional*): grid `(row, column)` of the single mentioned object, from a location
            phrase ("in the top left corner" gives `(0, 0)`).
        count (`int`, *optional*): the number of objects the caption says the image holds ("two shapes", "a single
            red circle", "a group of three figures"); `None` when no number is stated ("some shapes").
        is_generic (`bool`): the caption parsed and names no colour and no shape ("two shapes on a white background").
        failure (`str`, *optional*): why the caption could not be parsed (see the module docstring); `None` when it
            parsed. A failed caption has no mentions, relation, location or count.
    """

    caption: str
    mentions: tuple[ObjectMention, ...] = ()
    relation: str | None = None
    location: tuple[int, int] | None = None
    count: int | None = None
    is_generic: bool = False
    failure: str | None = None

    @property
    def parsed(self) -> bool:
        """Whether the caption is a sentence of the dataset's grammar."""
        return self.failure is None


class _ParseFailure(Exception):
    """Raised inside the parser with the reason a caption is not a sentence of the grammar."""


class _CaptionReader:
    """A cursor over a caption's words, with the grammar rules of the module docstring as methods."""

    def __init__(self, caption: str, words: list[str]):
        self.caption = caption
        self.words = words
        self.position = 0

    def peek(self) -> str | None:
        return self.words[self.position] if self.position < len(self.words) else None

    def at_end(self) -> bool:
        return self.position >= len(self.words)

    def match(self, phrases: Iterable[Phrase]) -> Phrase | None:
        """Consume and return the longest of `phrases` starting here, if any."""
        best = None
        for phrase in phrases:
            if tuple(self.words[self.position : self.position + len(phrase)]) == phrase:
                if best is None or len(phrase) > len(best):
                    best = phrase
        if best is not None:
            self.position += len(best)
        return best

    def describe_next(self) -> str:
        return repr(self.peek()) if not self.at_end() else "the end of the caption"

    def describe_position(self) -> str:
        if self.position == 0:
            return "at the start"
        return f"after {' '.join(self.words[: self.position])!r}"

    def read_caption(self) -> ParsedShapesCaption:
        frame = self.match(_FRAME_PHRASES)
        if frame is not None and self.at_end():
            raise _ParseFailure(f"the frame {' '.join(frame)!r} describes nothing")
        quantity = self.match(_COUNT_BY_QUANTITY)
        if quantity is not None:
            count = _COUNT_BY_QUANTITY[quantity]
            following = self.peek()
            if following in _GENERIC_ADJECTIVE_WORDS | _GENERIC_SINGULAR_NOUNS | _GENERIC_PLURAL_NOUNS:
                return self.read_generic(quantity, count)
            if count == 1 and (following in _SIZE_BY_WORD or following in _COLOR_BY_WORD):
                mentions, relation, location = self.read_objects(self.read_mention_body())
                if len(mentions) > 1:
                    raise _ParseFailure(
                        f"the count {' '.join(quantity)!r} precedes {len(mentions)} objects; it may only introduce "
                        "a single one"
                    )
                return ParsedShapesCaption(self.caption, mentions, relation, location, count=count)
            expected = "a generic noun (shape, objects, ...)" + (" or an object" if count == 1 else "")
            raise _ParseFailure(
                f"the quantity {' '.join(quantity)!r} is followed by {self.describe_next()}, not {expected}"
            )
        mentions, relation, location = self.read_objects(self.read_mention())
        return ParsedShapesCaption(self.caption, mentions, relation, location)

    def read_generic(self, quantity: Phrase, count: int | None) -> ParsedShapesCaption:
        if self.peek() in _GENERIC_ADJECTIVE_WORDS:
            self.position += 1
        noun = self.peek()
        if noun not in _GENERIC_SINGULAR_NOUNS | _GENERIC_PLURAL_NOUNS:
            raise _ParseFailure(
                f"expected a generic noun (shape, objects, ...) {self.describe_position()}, got {self.describe_next()}"
            )
        plural = noun in _GENERIC_PLURAL_NOUNS
        if plural == (count == 1):
            raise _ParseFailure(
                f"{' '.join(quantity)!r} needs a {'singular' if count == 1 else 'plural'} noun, got {noun!r}"
            )
        self.position += 1
        self.read_end()
        return ParsedShapesCaption(self.caption, count=count, is_generic=True)

    def read_mention(self) -> ObjectMention:
        article = self.peek()
        if article not in _ARTICLES:
            raise _ParseFailure(
                f"expected an article ('a' or 'an') {self.describe_position()}, got {self.describe_next()}"
            )
        self.position += 1
        following = self.peek()
        # checked only before a size or colour: before anything else the mention fails below, with a clearer reason
        starts_mention = following in _SIZE_BY_WORD or following in _COLOR_BY_WORD
        if starts_mention and _with_article(following).split()[0] != article:
            raise _ParseFailure(f"the article {article!r} does not fit before {following!r}")
        return self.read_mention_body()

    def read_mention_body(self) -> ObjectMention:
        size = _SIZE_BY_WORD.get(self.peek())
        if size is not None:
            self.position += 1
        color_word = self.peek()
        if color_word not in _COLOR_BY_WORD:
            what = "a shape with no colour" if color_word in _SHAPE_WORDS else self.describe_next()
            raise _ParseFailure(f"expected a colour {self.describe_position()}, got {what}")
        self.position += 1
        shape = self.peek()
        if shape not in _SHAPE_WORDS:
            raise _ParseFailure(f"the colour {color_word!r} is followed by {self.describe_next()}, not by a shape")
        self.position += 1
        return ObjectMention(color=_COLOR_BY_WORD[color_word], shape=shape, size=size)

    def read_objects(
        self, first: ObjectMention
    ) -> tuple[tuple[ObjectMention, ...], str | None, tuple[int, int] | None]:
        mentions, relation, location = [first], None, None
        while not self.at_end():
            start = self.position
            phrase = self.match(_AFTER_MENTION)
            if phrase is None:
                raise _ParseFailure(f"unexpected {self.peek()!r} {self.describe_position()}")
            kind, value = _AFTER_MENTION[phrase]
            if kind == "place":
                self.position = start
                self.read_end()
            elif kind == "location":
                if len(mentions) > 1:
                    raise _ParseFailure(f"the location {' '.join(phrase)!r} follows several objects")
                location = value
                self.read_end()
            else:
                if kind == "relation":
                    if len(mentions) > 1:
                        raise _ParseFailure(
                            f"the relation {' '.join(phrase)!r} follows the second object; only the first two "
                            "objects can be related"
                        )
                    relation = value
                if self.at_end():
                    raise _ParseFailure(f"the {kind} {' '.join(phrase)!r} ends the caption without an object")
                mentions.append(self.read_mention())
        return tuple(mentions), relation, location

    def read_end(self) -> None:
        """An optional background phrase, then the end of the caption."""
        self.match(_PLACE_PHRASES)
        if not self.at_end():
            raise _ParseFailure(f"unexpected {self.peek()!r} {self.describe_position()}")


def parse_shapes_caption(caption: str) -> ParsedShapesCaption:
    """Read a caption with the vocabulary and grammar of the shapes dataset's references.

    The caption is tokenized like every metric does (`rlcaption.metrics.tokenize_caption`: lower case, punctuation
    dropped), then read with the grammar of the module docstring. Any string is classified, never an exception:
    noisy model outputs ("a red circle and a a blue") come back with `failure` saying what is wrong.

    Args:
        caption (`str`): one caption.

    Returns:
        [`ParsedShapesCaption`]: the objects, relation, location and count the caption states, or its `failure`.

    Raises:
        `ValueError`: when `caption` is not a string.

    Example:
    ```python
    >>> from rlcaption.metrics import parse_shapes_caption
    >>> parse_shapes_caption("a small red circle to the left of a big grey star").relation
    'left of'
    >>> parse_shapes_caption("a red red circle").failure
    "the colour 'red' is followed by 'red', not by a shape"
    ```
    """
    if not isinstance(caption, str):
        raise ValueError(f"parse_shapes_caption takes a caption string, got {type(caption).__name__} {caption!r}.")
    words = tokenize_caption(caption)
    if not words:
        return ParsedShapesCaption(caption, failure="the caption is empty")
    unknown = [word for word in words if word not in _VOCABULARY]
    if unknown:
        return ParsedShapesCaption(caption, failure=f"{unknown[0]!r} is not a word of the shapes dataset")
    try:
        return _CaptionReader(caption, words).read_caption()
    except _ParseFailure as failure:
        return ParsedShapesCaption(caption, failure=str(failure))


# ----------------------------------------------------------------------------------------------------------------
# Grounding against the scene
# ----------------------------------------------------------------------------------------------------------------


def relation_holds(relation: str, first: SceneObject, second: SceneObject) -> bool:
    """Whether `first` is `relation` (`"left of"`, `"right of"`, `"above"`, `"below"`) of `second` on the grid.

    "left of" holds when `first`'s column is smaller, "above" when its row is smaller, and so on: objects never leave
    their grid cell, so for a diagonal pair a horizontal and a vertical relation are both true, as the dataset says.
    """
    if relation == "left of":
        return first.column < second.column
    if relation == "right of":
        return first.column > second.column
    if relation == "above":
        return first.row < second.row
    if relation == "below":
        return first.row > second.row
    raise ValueError(f"Unknown relation {relation!r}; expected one of 'left of', 'right of', 'above', 'below'.")


@dataclass(frozen=True)
class CaptionGrounding:
    """How one caption fares against its scene; [`scene_grounding`] sums these over a corpus.

    Args:
        parse ([`ParsedShapesCaption`]): what the caption states.
        num_objects (`int`): objects in the scene.
        num_mentions (`int`): objects the caption names (0 when generic or failed).
        matched_objects (`int`): mentions matched to scene objects on (colour, shape), as multisets: a duplicated
            mention matches only as often as the scene holds such an object.
        matched_colors (`int`): the same matching on colour alone.
        matched_shapes (`int`): the same matching on shape alone.
        sizes_checked (`int`): matched mentions stating a size. With several objects of one colour and shape,
            mentions are matched to the objects of their stated size first, then to the others.
        sizes_correct (`int`): those whose size is right.
        relation_correct (`bool`, *optional*): whether the stated relation holds; `None` when there is none or the
            scene has no two distinct objects matching the first two mentions. With several candidate objects (same
            colour, shape and, if stated and present, size), the relation holds when it holds for one pair.
        location_correct (`bool`, *optional*): whether a candidate object of the single mention is in the stated
            cell; `None` when no location is stated or the scene has no such object.
        count_correct (`bool`, *optional*): whether the stated count equals `num_objects`; `None` when none is stated.
    """

    parse: ParsedShapesCaption
    num_objects: int
    num_mentions: int
    matched_objects: int
    matched_colors: int
    matched_shapes: int
    sizes_checked: int
    sizes_correct: int
    relation_correct: bool | None
    location_correct: bool | None
    count_correct: bool | None


def _multiset_matches(mentioned: Iterable[Hashable], present: Iterable[Hashable]) -> int:
    return sum((Counter(mentioned) & Counter(present)).values())


def _candidates(mention: ObjectMention, scene: Sequence[SceneObject]) -> list[int]:
    """Indices of the scene objects `mention` may refer to: same colour and shape, and its size if one has it."""
    same_kind = [index for index, obj in enumerate(scene) if (obj.color, obj.shape) == (mention.color, mention.shape)]
    same_size = [index for index in same_kind if scene[index].size == mention.size]
    return same_size or same_kind


def _size_matches(mentions: Sequence[ObjectMention], scene: Sequence[SceneObject]) -> tuple[int, int]:
    """`(checked, correct)` sizes over mentions matched on (colour, shape); see `CaptionGrounding.sizes_checked`."""
    checked = correct = 0
    for kind in {(mention.color, mention.shape) for mention in mentions}:
        stated = Counter(
            mention.size for mention in mentions if (mention.color, mention.shape) == kind and mention.size
        )
        actual = Counter(obj.size for obj in scene if (obj.color, obj.shape) == kind)
        right = sum((stated & actual).values())
        # the objects left after the right sizes are matched go to mentions stating a wrong size before the others
        wrong = min(sum(stated.values()) - right, sum(actual.values()) - right)
        checked += right + wrong
        correct += right
    return checked, correct


def _ground(parsed: ParsedShapesCaption, scene: Sequence[SceneObject]) -> CaptionGrounding:
    mentions = parsed.mentions
    relation_correct = location_correct = count_correct = None
    if parsed.relation is not None:
        firsts, seconds = _candidates(mentions[0], scene), _candidates(mentions[1], scene)
        pairs = [(first, second) for first in firsts for second in seconds if first != second]
        if pairs:
            relation_correct = any(relation_holds(parsed.relation, scene[a], scene[b]) for a, b in pairs)
    if parsed.location is not None:
        candidates = _candidates(mentions[0], scene)
        if candidates:
            location_correct = any((scene[index].row, scene[index].column) == parsed.location for index in candidates)
    if parsed.count is not None:
        count_correct = parsed.count == len(scene)
    sizes_checked, sizes_correct = _size_matches(mentions, scene)
    return CaptionGrounding(
        parse=parsed,
        num_objects=len(scene),
        num_mentions=len(mentions),
        matched_objects=_multiset_matches(((m.color, m.shape) for m in mentions), ((o.color, o.shape) for o in scene)),
        matched_colors=_multiset_matches((m.color for m in mentions), (o.color for o in scene)),
        matched_shapes=_multiset_matches((m.shape for m in mentions), (o.shape for o in scene)),
        sizes_checked=sizes_checked,
        sizes_correct=sizes_correct,
        relation_correct=relation_correct,
        location_correct=location_correct,
        count_correct=count_correct,
    )


_SCENE_OBJECT_FIELDS = ("shape", "color", "size", "row", "column")


def _scene_object(obj: Any, where: str) -> SceneObject:
    if isinstance(obj, SceneObject):
        values = {name: getattr(obj, name) for name in _SCENE_OBJECT_FIELDS}
    elif isinstance(obj, Mapping):
        missing = [name for name in _SCENE_OBJECT_FIELDS if name not in obj]
        if missing:
            raise ValueError(
                f"{where} lacks {missing}: every object needs {list(_SCENE_OBJECT_FIELDS)}, like the `scene` column "
                f"of rlcaption.data.load_shapes; got {dict(obj)!r}."
            )
        values = {name: obj[name] for name in _SCENE_OBJECT_FIELDS}
    else:
        raise ValueError(
            f"{where} is {obj!r}; expected a mapping with keys {list(_SCENE_OBJECT_FIELDS)} (a row of the `scene` "
            "column of rlcaption.data.load_shapes) or a rlcaption.shapes.dataset.SceneObject."
        )
    for name, allowed in (("shape", SHAPES), ("color", tuple(COLORS)), ("size", SIZES)):
        if values[name] not in allowed:
            raise ValueError(f"{where} has {name} {values[name]!r}; expected one of {list(allowed)}.")
    for name in ("row", "column"):
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, Integral) or not 0 <= value < GRID_CELLS:
            raise ValueError(f"{where} has {name} {value!r}; expected an integer from 0 to {GRID_CELLS - 1}.")
        values[name] = int(value)
    return SceneObject(**values)


def _scene_objects(scene: Any, where: str) -> tuple[SceneObject, ...]:
    if isinstance(scene, str | bytes | Mapping) or not isinstance(scene, Iterable):
        raise ValueError(f"{where} is {scene!r}; expected a list of objects (one row of the `scene` column).")
    objects = tuple(_scene_object(obj, f"{where}, object {index},") for index, obj in enumerate(scene))
    if not objects:
        raise ValueError(f"{where} has no objects; every shapes image shows one to three.")
    return objects


def ground_caption(caption: str, scene: Scene) -> CaptionGrounding:
    """Check what one caption states against its scene.

    Args:
        caption (`str`): the caption.
        scene (`Sequence[Mapping[str, Any] | SceneObject]`): the image's objects, each with `shape`, `color`, `size`,
            `row` and `column` (a row of the `scene` column of `rlcaption.data.load_shapes`).

    Returns:
        [`CaptionGrounding`]: the parse, the matches and the truth of the stated relation, location and count.

    Raises:
        `ValueError`: when `caption` is not a string or `scene` is not a non-empty list of valid objects.
    """
    return _ground(parse_shapes_caption(caption), _scene_objects(scene, "scene"))


def _aligned_corpus(predictions: Any, scenes: Any) -> tuple[dict[Any, str], dict[Any, Any]]:
    """Both inputs as dicts with the same keys: aligned lists are keyed by position."""
    for name, value in (("predictions", predictions), ("scenes", scenes)):
        if isinstance(value, str | bytes) or not isinstance(value, Mapping | Iterable):
            raise ValueError(
                f"scene_grounding: {name} must be a list (aligned with the other argument) or a dict keyed by image "
                f"id, got {type(value).__name__} {value!r:.80}."
            )
    if isinstance(predictions, Mapping) != isinstance(scenes, Mapping):
        raise ValueError(
            "scene_grounding: pass predictions and scenes both as aligned lists or both as dicts keyed by image id; "
            f"got {type(predictions).__name__} and {type(scenes).__name__}."
        )
    if not isinstance(predictions, Mapping):
        predictions, scenes = list(predictions), list(scenes)
        if len(predictions) != len(scenes):
            raise ValueError(
                f"scene_grounding: {len(predictions)} predictions but {len(scenes)} scenes; the lists must be "
                "aligned (one scene per caption)."
            )
        predictions, scenes = dict(enumerate(predictions)), dict(enumerate(scenes))
    if not predictions:
        raise ValueError("scene_grounding got no predictions; pass at least one caption and its scene.")
    missing = [key for key in predictions if key not in scenes]
    if missing:
        raise ValueError(
            f"scene_grounding: prediction key {missing[0]!r} has no scene ({len(missing)} such keys); predictions "
            "and scenes must have the same keys."
        )
    extra = [key for key in scenes if key not in predictions]
    if extra:
        raise ValueError(
            f"scene_grounding: scene key {extra[0]!r} has no prediction ({len(extra)} such keys); predictions and "
            "scenes must have the same keys."
        )
    for key, caption in predictions.items():
        if not isinstance(caption, str):
            raise ValueError(
                f"scene_grounding: the prediction of key {key!r} is {type(caption).__name__} {caption!r}, not a "
                "caption string."
            )
    return predictions, scenes


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


def _precision_recall_f1(prefix: str, matched: int, mentioned: int, present: int) -> dict[str, float]:
    return {
        f"{prefix}_precision": _ratio(matched, mentioned),
        f"{prefix}_recall": _ratio(matched, present),
        # 2 TP / (2 TP + FP + FN), the harmonic mean of precision and recall; 0 when nothing is mentioned
        f"{prefix}_f1": _ratio(2 * matched, mentioned + present),
    }


def scene_grounding(
    predictions: Mapping[K, str] | Sequence[str],
    scenes: Mapping[K, Scene] | Sequence[Scene],
    per_caption: bool = False,
) -> dict[str, float] | tuple[dict[str, float], dict[K, CaptionGrounding]]:
    """Corpus scores of how true captions of the shapes dataset are to their images' scenes.

    Every caption is read with [`parse_shapes_caption`] and checked with [`ground_caption`]; the counts are pooled
    over the corpus (micro-averaged), so an image with three objects weighs more in recall than one with one.

    Args:
        predictions (`Mapping[K, str]` or `Sequence[str]`): one caption per image, keyed by image id, or a list.
        scenes (`Mapping[K, scene]` or `Sequence[scene]`): each image's `scene` (a list of objects with `shape`,
            `color`, `size`, `row`, `column`, as in the `scene` column of `rlcaption.data.load_shapes`); same keys
            as `predictions`, or a list aligned with it.
        per_caption (`bool`, *optional*, defaults to `False`): also return every caption's [`CaptionGrounding`].

    Returns:
        `dict[str, float]` with the keys of `SCENE_GROUNDING_KEYS`:

        - `object_precision`, `object_recall`, `object_f1`: multiset matching of the mentioned (colour, shape) pairs
          against the scene objects; precision over all mentions of the corpus, recall over all scene objects (a
          generic or failed caption mentions nothing, so it lowers recall only); `color_*` and `shape_*`: the same on
          colour alone and on shape alone;
        - `size_accuracy`: right sizes among matched mentions stating a size (`num_sizes_checked` of them);
        - `relation_accuracy`: true relations among captions relating two matched objects (`num_relations_checked`);
        - `location_accuracy`: right cells among single-object captions with a location (`num_locations_checked`);
        - `count_accuracy`: right counts of objects among captions stating one (`num_counts_checked`);
        - `generic_share`, `parse_failure_share`: shares of generic and of unparsable captions;
        - `num_captions`.

        A ratio with nothing to count (a precision without mentions, an accuracy without statements) is `nan`. With
        `per_caption=True`, a tuple `(scores, per_caption_results)` where `per_caption_results[key]` is the
        [`CaptionGrounding`] of `predictions[key]` (keys are list positions for lists).

    Raises:
        `ValueError`: when the inputs are not aligned (lengths or keys differ; the message names the first odd key),
            a prediction is not a string, or a scene is not a non-empty list of valid objects.

    Example:
    ```python
    >>> from rlcaption.shapes import scene_grounding
    >>> scene = [
    ...     {"shape": "circle", "color": "red", "size": "small", "row": 0, "column": 0},
    ...     {"shape": "square", "color": "blue", "size": "large", "row": 1, "column": 2},
    ... ]
    >>> scores = scene_grounding(["a small red circle left of a large green square"], [scene])
    >>> scores["object_precision"], scores["color_recall"], scores["relation_accuracy"]
    (0.5, 0.5, nan)
    ```
    """
    predictions, scenes = _aligned_corpus(predictions, scenes)
    results = {
        key: _ground(parse_shapes_caption(caption), _scene_objects(scenes[key], f"the scene of key {key!r}"))
        for key, caption in predictions.items()
    }
    grounded = list(results.values())
    num_mentions = sum(result.num_mentions for result in grounded)
    num_objects = sum(result.num_objects for result in grounded)
    scores = {}
    for prefix, field in (("object", "matched_objects"), ("color", "matched_colors"), ("shape", "matched_shapes")):
        matched = sum(getattr(result, field) for result in grounded)
        scores |= _precision_recall_f1(prefix, matched, num_mentions, num_objects)
    sizes_checked = sum(result.sizes_checked for result in grounded)
    scores["size_accuracy"] = _ratio(sum(result.sizes_correct for result in grounded), sizes_checked)
    checked_statements = {}
    for statement in ("relation", "location", "count"):
        verdicts = [getattr(result, f"{statement}_correct") for result in grounded]
        verdicts = [verdict for verdict in verdicts if verdict is not None]
        scores[f"{statement}_accuracy"] = _ratio(sum(verdicts), len(verdicts))
        checked_statements[f"num_{statement}s_checked"] = float(len(verdicts))
    scores["generic_share"] = _ratio(sum(result.parse.is_generic for result in grounded), len(grounded))
    scores["parse_failure_share"] = _ratio(sum(not result.parse.parsed for result in grounded), len(grounded))
    scores["num_captions"] = float(len(grounded))
    scores["num_sizes_checked"] = float(sizes_checked)
    scores |= checked_statements
    scores = {key: float(scores[key]) for key in SCENE_GROUNDING_KEYS}
    if per_caption:
        return scores, results
    return scores
