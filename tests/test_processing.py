import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoProcessor

import rlcaption.auto  # noqa: F401  (registers CaptionProcessor with AutoProcessor)
from rlcaption.metrics.tokenization import normalize_caption
from rlcaption.processing import SPECIAL_TOKENS, CaptionProcessor

TRAIN_CAPTIONS = [
    ["A red circle.", "A small red circle on the left.", "Two shapes."],
    ["A blue square!", "The square is blue", "two shapes"],
    ["A red square, next to a circle."],
]

TRICKY_CAPTIONS = [
    "A man's hat, on a table.",
    "Two dogs -- playing (outside)!",
    "He can't see the U.S. flag",
    'A "quoted" word and a 3.5 inch screen',
    "  Extra   spaces\tand\nnew lines  ",
    "Close-up of a t-shirt... on sale; 50% off?",
    "ALL CAPS CAPTION",
    "",
]


@pytest.fixture(scope="module")
def processor() -> CaptionProcessor:
    return CaptionProcessor.from_captions(TRAIN_CAPTIONS, image_size=16)


def test_special_token_ids_are_fixed(processor):
    vocab = processor.tokenizer.get_vocab()
    assert [vocab[token] for token in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert processor.tokenizer.pad_token_id == 0
    assert (processor.tokenizer.bos_token_id, processor.tokenizer.eos_token_id) == (1, 2)


def test_vocabulary_is_frequency_ordered_with_alphabetical_ties(processor):
    vocab = processor.tokenizer.get_vocab()
    words = sorted((w for w in vocab if w not in SPECIAL_TOKENS), key=vocab.get)
    # counts by hand: a 5; circle, red, square 3; blue, shapes, the, two 2; the rest 1
    assert words[:8] == ["a", "circle", "red", "square", "blue", "shapes", "the", "two"]
    assert CaptionProcessor.from_captions(TRAIN_CAPTIONS).tokenizer.get_vocab() == vocab  # deterministic


def test_min_count_and_max_vocab_size():
    frequent = CaptionProcessor.from_captions(TRAIN_CAPTIONS, min_count=3).tokenizer.get_vocab()
    assert set(frequent) == {*SPECIAL_TOKENS, "a", "red", "circle", "square"}
    capped = CaptionProcessor.from_captions(TRAIN_CAPTIONS, max_vocab_size=6).tokenizer.get_vocab()
    assert set(capped) == {*SPECIAL_TOKENS, "a", "circle"}
    with pytest.raises(ValueError, match="min_count"):
        CaptionProcessor.from_captions(TRAIN_CAPTIONS, min_count=0)
    with pytest.raises(ValueError, match="no captions"):
        CaptionProcessor.from_captions([])
    with pytest.raises(ValueError, match="Caption 1 is a int"):
        CaptionProcessor.from_captions([["fine", 3]])


def test_encoding_layout_and_unknown_words(processor):
    batch = processor(text=["A red circle.", "A purple square"])
    vocab = processor.tokenizer.get_vocab()
    expected = [
        [1, vocab["a"], vocab["red"], vocab["circle"], 2],
        [1, vocab["a"], vocab["<unk>"], vocab["square"], 2],
    ]
    assert batch["input_ids"].tolist() == expected
    assert batch["attention_mask"].tolist() == [[1] * 5, [1] * 5]
    padded = processor(text=["A circle", "a red square on the left"])
    assert padded["input_ids"][0].tolist() == [1, vocab["a"], vocab["circle"], 2, 0, 0, 0, 0]
    assert padded["attention_mask"][0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]


def test_words_equal_the_metrics_normalisation_on_tricky_captions():
    processor = CaptionProcessor.from_captions(TRICKY_CAPTIONS)
    encoded = processor(text=TRICKY_CAPTIONS, padding=False, return_tensors=None)["input_ids"]
    for caption, ids in zip(TRICKY_CAPTIONS, encoded, strict=True):
        words = processor.tokenizer.convert_ids_to_tokens(ids)[1:-1]
        assert words == normalize_caption(caption).split(), caption
        assert "<unk>" not in words  # every training word is in the vocabulary
        assert processor.decode(ids) == normalize_caption(caption)


def test_truncation_keeps_bos_and_eos(processor):
    ids = processor(text=["a small red circle on the left"], max_length=4)["input_ids"][0].tolist()
    assert len(ids) == 4 and ids[0] == 1 and ids[-1] == 2


def test_decode_stops_at_first_eos_and_skips_special_tokens(processor):
    vocab = processor.tokenizer.get_vocab()
    ids = torch.tensor([[1, vocab["a"], vocab["red"], 2, vocab["circle"], 0], [1, vocab["blue"], 3, 0, 0, 0]])
    assert processor.batch_decode(ids) == ["a red", "blue"]
    assert processor.batch_decode(ids, skip_special_tokens=False)[0] == "<bos> a red <eos>"


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("clean_up_tokenization_spaces", [None, True])
def test_batch_decoding_equals_the_tokenizer_decoding_each_caption(
    processor, skip_special_tokens, clean_up_tokenization_spaces
):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(processor.tokenizer), (200, 12), generator=generator)  # specials anywhere
    ids[:, 0] = 1
    eos = processor.tokenizer.eos_token_id
    # repeated captions, as rollouts repeat, also with other tokens after their end token: decoded once, each row
    # gets its text
    changed_after_end = ids[:100].clone()
    changed_after_end[:, -1] = (changed_after_end[:, -1] + 1) % len(processor.tokenizer)
    ids = torch.cat([ids, ids[::4], changed_after_end])
    expected = []
    for row in ids.tolist():
        cut = row[: row.index(eos, 1) + 1] if eos in row[1:] else row
        expected.append(
            processor.tokenizer.decode(
                cut, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=clean_up_tokenization_spaces
            )
        )
    kwargs = {} if clean_up_tokenization_spaces is None else {"clean_up_tokenization_spaces": True}
    decoded = processor.batch_decode(ids, skip_special_tokens=skip_special_tokens, **kwargs)
    assert decoded == expected
    assert sum(eos in row[1:] for row in ids.tolist()) > 50  # many captions were cut at their end token


def test_save_load_round_trip(tmp_path, processor):
    processor.save_pretrained(tmp_path)
    for loaded in (CaptionProcessor.from_pretrained(tmp_path), AutoProcessor.from_pretrained(tmp_path)):
        assert isinstance(loaded, CaptionProcessor)
        assert loaded.tokenizer.get_vocab() == processor.tokenizer.get_vocab()
        image = Image.new("RGB", (20, 30), (10, 200, 30))
        original = processor(images=[image], text=TRICKY_CAPTIONS)
        reloaded = loaded(images=[image], text=TRICKY_CAPTIONS)
        for key in ("pixel_values", "input_ids", "attention_mask"):
            torch.testing.assert_close(reloaded[key], original[key], rtol=0, atol=0)


def _pixels(processor, image) -> torch.Tensor:
    return processor(images=image)["pixel_values"][0]


def test_image_values_are_resized_rescaled_and_normalised(processor):
    pixels = _pixels(processor, Image.new("RGB", (40, 24), (255, 0, 51)))
    assert pixels.shape == (3, 16, 16)
    # (value / 255 - 0.5) / 0.5
    torch.testing.assert_close(pixels[:, 5, 5], torch.tensor([1.0, -1.0, -0.6]))


def test_image_modes_are_converted_to_rgb(processor):
    red = _pixels(processor, Image.new("RGB", (16, 16), (255, 0, 0)))
    white = _pixels(processor, Image.new("RGB", (16, 16), (255, 255, 255)))
    gray = _pixels(processor, Image.new("RGB", (16, 16), (128, 128, 128)))
    transparent = Image.new("RGBA", (16, 16), (255, 0, 0, 0))
    torch.testing.assert_close(_pixels(processor, transparent), white)  # composited on white
    torch.testing.assert_close(_pixels(processor, Image.new("RGBA", (16, 16), (255, 0, 0, 255))), red)
    torch.testing.assert_close(_pixels(processor, Image.new("L", (16, 16), 128)), gray)
    torch.testing.assert_close(_pixels(processor, Image.new("LA", (16, 16), (0, 0))), white)
    torch.testing.assert_close(_pixels(processor, Image.new("CMYK", (16, 16), (0, 255, 255, 0))), red)
    torch.testing.assert_close(_pixels(processor, Image.new("RGB", (16, 16), (255, 0, 0)).convert("P")), red)
    sixteen_bit = Image.fromarray(np.full((16, 16), 128 * 257, dtype=np.uint16))
    assert sixteen_bit.mode.startswith("I;16")
    torch.testing.assert_close(_pixels(processor, sixteen_bit), gray)
    torch.testing.assert_close(_pixels(processor, Image.new("1", (16, 16), 1)), white)


def test_arrays_and_tensors_in_either_channel_layout(processor):
    red = _pixels(processor, Image.new("RGB", (16, 16), (255, 0, 0)))
    hwc = np.zeros((16, 16, 3), dtype=np.uint8)
    hwc[..., 0] = 255
    torch.testing.assert_close(_pixels(processor, hwc), red)
    torch.testing.assert_close(_pixels(processor, torch.from_numpy(hwc).permute(2, 0, 1).float() / 255), red)
    torch.testing.assert_close(
        _pixels(processor, np.full((16, 16), 128, dtype=np.uint8)), _pixels(processor, Image.new("L", (16, 16), 128))
    )
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        processor(images=np.full((16, 16, 3), 7.0))
    with pytest.raises(ValueError, match="Unsupported image type"):
        processor(images="image.png")


def test_images_from_a_dataset_column_and_other_sequences(processor):
    images = [Image.new("RGB", (20, 12), (255, 0, 0)), Image.new("RGB", (20, 12), (0, 0, 255))]
    dataset = datasets.Dataset.from_dict({"image": images}, features=datasets.Features({"image": datasets.Image()}))
    column = dataset["image"]
    assert not isinstance(column, (list, tuple))  # datasets' lazily decoded Column
    expected = processor(images=images)["pixel_values"]
    assert expected.shape == (2, 3, 16, 16)
    arrays = np.stack([np.asarray(image) for image in images])  # (2, H, W, 3): a batch, not one image
    batches = {
        "Column": column,
        "tuple": tuple(images),
        "generator": (image for image in images),
        "array batch": arrays,
        "tensor batch": torch.from_numpy(arrays).permute(0, 3, 1, 2),
        "list of arrays": list(arrays),
    }
    for kind, batch in batches.items():
        torch.testing.assert_close(processor(images=batch)["pixel_values"], expected, rtol=0, atol=0, msg=kind)


def test_unsupported_images_name_the_bad_value(processor):
    with pytest.raises(ValueError, match="Unsupported image type str"):
        processor(images="image.png")
    with pytest.raises(ValueError, match="Unsupported image type str"):
        processor(images=["image.png"])
    with pytest.raises(ValueError, match="Unsupported image type dict"):
        processor(images={"path": "image.png", "bytes": None})
    with pytest.raises(ValueError, match="empty batch of images"):
        processor(images=[])


def test_image_errors_name_the_image_of_the_batch(processor, tmp_path):
    good = Image.new("RGB", (20, 20))
    with pytest.raises(ValueError, match=r"Image 1 of the batch \(int32 array of shape \(16, 16, 3\)\).*uint8"):
        processor(images=[np.zeros((16, 16, 3), np.uint8), np.zeros((16, 16, 3), np.int32)])
    with pytest.raises(ValueError, match=r"Image 2 of the batch.*Unsupported image type str"):
        processor(images=[good, good, "image.png"])
    path = tmp_path / "cut.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, size=(64, 64, 3), dtype=np.uint8)).save(path)
    path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(ValueError, match=r"Image 1 of the batch \(image file .*cut\.png\).*truncated or corrupt"):
        processor(images=[good, Image.open(path)])


def test_very_large_image_is_reduced_before_resizing(processor):
    large = Image.new("RGB", (4000, 3000), (0, 0, 255))
    blue = _pixels(processor, Image.new("RGB", (16, 16), (0, 0, 255)))
    torch.testing.assert_close(_pixels(processor, large), blue)
