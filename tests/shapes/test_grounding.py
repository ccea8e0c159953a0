"""Scene grounding of shapes captions: the parser, hand-computed scores, the dataset's own references, the `evaluate`
module, and the scene keys reported by `evaluate_model` and `RLCaptionTrainer.evaluate`."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcaption.evaluation import caption_dataset, evaluate_model
from rlcaption.metrics import EVALUATE_MODULES, load_metric
from rlcaption.processing import CaptionProcessor
from rlcaption.shapes import SCENE_GROUNDING_KEYS, ground_caption, parse_shapes_caption, scene_grounding
from rlcaption.shapes.dataset import _COLOR_WORDS, SHAPES, SceneObject, _relation, load_shapes, most_specific_reference
from rlcaption.shapes.grounding import _VOCABULARY, CaptionGrounding, ObjectMention, relation_holds
from rlcaption.trainer import RLCaptionConfig, RLCaptionTrainer
from tiny_captioners import make_show_tell

IMAGE_SIZE = 48  # the tiny CNN reduces 16x


def scene_object(color, shape, size="small", row=0, column=0, **extra):
    return {"shape": shape, "color": color, "size": size, "row": row, "column": column, **extra}


# a small red circle top left, a large blue square top right
RED_CIRCLE_BLUE_SQUARE = [scene_object("red", "circle", "small", 0, 0), scene_object("blue", "square", "large", 0, 2)]


def same_scores(first: dict, second: dict) -> bool:
    """Equal dicts, with `nan` equal to `nan` (an accuracy with nothing to check)."""
    return first.keys() == second.keys() and all(
        first[key] == second[key] or (math.isnan(first[key]) and math.isnan(second[key])) for key in first
    )


# ----------------------------------------------------------------------------------------------------------------
# Parsing
# ----------------------------------------------------------------------------------------------------------------


def test_parser_reads_objects_sizes_relation_location_and_count():
    specific = parse_shapes_caption("A big grey star to the right of a little orange hexagon and a red circle.")
    assert specific.parsed and not specific.is_generic
    assert specific.mentions == (
        ObjectMention("gray", "star", "large"),
        ObjectMention("orange", "hexagon", "small"),
        ObjectMention("red", "circle", None),
    )
    assert specific.relation == "right of" and specific.location is None and specific.count is None

    located = parse_shapes_caption("a small green diamond in the bottom right corner")
    assert located.mentions == (ObjectMention("green", "diamond", "small"),) and located.location == (2, 2)
    # "on the left" is a location, "on the left of" a relation: the longest phrase wins
    assert parse_shapes_caption("a red circle on the left").location == (1, 0)
    assert parse_shapes_caption("a red circle on the left of a blue star").relation == "left of"
    assert parse_shapes_caption("a red circle beneath a blue star").relation == "below"
    assert parse_shapes_caption("a red circle over a blue star").relation == "above"

    single = parse_shapes_caption("a single purple triangle")
    assert single.count == 1 and single.mentions == (ObjectMention("purple", "triangle"),)


@pytest.mark.parametrize(
    ("caption", "count"),
    [
        ("two shapes on a white background", 2),
        ("a couple of simple figures", 2),
        ("a pair of forms", 2),
        ("an image of a group of three objects", 3),
        ("three geometric shapes", 3),
        ("just one shape on white paper", 1),
        ("a lone flat figure", 1),
        ("some colorful shapes", None),  # "some" describes two and three objects alike
        ("a picture of a few forms", None),
    ],
)
def test_generic_captions_are_generic_with_their_count(caption, count):
    parsed = parse_shapes_caption(caption)
    assert parsed.parsed, parsed.failure
    assert parsed.is_generic and parsed.mentions == ()
    assert parsed.count == count


@pytest.mark.parametrize(
    ("caption", "reason"),
    [
        ("a red circle and a a blue", "expected a colour after 'a red circle and a', got 'a'"),
        ("a red", "the colour 'red' is followed by the end of the caption"),
        ("a red red circle", "the colour 'red' is followed by 'red'"),
        ("red circle", "expected an article"),
        ("a circle", "a shape with no colour"),
        ("a red circle left of", "the relation 'left of' ends the caption"),
        ("a red circle and", "the connector 'and' ends the caption"),
        ("a red circle and a blue square left of a green star", "only the first two objects can be related"),
        ("a red circle and a blue square in the center", "the location 'in the center' follows several objects"),
        ("a single red circle and a blue square", "the count 'a single' precedes 2 objects"),
        ("a orange circle", "the article 'a' does not fit before 'orange'"),
        ("an red circle", "the article 'an' does not fit before 'red'"),
        ("two shape", "'two' needs a plural noun"),
        ("a single shapes", "'a single' needs a singular noun"),
        ("two colorful simple shapes", "expected a generic noun"),
        ("two", "the quantity 'two' is followed by the end of the caption"),
        ("a picture of", "the frame 'a picture of' describes nothing"),
        ("a red circle on a white background and a blue star", "unexpected 'and'"),
        ("a red circles", "'circles' is not a word of the shapes dataset"),
        ("a cat on a mat", "'cat' is not a word"),
        ("<unk> red circle", "not a word of the shapes dataset"),
        ("", "the caption is empty"),
        ("  . ", "the caption is empty"),
    ],
)
def test_noisy_captions_fail_with_their_reason_and_state_nothing(caption, reason):
    parsed = parse_shapes_caption(caption)
    assert not parsed.parsed
    assert reason in parsed.failure
    assert parsed.mentions == () and parsed.relation is None and parsed.location is None and parsed.count is None
    assert not parsed.is_generic


NOISE_WORDS = ["dog", "circles", "<unk>", "the", "a", "and", "of", "red", "circle", "left", "two", "shapes", "big"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(sorted(_VOCABULARY) + NOISE_WORDS), max_size=14))
def test_any_word_sequence_is_classified_never_raised(words):
    parsed = parse_shapes_caption(" ".join(words))
    if not parsed.parsed:
        assert isinstance(parsed.failure, str) and parsed.failure
        assert parsed.mentions == () and not parsed.is_generic
        return
    assert parsed.is_generic == (parsed.mentions == ())
    if parsed.relation is not None:
        assert len(parsed.mentions) >= 2
    if parsed.location is not None:
        assert len(parsed.mentions) == 1


def test_parser_rejects_non_strings():
    with pytest.raises(ValueError, match="takes a caption string, got NoneType"):
        parse_shapes_caption(None)


# ----------------------------------------------------------------------------------------------------------------
# Hand-computed scores
# ----------------------------------------------------------------------------------------------------------------


def test_wrong_colour_missing_object_and_duplicated_mention():
    wrong_colour = scene_grounding(["a red circle and a green square"], [RED_CIRCLE_BLUE_SQUARE])
    assert (wrong_colour["object_precision"], wrong_colour["object_recall"], wrong_colour["object_f1"]) == (0.5,) * 3
    assert (wrong_colour["color_precision"], wrong_colour["color_recall"]) == (0.5, 0.5)
    assert (wrong_colour["shape_precision"], wrong_colour["shape_recall"], wrong_colour["shape_f1"]) == (1.0,) * 3

    missing = scene_grounding(["a red circle"], [RED_CIRCLE_BLUE_SQUARE])
    assert (missing["object_precision"], missing["object_recall"]) == (1.0, 0.5)
    assert missing["object_f1"] == pytest.approx(2 / 3)

    # the scene holds one red circle: the second mention matches nothing
    duplicated = scene_grounding(["a red circle and a red circle"], [RED_CIRCLE_BLUE_SQUARE])
    assert (duplicated["object_precision"], duplicated["object_recall"]) == (0.5, 0.5)
    assert (duplicated["shape_precision"], duplicated["shape_recall"]) == (0.5, 0.5)


def test_corpus_scores_pool_the_counts_and_generic_captions_lower_recall_only():
    captions = ["a red circle and a green square", "a red circle", "a red circle and a red circle", "two shapes"]
    scores = scene_grounding(captions, [RED_CIRCLE_BLUE_SQUARE] * 4)
    # matched 1 + 1 + 1 + 0 of 2 + 1 + 2 + 0 mentions and 2 + 2 + 2 + 2 objects
    assert scores["object_precision"] == pytest.approx(3 / 5)
    assert scores["object_recall"] == pytest.approx(3 / 8)
    assert scores["object_f1"] == pytest.approx(2 * 3 / (5 + 8))
    assert scores["shape_precision"] == pytest.approx(4 / 5)  # circle+square, circle, one of two circles
    assert scores["generic_share"] == 0.25 and scores["parse_failure_share"] == 0.0
    assert scores["count_accuracy"] == 1.0 and scores["num_counts_checked"] == 1
    assert scores["num_captions"] == 4
    assert list(scores) == list(SCENE_GROUNDING_KEYS)


def test_a_corpus_of_generic_captions_has_no_precision_and_zero_f1():
    scores = scene_grounding(["two shapes", "a red"], [RED_CIRCLE_BLUE_SQUARE] * 2)
    assert math.isnan(scores["object_precision"]) and math.isnan(scores["size_accuracy"])
    assert scores["object_recall"] == 0.0 and scores["object_f1"] == 0.0
    assert scores["generic_share"] == 0.5 and scores["parse_failure_share"] == 0.5


def test_sizes_are_checked_on_matched_mentions_stating_one():
    two_red_circles = [scene_object("red", "circle", "small", 0, 0), scene_object("red", "circle", "large", 2, 2)]
    both_small = ground_caption("a small red circle next to a small red circle", two_red_circles)
    assert (both_small.sizes_checked, both_small.sizes_correct) == (2, 1)
    # one small red circle in the scene: the wrongly sized mention takes it before the unsized one
    wrong_first = ground_caption("a large red circle and a red circle", [scene_object("red", "circle", "small")])
    assert (wrong_first.sizes_checked, wrong_first.sizes_correct) == (1, 0)
    scores = scene_grounding(
        ["a big blue square and a small red circle", "a little blue square and a green star"],
        [RED_CIRCLE_BLUE_SQUARE] * 2,
    )
    # right: big blue square, small red circle; wrong: little blue square; the green star matches nothing
    assert scores["size_accuracy"] == pytest.approx(2 / 3) and scores["num_sizes_checked"] == 3


def test_relations_follow_the_grid_and_a_diagonal_pair_has_two_true_readings():
    diagonal = [scene_object("red", "circle", row=0, column=0), scene_object("blue", "square", row=1, column=1)]
    verdicts = {
        "a red circle left of a blue square": True,
        "a red circle above a blue square": True,  # both readings of a diagonal pair are true
        "a blue square below a red circle": True,
        "a red circle to the right of a blue square": False,
        "a blue square over a red circle": False,
    }
    for caption, verdict in verdicts.items():
        assert ground_caption(caption, diagonal).relation_correct is verdict, caption
    scores = scene_grounding(list(verdicts) + ["a red circle left of a green square"], [diagonal] * 6)
    # the last relation involves an object the scene lacks: it is not checked
    assert scores["relation_accuracy"] == pytest.approx(3 / 5) and scores["num_relations_checked"] == 5


def test_relation_holds_agrees_with_the_dataset_for_every_pair_of_cells():
    cells = [(row, column) for row in range(3) for column in range(3)]
    for first_cell in cells:
        for second_cell in cells:
            if first_cell == second_cell:
                continue
            first = SceneObject("circle", "red", "small", *first_cell)
            second = SceneObject("square", "blue", "small", *second_cell)
            assert relation_holds(_relation(first, second), first, second)
            assert not relation_holds(_relation(second, first), first, second)


def test_locations_and_counts():
    top_left = [scene_object("red", "circle", "small", 0, 0)]
    assert ground_caption("a small red circle in the top left corner", top_left).location_correct is True
    assert ground_caption("a small red circle in the middle", top_left).location_correct is False
    assert ground_caption("a green circle in the middle", top_left).location_correct is None  # nothing to locate
    assert ground_caption("a single red circle", top_left).count_correct is True
    assert ground_caption("a single red circle", RED_CIRCLE_BLUE_SQUARE).count_correct is False
    scores = scene_grounding(
        ["two shapes", "three shapes", "some shapes", "a pair of figures"], [RED_CIRCLE_BLUE_SQUARE] * 4
    )
    assert scores["count_accuracy"] == pytest.approx(2 / 3) and scores["num_counts_checked"] == 3
    assert scores["generic_share"] == 1.0


def test_dicts_keyed_by_image_id_equal_aligned_lists_and_per_caption_results():
    captions = {"b": "a red circle left of a blue square", "a": "two shapes"}
    scenes = {"a": RED_CIRCLE_BLUE_SQUARE, "b": RED_CIRCLE_BLUE_SQUARE}
    scores, per_caption = scene_grounding(captions, scenes, per_caption=True)
    assert same_scores(scores, scene_grounding(list(captions.values()), [scenes["b"], scenes["a"]]))
    assert set(per_caption) == {"a", "b"} and all(isinstance(r, CaptionGrounding) for r in per_caption.values())
    assert per_caption["b"].matched_objects == 2 and per_caption["b"].relation_correct is True
    assert per_caption["a"].parse.is_generic and per_caption["a"].count_correct is True
    # SceneObject instances are scenes too
    as_objects = [SceneObject(**obj) for obj in RED_CIRCLE_BLUE_SQUARE]
    assert same_scores(
        scene_grounding(["a red circle"], [as_objects]), scene_grounding(["a red circle"], [scenes["a"]])
    )


@pytest.mark.parametrize(
    ("predictions", "scenes", "message"),
    [
        (["a red circle"], [], "1 predictions but 0 scenes"),
        ({1: "a red circle"}, {2: RED_CIRCLE_BLUE_SQUARE}, "prediction key 1 has no scene"),
        ({1: "a red circle", 2: "two shapes"}, {1: RED_CIRCLE_BLUE_SQUARE}, "prediction key 2 has no scene"),
        ({1: "a red circle"}, {1: RED_CIRCLE_BLUE_SQUARE, 3: []}, "scene key 3 has no prediction"),
        ({1: "a red circle"}, [RED_CIRCLE_BLUE_SQUARE], "both as aligned lists or both as dicts"),
        ("a red circle", [RED_CIRCLE_BLUE_SQUARE], "predictions must be a list"),
        ([], [], "got no predictions"),
        ([None], [RED_CIRCLE_BLUE_SQUARE], "prediction of key 0 is NoneType"),
        (["a red circle"], [[]], "the scene of key 0 has no objects"),
        (["a red circle"], ["red circle"], "expected a list of objects"),
        (["a red circle"], [[scene_object("pink", "circle")]], "has color 'pink'; expected one of"),
        (["a red circle"], [[scene_object("red", "oval")]], "has shape 'oval'"),
        (["a red circle"], [[scene_object("red", "circle", size="medium")]], "has size 'medium'"),
        (["a red circle"], [[scene_object("red", "circle", row=3)]], "has row 3; expected an integer from 0 to 2"),
        (["a red circle"], [[{"shape": "circle", "color": "red"}]], "lacks ['size', 'row', 'column']"),
        (["a red circle"], [["red circle"]], "expected a mapping with keys"),
    ],
)
def test_bad_inputs_are_rejected_with_the_bad_value(predictions, scenes, message):
    with pytest.raises(ValueError) as error:
        scene_grounding(predictions, scenes)
    assert message in str(error.value)


# ----------------------------------------------------------------------------------------------------------------
# The dataset's own references
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return load_shapes(
        num_train=300, num_validation=16, num_test=16, image_size=IMAGE_SIZE, seed=5,
        cache_dir=tmp_path_factory.mktemp("shapes_cache"),
    )  # fmt: skip


def test_every_most_specific_reference_is_fully_grounded(shapes):
    train = shapes["train"].select_columns(["captions", "scene"])
    captions, scenes = list(train["captions"]), list(train["scene"])
    queries = [most_specific_reference(references) for references in captions]
    scores, per_caption = scene_grounding(queries, scenes, per_caption=True)
    for index, result in per_caption.items():
        assert result.parse.parsed, (queries[index], result.parse.failure)
        assert result.matched_objects == result.num_mentions == result.num_objects, queries[index]
        assert result.sizes_correct == result.sizes_checked == result.num_objects, queries[index]
        assert result.relation_correct is not False and result.location_correct is not False, queries[index]
    for key in ("object_f1", "color_f1", "shape_f1", "size_accuracy", "relation_accuracy", "location_accuracy"):
        assert scores[key] == 1.0, key
    assert scores["parse_failure_share"] == 0.0 and scores["generic_share"] == 0.0
    # both kinds of specific caption occur, so both accuracies were really checked
    assert scores["num_relations_checked"] > 100 and scores["num_locations_checked"] > 0


def test_every_reference_parses_and_exactly_the_generic_ones_are_generic(shapes):
    naming_words = {word for words in _COLOR_WORDS.values() for word in words} | set(SHAPES)
    captions, scenes = [], []
    for split in ("train", "validation", "test"):
        for references, scene in zip(shapes[split]["captions"], shapes[split]["scene"], strict=True):
            generic = [reference for reference in references if parse_shapes_caption(reference).is_generic]
            assert len(generic) == 2, references  # describe_scene writes two generic references per image
            for reference in references:
                names_something = any(word in naming_words for word in reference.split())
                assert parse_shapes_caption(reference).is_generic is not names_something, reference
            captions += references
            scenes += [scene] * len(references)
    scores = scene_grounding(captions, scenes)
    assert scores["parse_failure_share"] == 0.0
    assert scores["generic_share"] == pytest.approx(2 / 5)
    # every reference is true to its image: no wrong object, size, relation, location or count
    for key in ("object_precision", "size_accuracy", "relation_accuracy", "location_accuracy", "count_accuracy"):
        assert scores[key] == 1.0, key
    assert scores["num_counts_checked"] > 0


def test_mutated_references_are_classified_and_never_crash(shapes):
    rng = random.Random(0)
    references = [reference for captions in shapes["train"]["captions"][:100] for reference in captions]
    failures = 0
    for reference in references:
        words = reference.split()
        position = rng.randrange(len(words))
        mutation = rng.choice(("drop", "repeat", "swap"))
        if mutation == "drop":
            del words[position]
        elif mutation == "repeat":
            words.insert(position, words[position])
        else:
            other = rng.randrange(len(words))
            words[position], words[other] = words[other], words[position]
        parsed = parse_shapes_caption(" ".join(words))
        failures += not parsed.parsed
        assert parsed.parsed or parsed.mentions == ()
    assert failures > len(references) // 2  # most single-word corruptions leave the grammar


# ----------------------------------------------------------------------------------------------------------------
# The `evaluate` module
# ----------------------------------------------------------------------------------------------------------------


def test_evaluate_module_loads_offline_and_equals_the_function(shapes):
    assert "scene_grounding" in EVALUATE_MODULES
    module = load_metric("scene_grounding")
    assert module.name == "scene_grounding"
    test = shapes["test"]
    scenes = list(test["scene"])  # rows carry the jitter x, y too: the module drops them
    predictions = [references[index % 5] for index, references in enumerate(test["captions"])]
    predictions[0], predictions[1] = "a red red circle", "a purple"
    scores = module.compute(predictions=predictions, scenes=scenes)
    assert same_scores(scores, scene_grounding(predictions, scenes))
    assert scores["parse_failure_share"] == pytest.approx(2 / len(predictions))
    for start in range(0, len(predictions), 5):
        module.add_batch(predictions=predictions[start : start + 5], scenes=scenes[start : start + 5])
    assert same_scores(module.compute(), scores)


def test_evaluate_module_names_a_bad_scene():
    with pytest.raises(ValueError, match="has color 'pink'"):
        load_metric("scene_grounding").compute(predictions=["a red circle"], scenes=[[scene_object("pink", "star")]])


# ----------------------------------------------------------------------------------------------------------------
# Evaluation of a model: evaluate_model and RLCaptionTrainer.evaluate
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def processor(shapes):
    captions = [caption for captions in shapes["train"]["captions"] for caption in captions]
    return CaptionProcessor.from_captions(captions, image_size=IMAGE_SIZE)


def test_evaluate_model_adds_scene_scores_when_the_split_has_a_scene_column(shapes, processor):
    model = make_show_tell(processor, IMAGE_SIZE)
    split = shapes["validation"]
    generation = {"batch_size": 8, "num_beams": 1, "max_length": 13}
    scores = evaluate_model(model, processor, split, metrics=["bleu"], **generation)
    predictions, _ = caption_dataset(model, processor, split, **generation)
    expected = scene_grounding(predictions, dict(zip(split["image_id"], split["scene"], strict=True)))
    assert same_scores({key: scores[key] for key in SCENE_GROUNDING_KEYS}, expected)
    assert scores["num_captions"] == split.num_rows and "Bleu_4" in scores

    without_scene = evaluate_model(model, processor, split.remove_columns("scene"), metrics=["bleu"], **generation)
    assert not set(SCENE_GROUNDING_KEYS) & set(without_scene) and "Bleu_4" in without_scene
    with pytest.raises(ValueError, match="no `image_id` column"):
        evaluate_model(model, processor, split.remove_columns("image_id"), metrics=["bleu"], **generation)


def test_trainer_evaluate_reports_scene_keys_only_for_splits_with_a_scene(shapes, processor, tmp_path):
    args = RLCaptionConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, objective="xe", per_device_eval_batch_size=8,
        max_caption_length=12, eval_num_beams=1, eval_metrics=["bleu"], disable_tqdm=True, save_strategy="no",
    )  # fmt: skip
    trainer = RLCaptionTrainer(
        model=make_show_tell(processor, IMAGE_SIZE), args=args, processing_class=processor,
        eval_dataset=shapes["validation"],
    )  # fmt: skip
    metrics = trainer.evaluate()
    predictions, _ = trainer.caption_dataset(shapes["validation"])
    validation = shapes["validation"]
    expected = scene_grounding(predictions, dict(zip(validation["image_id"], validation["scene"], strict=True)))
    assert same_scores({key: metrics[f"eval_{key}"] for key in SCENE_GROUNDING_KEYS}, expected)
    assert metrics["eval_num_captions"] == metrics["eval_num_images"] == shapes["validation"].num_rows
    logged = trainer.state.log_history[-1]
    assert "eval_object_f1" in logged and "eval_parse_failure_share" in logged

    without_scene = trainer.evaluate(shapes["test"].remove_columns("scene"))
    assert "eval_Bleu_4" in without_scene
    assert not [key for key in without_scene if key.removeprefix("eval_") in SCENE_GROUNDING_KEYS]
