"""Several captions per image, scored as in Chen & Jin's Table 4."""

import pytest
import torch

from rlcaption.data import load_shapes
from rlcaption.evaluation import caption_set_generation_config, caption_set_scores, caption_sets
from rlcaption.metrics import evaluate_captions, set_diversity
from rlcaption.processing import CaptionProcessor
from rlcaption.shapes import scene_grounding
from tiny_captioners import make_show_tell

REFERENCES = {
    1: ["a red circle on the left", "one red circle", "a circle", "a red shape", "a small red circle"],
    2: ["two blue squares", "a blue square and a blue square", "blue squares", "two squares", "two shapes"],
}


@pytest.fixture(scope="module")
def shapes():
    return load_shapes(num_train=16, num_validation=4, num_test=6, image_size=48, seed=5)


@pytest.fixture(scope="module")
def captioner(shapes):
    captions = [caption for row in shapes["train"]["captions"] for caption in row]
    processor = CaptionProcessor.from_captions(captions, image_size=48)
    return make_show_tell(processor, 48, seed=1).eval(), processor


def test_a_set_of_copies_scores_the_cider_of_the_single_caption():
    # the references repeated on every row scale the document frequencies and the number of documents alike
    single = {1: "a red circle", 2: "two blue squares"}
    sets = {key: [caption] * 5 for key, caption in single.items()}
    expected = evaluate_captions(single, REFERENCES, metrics=["cider"])["CIDEr"]
    assert caption_set_scores(sets, REFERENCES)["CIDEr"] == pytest.approx(expected, abs=1e-12)


def test_set_scores_are_the_mean_row_cider_and_the_set_diversity():
    sets = {1: ["a red circle", "a circle", "one red circle"], 2: ["two squares", "blue squares", "two squares"]}
    scores = caption_set_scores(sets, REFERENCES)
    rows = {(key, index): text for key, texts in sets.items() for index, text in enumerate(texts)}
    row_references = {(key, index): REFERENCES[key] for key, index in rows}
    assert scores["CIDEr"] == pytest.approx(evaluate_captions(rows, row_references, metrics=["cider"])["CIDEr"])
    means, _ = set_diversity(sets, normalize=True)
    assert {name: scores[name] for name in means} == means
    assert "object_f1" not in scores  # no scenes given


def test_sampled_sets_are_reproducible_and_leave_the_random_state_alone(shapes, captioner):
    model, processor = captioner
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first, references = caption_sets(model, processor, shapes["test"], "sample", set_size=5, max_new_tokens=6, seed=7)
    after = torch.rand(1)
    assert torch.equal(before, after)
    again, _ = caption_sets(model, processor, shapes["test"], "sample", set_size=5, max_new_tokens=6, seed=7)
    other, _ = caption_sets(model, processor, shapes["test"], "sample", set_size=5, max_new_tokens=6, seed=8)
    assert first == again and first != other
    assert set(first) == set(references) and all(len(texts) == 5 for texts in first.values())
    # an untrained model samples nearly at random: the 5 samples of an image differ
    assert all(len(set(texts)) > 1 for texts in first.values())


def test_beam_sets_are_the_top_of_one_beam_search_and_grounded_on_scenes(shapes, captioner):
    model, processor = captioner
    sets, references = caption_sets(model, processor, shapes["test"], "beam", set_size=3, max_new_tokens=6)
    best, _ = caption_sets(model, processor, shapes["test"], "beam", set_size=3, max_new_tokens=6, batch_size=2)
    assert sets == best  # batching changes nothing
    pixel_values = processor(images=list(shapes["test"]["image"][:2]), return_tensors="pt")["pixel_values"]
    top = model.generate(pixel_values=pixel_values, num_beams=3, num_return_sequences=3, max_new_tokens=6)
    texts = [text.strip() for text in processor.batch_decode(top, skip_special_tokens=True)]
    image_ids = list(shapes["test"]["image_id"][:2])
    assert [sets[image_ids[0]], sets[image_ids[1]]] == [texts[:3], texts[3:]]

    scores = caption_set_scores(sets, references, shapes["test"])
    scenes = dict(zip(shapes["test"]["image_id"], shapes["test"]["scene"], strict=True))
    rows = {(key, index): text for key, texts in sets.items() for index, text in enumerate(texts)}
    grounding = scene_grounding(rows, {(key, index): scenes[key] for key, index in rows})
    assert scores["object_f1"] == grounding["object_f1"]
    assert scores["parse_failure_share"] == grounding["parse_failure_share"]


@pytest.mark.parametrize(("decoding", "set_size", "message"), [("greedy", 5, "Unknown"), ("sample", 1, "at least 2")])
def test_bad_protocols_are_refused(decoding, set_size, message):
    with pytest.raises(ValueError, match=message):
        caption_set_generation_config(decoding, set_size, 10)
