import numpy as np
import pytest
import torch
from PIL import Image

from rlcaption.data import CaptionCollator
from rlcaption.processing import CaptionProcessor

CAPTIONS = ["a red circle", "a blue square", "two shapes on a white background", "some colorful shapes"]


@pytest.fixture(scope="module")
def processor():
    return CaptionProcessor.from_captions(CAPTIONS, image_size=16)


def image_row(image_id, captions, **extra):
    return {"image": Image.new("RGB", (20, 20), (image_id * 40, 0, 0)), "captions": captions, "image_id": image_id}


def test_collates_images_references_and_every_tokenized_caption(processor):
    rows = [image_row(1, CAPTIONS[:2]), image_row(2, CAPTIONS[2:])]
    rows[0]["scene"], rows[1]["scene"] = "first", "second"
    batch = CaptionCollator(processor)(rows)
    assert batch["pixel_values"].shape == (2, 3, 16, 16)
    assert batch["references"] == [CAPTIONS[:2], CAPTIONS[2:]]
    assert batch["image_id"] == [1, 2]
    assert batch["scene"] == ["first", "second"]  # other columns reach reward functions
    assert batch["caption_image_index"].tolist() == [0, 0, 1, 1]
    decoded = processor.batch_decode(batch["caption_input_ids"])
    assert decoded == CAPTIONS
    assert batch["caption_attention_mask"].sum(dim=1).tolist() == [len(c.split()) + 2 for c in CAPTIONS]


def test_draws_a_subset_of_references_per_image(processor):
    rows = [image_row(1, CAPTIONS), image_row(2, CAPTIONS)]
    batch = CaptionCollator(processor, captions_per_image=1)(rows)
    assert batch["caption_image_index"].tolist() == [0, 1]
    assert set(processor.batch_decode(batch["caption_input_ids"])) <= set(CAPTIONS)


def test_precomputed_features_are_used_instead_of_images(processor):
    rows = [{"image_features": np.arange(4.0), "captions": ["a red circle"], "image_id": 7}]
    batch = CaptionCollator(processor)(rows)
    assert "pixel_values" not in batch
    assert torch.equal(batch["image_features"], torch.arange(4.0)[None])


@pytest.mark.parametrize("captions", [[], ["a red circle", 3], None])
def test_unusable_references_name_the_image(processor, captions):
    rows = [image_row(1, CAPTIONS[:1]), image_row(42, captions)]
    with pytest.raises(ValueError, match="Image 42 has no usable references"):
        CaptionCollator(processor)(rows)


def test_rows_without_an_image_column_are_rejected(processor):
    with pytest.raises(ValueError, match="no image column"):
        CaptionCollator(processor)([{"captions": ["a red circle"], "image_id": 1}])
