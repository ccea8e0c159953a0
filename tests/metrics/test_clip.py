"""CLIP-S and CLIP retrieval: hand computations from the feature methods, clipping, known rankings, loading."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlcaption.metrics import clip_retrieval, clip_s, clip_score, embed_images, embed_texts, load_clip
from tiny_clips import (
    CAPTIONS,
    StubCLIP,
    StubProcessor,
    indexed_images,
    make_processor,
    make_shapes_clip,
    make_transformers_clip,
    random_images,
)


@pytest.fixture(scope="module")
def processor():
    return make_processor()


@pytest.fixture(scope="module", params=["shapes_clip", "transformers_clip"])
def clip(request, processor):
    """Our dual encoder and transformers' CLIPModel: every metric must treat them alike."""
    make = make_shapes_clip if request.param == "shapes_clip" else make_transformers_clip
    return make(processor), processor


def hand_cosines(model, processor, images, captions) -> np.ndarray:
    """cos(image_i, caption_i) straight from `get_image_features` / `get_text_features`."""
    with torch.no_grad():
        pixel_values = processor(images=images)["pixel_values"]
        text = processor(text=captions)
        image_features = model.get_image_features(pixel_values=pixel_values).pooler_output
        text_features = model.get_text_features(
            input_ids=text["input_ids"], attention_mask=text["attention_mask"]
        ).pooler_output
    return F.cosine_similarity(image_features, text_features, dim=-1).numpy()


def test_clip_score_is_hessels_formula_on_the_models_own_features(clip):
    model, processor = clip
    images, captions = random_images(4), CAPTIONS
    corpus, per_caption = clip_score(images, captions, model=clip, batch_size=3)  # two image batches
    expected = 2.5 * np.maximum(hand_cosines(model, processor, images, captions), 0.0)
    np.testing.assert_allclose(per_caption, expected, atol=1e-6)
    assert corpus == pytest.approx(float(expected.mean()), abs=1e-6)


def test_clip_s_clips_negative_cosines_at_zero_and_scales_by_w():
    images = np.array([[1.0, 0.0], [1.0, 0.0], [3.0, 4.0], [0.0, 2.0]])
    texts = np.array([[-1.0, 0.0], [2.0, 0.0], [4.0, 3.0], [1.0, 1.0]])
    np.testing.assert_allclose(clip_s(images, texts), [0.0, 2.5, 2.5 * 24 / 25, 2.5 / np.sqrt(2)])
    np.testing.assert_allclose(clip_s(images, texts, w=1.0), [0.0, 1.0, 24 / 25, 1 / np.sqrt(2)])


def test_clip_score_of_an_anti_aligned_pair_is_zero_not_negative():
    stub = StubCLIP([[1.0, 0.0], [0.0, 1.0]], {"left": [-1.0, 0.0], "up": [0.0, 3.0]})
    corpus, per_caption = clip_score(indexed_images(2), ["left", "up"], model=(stub, StubProcessor(stub.texts)))
    assert per_caption == [0.0, 2.5]
    assert corpus == 1.25


def test_clip_retrieval_on_a_case_with_a_known_answer():
    # image 0 <-> "zero" exactly; "two" is closer to image 1 (cos 0.98) than to its own image 2 (0.75), and image 1
    # is closer to "two" than to its own "one" (0.89)
    stub = StubCLIP(
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.6, 0.8]],
        {"zero": [1.0, 0.0, 0.0], "one": [0.0, 1.0, -0.5], "two": [0.0, 1.0, 0.2]},
    )
    recalls = clip_retrieval(
        indexed_images(3), ["zero", "one", "two"], model=(stub, StubProcessor(stub.texts)), ks=(1, 2)
    )
    # text->image: "two" ranks image 1 first, its own image 2 second
    assert recalls["t2i_R@1"] == pytest.approx(2 / 3) and recalls["t2i_R@2"] == 1.0
    # image->text: image 1 ranks "two" first, its own "one" second; image 2 prefers its own "two" (0.75 > 0.18)
    assert recalls["i2t_R@1"] == pytest.approx(2 / 3) and recalls["i2t_R@2"] == 1.0


def test_retrieval_of_matching_captions_beats_shuffled_ones(clip):
    # a random model knows nothing, but the same (image, caption) embeddings must give the same recalls as
    # `retrieval_recall` on the hand-made embeddings
    from rlcaption.metrics import retrieval_recall

    model, processor = clip
    images = random_images(4, seed=3)
    recalls = clip_retrieval(images, CAPTIONS, model=clip, ks=(1, 2))
    with torch.no_grad():
        image_features = model.get_image_features(pixel_values=processor(images=images)["pixel_values"]).pooler_output
        text = processor(text=CAPTIONS)
        text_features = model.get_text_features(input_ids=text["input_ids"], attention_mask=text["attention_mask"])
    assert recalls == retrieval_recall(text_features.pooler_output, image_features, ks=(1, 2))


def test_embeddings_are_unit_vectors_independent_of_the_batch_size(clip):
    model, processor = clip
    images = random_images(5)
    one_batch = embed_images(model, processor, images, batch_size=5)
    torch.testing.assert_close(embed_images(model, processor, images, batch_size=2), one_batch)
    torch.testing.assert_close(one_batch.norm(dim=-1), torch.ones(5))
    texts = embed_texts(model, processor, CAPTIONS, batch_size=1)
    torch.testing.assert_close(embed_texts(model, processor, CAPTIONS, batch_size=4), texts)


def test_metrics_run_under_no_grad(processor):
    model = make_shapes_clip(processor)
    assert torch.is_grad_enabled()
    images = embed_images(model, processor, random_images(2))
    assert not images.requires_grad and images.grad_fn is None


def test_inputs_are_checked():
    stub = StubCLIP([[1.0, 0.0]], {"a": [1.0, 0.0]})
    with pytest.raises(ValueError, match="2 images and 1 captions"):
        clip_score(indexed_images(2), ["a"], model=(stub, StubProcessor(stub.texts)))
    with pytest.raises(ValueError, match="hub id"):
        load_clip(42)
    with pytest.raises(ValueError, match="get_image_features"):
        load_clip((torch.nn.Linear(2, 2), None))


def test_a_hub_id_that_is_not_cached_is_not_downloaded_with_local_files_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(OSError):
        load_clip("rlcaption/no-such-clip", local_files_only=True)
    assert not any(tmp_path.iterdir())  # nothing was fetched


def test_a_saved_clip_loads_from_its_folder(tmp_path, processor):
    model = make_shapes_clip(processor, seed=3)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    images = random_images(3)
    expected = clip_score(images, CAPTIONS[:3], model=(model, processor))[1]
    np.testing.assert_allclose(clip_score(images, CAPTIONS[:3], model=tmp_path)[1], expected, atol=1e-6)
    np.testing.assert_allclose(
        clip_score(images, CAPTIONS[:3], model=str(tmp_path), local_files_only=True)[1], expected, atol=1e-6
    )
