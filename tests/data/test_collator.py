import re

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import TrOCRProcessor, ViTImageProcessorPil

from rlcaption.data import CaptionCollator
from rlcaption.generation.captioners import CaptionTokens, captioner_for
from rlcaption.processing import CaptionProcessor
from tiny_captioners import FOREIGN_CAPTIONERS, make_bert_tokenizer, make_foreign_captioner, make_gpt2_tokenizer

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


def test_images_kept_beside_features_pass_through_for_the_rewards_that_read_them(processor):
    rows = [{**image_row(1, CAPTIONS[:1]), "image_features": np.arange(4.0)}]
    batch = CaptionCollator(processor)(rows)
    assert "pixel_values" not in batch  # the captioner reads the features; a CLIP reward reads the image
    assert batch["image"] == [rows[0]["image"]]


@pytest.mark.parametrize("captions", [[], ["a red circle", 3], None])
def test_unusable_references_name_the_image(processor, captions):
    rows = [image_row(1, CAPTIONS[:1]), image_row(42, captions)]
    with pytest.raises(ValueError, match="Image 42 has no usable references"):
        CaptionCollator(processor)(rows)


def truncated_png(path) -> Image.Image:
    """A lazily opened PNG whose pixel data is cut short (noise does not compress, so the cut loses pixels)."""
    pixels = np.random.default_rng(0).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    path.write_bytes(path.read_bytes()[:2000])
    return Image.open(path)


def test_an_image_that_cannot_be_used_names_its_row(processor, tmp_path):
    rows = [image_row(1, CAPTIONS[:1]), image_row(42, CAPTIONS[:1])]
    rows[1]["image"] = truncated_png(tmp_path / "cut.png")
    with pytest.raises(ValueError, match=r"image_id 42.*cut\.png"):
        CaptionCollator(processor)(rows)
    rows = [{"image": np.zeros((16, 16, 3), np.uint8)}, {"image": np.zeros((16, 16, 3), np.int32)}]
    with pytest.raises(ValueError, match=r"row 1 of the batch.*int32"):
        CaptionCollator(processor, tokenize_references=False)(rows)


@pytest.mark.parametrize("column", ["image_features", "pixel_values"])
def test_precomputed_inputs_of_another_shape_name_their_row(processor, column):
    first, second = {"image_features": [(4,), (5,)], "pixel_values": [(3, 16, 16), (3, 8, 8)]}[column]
    rows = [
        {column: np.zeros(shape), "captions": CAPTIONS[:1], "image_id": image_id}
        for image_id, shape in ((7, first), (8, second))
    ]
    message = rf"image_id 8.*{column} of shape {re.escape(str(second))}.*{re.escape(str(first))}"
    with pytest.raises(ValueError, match=message):
        CaptionCollator(processor)(rows)


def test_rows_without_an_image_column_are_rejected(processor):
    with pytest.raises(ValueError, match="no image column"):
        CaptionCollator(processor)([{"captions": ["a red circle"], "image_id": 1}])


# ----------------------------------------------------------------------------------------------------------------
# Any captioner's processor: references framed by the model's start and end tokens
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", FOREIGN_CAPTIONERS)
def test_references_are_padded_and_framed_by_the_model_tokens(kind):
    model, foreign_processor = make_foreign_captioner(kind, CAPTIONS, image_size=16)
    tokens = captioner_for(model).tokens
    rows = [image_row(1, CAPTIONS[:2]), image_row(2, CAPTIONS[2:])]
    batch = CaptionCollator(foreign_processor, caption_tokens=tokens)(rows)
    input_ids, attention_mask = batch["caption_input_ids"], batch["caption_attention_mask"]
    assert input_ids.shape[0] == len(CAPTIONS)
    lengths = attention_mask.sum(dim=1)
    assert input_ids[:, 0].eq(tokens.start_token_id).all()
    assert input_ids.gather(1, (lengths - 1)[:, None]).eq(tokens.end_token_id).all()
    assert input_ids[attention_mask == 0].eq(tokens.pad_token_id).all()
    # between them, the caption itself: no other special token of the tokenizer
    texts = foreign_processor.batch_decode(input_ids, skip_special_tokens=True)
    assert [text.strip() for text in texts] == CAPTIONS
    inner = [row[1 : length - 1].tolist() for row, length in zip(input_ids, lengths, strict=True)]
    special = set(foreign_processor.tokenizer.all_special_ids)
    assert not any(token in special for caption in inner for token in caption)


def test_a_tokenizer_that_adds_no_special_tokens_still_gets_start_and_end_tokens():
    # GPT-2 has bos = eos = <|endoftext|> but does not add them: XE would otherwise never learn to end a caption
    tokenizer = make_gpt2_tokenizer(CAPTIONS)
    image_processor = ViTImageProcessorPil(size={"height": 16, "width": 16})
    gpt2_processor = TrOCRProcessor(image_processor=image_processor, tokenizer=tokenizer)
    assert tokenizer(CAPTIONS[0])["input_ids"][0] != tokenizer.bos_token_id
    batch = CaptionCollator(gpt2_processor)([image_row(1, CAPTIONS[:2])])
    input_ids, lengths = batch["caption_input_ids"], batch["caption_attention_mask"].sum(dim=1)
    assert input_ids[:, 0].eq(tokenizer.bos_token_id).all()
    assert input_ids.gather(1, (lengths - 1)[:, None]).eq(tokenizer.eos_token_id).all()


def test_a_tokenizer_without_start_or_end_token_is_refused_without_the_model_tokens():
    image_processor = ViTImageProcessorPil(size={"height": 16, "width": 16})
    bert_processor = TrOCRProcessor(image_processor=image_processor, tokenizer=make_bert_tokenizer(CAPTIONS))
    with pytest.raises(ValueError, match=r"BertTokenizer.* has no bos token.*caption_tokens=captioner_for\(model\)"):
        CaptionCollator(bert_processor)
    # images and references as written need no token ids
    batch = CaptionCollator(bert_processor, tokenize_references=False)([image_row(1, CAPTIONS[:2])])
    assert batch["references"] == [CAPTIONS[:2]] and "caption_input_ids" not in batch


def test_truncation_keeps_the_end_token_and_unknown_words(processor):
    tokens = CaptionTokens(start_token_id=1, end_token_id=2, pad_token_id=0)
    batch = CaptionCollator(processor, max_length=4, caption_tokens=tokens)(
        [image_row(1, ["two shapes on a white background", "a red zebra"])]
    )
    unknown = processor.tokenizer.unk_token_id
    vocab = processor.tokenizer.get_vocab()
    assert batch["caption_input_ids"].tolist() == [
        [1, vocab["two"], vocab["shapes"], 2],
        [1, vocab["a"], vocab["red"], 2],
    ]
    batch = CaptionCollator(processor, caption_tokens=tokens)([image_row(1, ["a red zebra"])])
    assert batch["caption_input_ids"].tolist() == [[1, vocab["a"], vocab["red"], unknown, 2]]
    with pytest.raises(ValueError, match="max_length must be >= 2"):
        CaptionCollator(processor, max_length=1)


def test_rows_without_an_image_id_get_no_invented_one(processor):
    # a position in the batch is not an id: rewards cache reference statistics by image_id
    rows = [
        {key: value for key, value in image_row(index, CAPTIONS[:1]).items() if key != "image_id"} for index in (1, 2)
    ]
    batch = CaptionCollator(processor)(rows)
    assert "image_id" not in batch and batch["references"] == [CAPTIONS[:1]] * 2


# ----------------------------------------------------------------------------------------------------------------
# Grids and regions: (N_i, F) features per image, padded with a mask
# ----------------------------------------------------------------------------------------------------------------


def test_regions_of_varying_count_are_padded_and_masked(processor):
    rows = [
        {"image_features": np.full((2, 3), 1.0), "image_boxes": np.full((2, 4), 5.0), "captions": CAPTIONS[:1]},
        {"image_features": np.full((4, 3), 2.0), "image_boxes": np.full((4, 4), 6.0), "captions": CAPTIONS[1:2]},
    ]
    batch = CaptionCollator(processor)(rows)
    assert batch["image_features"].shape == (2, 4, 3) and batch["image_features"].dtype == torch.float32
    assert batch["image_feature_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch["image_feature_mask"].dtype == torch.long
    assert batch["image_features"][0].tolist() == [[1.0] * 3] * 2 + [[0.0] * 3] * 2
    assert torch.equal(batch["image_features"][1], torch.full((4, 3), 2.0))
    assert batch["image_boxes"].shape == (2, 4, 4) and batch["image_boxes"][0, 2:].eq(0).all()


def test_fixed_grids_get_a_full_mask(processor):
    rows = [{"image_features": [[float(i)] * 2] * 3, "captions": CAPTIONS[:1]} for i in range(2)]
    batch = CaptionCollator(processor, tokenize_references=False)(rows)
    assert batch["image_features"].shape == (2, 3, 2)
    assert batch["image_feature_mask"].eq(1).all()


@pytest.mark.parametrize(
    "second, message",
    [
        ({"image_features": np.zeros((2, 5))}, r"image_id 8 has image_features of shape \(2, 5\).*width 3"),
        ({"image_features": np.zeros(3)}, r"image_id 8 has image_features of shape \(3,\)"),
        ({"image_features": np.zeros((0, 3))}, r"image_id 8 has image_features of shape \(0, 3\).*at least one"),
        (
            {"image_features": np.zeros((2, 3)), "image_boxes": np.zeros((1, 4))},
            r"image_id 8 has 1 image_boxes for 2 regions",
        ),
    ],
)
def test_regions_that_cannot_be_padded_name_their_row(processor, second, message):
    rows = [
        {"image_features": np.zeros((2, 3)), "image_boxes": np.zeros((2, 4)), "captions": CAPTIONS[:1], "image_id": 7},
        {"image_boxes": np.zeros((2, 4)), **second, "captions": CAPTIONS[:1], "image_id": 8},
    ]
    with pytest.raises(ValueError, match=message):
        CaptionCollator(processor)(rows)
