import numpy as np
import pytest
import torch
from PIL import Image

from rlcaption.data.images import check_image_files, convert_to_rgb, open_image
from rlcaption.processing import CaptionProcessor


def _save(image: Image.Image, path) -> str:
    image.save(path)
    return str(path)


def _truncate(path, keep_fraction: float = 0.6) -> str:
    data = open(path, "rb").read()
    with open(path, "wb") as file:
        file.write(data[: int(len(data) * keep_fraction)])
    return str(path)


def _noisy_rgb(width: int, height: int, seed: int = 0) -> Image.Image:
    # noise does not compress, so a truncated file really lacks pixel data
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, mode="RGB")


def test_rgb_is_returned_unchanged():
    image = Image.new("RGB", (4, 4), (1, 2, 3))
    assert convert_to_rgb(image) is image


@pytest.mark.parametrize("mode, value, expected", [("L", 77, (77, 77, 77)), ("1", 1, (255, 255, 255))])
def test_grayscale_is_replicated(mode, value, expected):
    rgb = convert_to_rgb(Image.new(mode, (3, 2), value))
    assert rgb.mode == "RGB" and rgb.size == (3, 2)
    assert rgb.getpixel((0, 0)) == expected


def test_rgba_is_composited_on_white():
    pixels = np.zeros((1, 3, 4), dtype=np.uint8)
    pixels[0, 0] = (200, 40, 10, 0)  # fully transparent -> white
    pixels[0, 1] = (200, 40, 10, 255)  # opaque -> itself
    pixels[0, 2] = (200, 40, 10, 102)  # 40% opaque: 0.4 * colour + 0.6 * 255
    rgb = np.asarray(convert_to_rgb(Image.fromarray(pixels, mode="RGBA")))
    assert tuple(rgb[0, 0]) == (255, 255, 255)
    assert tuple(rgb[0, 1]) == (200, 40, 10)
    expected = [0.4 * channel + 0.6 * 255 for channel in (200, 40, 10)]
    assert np.allclose(rgb[0, 2], expected, atol=1)


def test_gray_with_alpha_and_custom_background():
    image = Image.new("LA", (2, 2), (0, 0))
    assert convert_to_rgb(image, background=(10, 20, 30)).getpixel((1, 1)) == (10, 20, 30)


def test_palette_with_and_without_transparency():
    palette_image = Image.new("P", (2, 1), 0)
    palette_image.putpalette([255, 0, 0, 0, 0, 255] + [0, 0, 0] * 254)
    palette_image.putpixel((1, 0), 1)
    assert convert_to_rgb(palette_image).getpixel((0, 0)) == (255, 0, 0)
    assert convert_to_rgb(palette_image).getpixel((1, 0)) == (0, 0, 255)
    palette_image.info["transparency"] = 0
    rgb = convert_to_rgb(palette_image)
    assert rgb.getpixel((0, 0)) == (255, 255, 255) and rgb.getpixel((1, 0)) == (0, 0, 255)


def test_cmyk():
    # pure magenta + yellow ink is red; no ink is white
    image = Image.new("CMYK", (2, 1), (0, 255, 255, 0))
    image.putpixel((1, 0), (0, 0, 0, 0))
    rgb = convert_to_rgb(image)
    assert rgb.getpixel((0, 0)) == (255, 0, 0) and rgb.getpixel((1, 0)) == (255, 255, 255)


def test_sixteen_bit_png_is_rescaled(tmp_path):
    values = np.array([[0, 257 * 100, 65535]], dtype=np.uint16)
    path = _save(Image.fromarray(values), tmp_path / "deep.png")
    assert Image.open(path).mode.startswith("I")
    rgb = np.asarray(open_image(path))
    assert rgb[0, :, 0].tolist() == [0, 100, 255] and (rgb[..., 0] == rgb[..., 2]).all()


def test_thirty_two_bit_integer_and_float_modes():
    integer_image = Image.fromarray(np.array([[0, 257 * 10, 65535]], dtype=np.int32))
    assert integer_image.mode == "I"
    assert np.asarray(convert_to_rgb(integer_image))[0, :, 1].tolist() == [0, 10, 255]
    float_image = Image.fromarray(np.array([[-5.0, 12.4, 300.0]], dtype=np.float32))
    assert float_image.mode == "F"
    assert np.asarray(convert_to_rgb(float_image))[0, :, 0].tolist() == [0, 12, 255]


@pytest.mark.parametrize("suffix", ["png", "jpg"])
def test_truncated_file_error_names_the_file(tmp_path, suffix):
    path = _truncate(_save(_noisy_rgb(64, 64), tmp_path / f"cut.{suffix}"))
    with pytest.raises(ValueError, match=f"cut.{suffix}.*truncated or corrupt"):
        open_image(path)
    with pytest.raises(ValueError, match=f"cut.{suffix}"):
        convert_to_rgb(Image.open(path))


def test_not_an_image(tmp_path):
    path = tmp_path / "notes.png"
    path.write_bytes(b"this is not an image")
    with pytest.raises(ValueError, match="notes.png"):
        open_image(path)
    with pytest.raises(FileNotFoundError, match="absent.png"):
        open_image(tmp_path / "absent.png")


def test_decompression_bomb_becomes_a_clear_error(tmp_path, monkeypatch):
    path = _save(Image.new("RGB", (40, 40)), tmp_path / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)  # 1600 pixels > 2 * 500: refused as a bomb
    with pytest.raises(ValueError, match=r"huge.png.*MAX_IMAGE_PIXELS"):
        open_image(path)
    with pytest.raises(ValueError, match=r"huge.png.*MAX_IMAGE_PIXELS"):
        check_image_files([path], verify=True)


@pytest.mark.parametrize("suffix", ["png", "jpg"])
def test_big_images_are_downscaled_keeping_aspect_ratio(tmp_path, suffix):
    path = _save(Image.new("RGB", (800, 400), (0, 128, 0)), tmp_path / f"big.{suffix}")
    image = open_image(path, max_size=100)
    assert image.size == (100, 50) and image.mode == "RGB"
    assert np.allclose(np.asarray(image)[25, 50], (0, 128, 0), atol=3)
    assert open_image(path).size == (800, 400)
    assert open_image(path, max_size=1000).size == (800, 400)


def test_check_image_files_reports_all_missing_files_at_once(tmp_path):
    present = [_save(Image.new("RGB", (4, 4)), tmp_path / f"ok{i}.png") for i in range(2)]
    missing = [str(tmp_path / "images" / f"missing{i}.png") for i in range(7)]
    with pytest.raises(FileNotFoundError) as error:
        check_image_files(present + missing)
    message = str(error.value)
    assert "7 of 9 image files are missing" in message
    assert all(path in message for path in missing[:5]) and missing[5] not in message
    assert "and 2 more" in message
    check_image_files(present)


def test_check_image_files_verify_finds_undecodable_files(tmp_path):
    good = [_save(_noisy_rgb(32, 32, seed), tmp_path / f"good{seed}.jpg") for seed in range(3)]
    truncated_jpeg = _truncate(_save(_noisy_rgb(64, 64), tmp_path / "cut.jpg"))
    truncated_png = _truncate(_save(_noisy_rgb(64, 64), tmp_path / "cut.png"))
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"\x89PNG not really")
    paths = good + [truncated_jpeg, truncated_png, str(garbage)]
    check_image_files(paths)  # they all exist
    with pytest.raises(ValueError) as error:
        check_image_files(paths, verify=True)
    message = str(error.value)
    assert "3 of 6 image files cannot be decoded" in message
    assert "cut.jpg" in message and "cut.png" in message and "garbage.png" in message
    assert "good0.jpg" not in message
    check_image_files(good, verify=True)


# ------------------------------------------------------------------------------------------------------------------
# One conversion for every mode, checked against values worked out by hand
# ------------------------------------------------------------------------------------------------------------------

RED, BLUE, WHITE, BLACK = (255, 0, 0), (0, 0, 255), (255, 255, 255), (0, 0, 0)
RED_BLUE_PALETTE = [*RED, *BLUE] + [0, 0, 0] * 254


def _gray(*values: int) -> list[tuple[int, int, int]]:
    return [(value, value, value) for value in values]


def _row(mode: str, pixels: list, palette: list[int] | None = None, **info) -> Image.Image:
    """A one-row image of `mode` holding `pixels`; `info` adds e.g. the `transparency` of a PNG tRNS chunk."""
    image = Image.new(mode, (len(pixels), 1))
    if palette is not None:
        image.putpalette(palette)
    image.putdata(pixels)
    image.info.update(info)
    return image


def _mode_cases() -> dict[str, tuple[Image.Image, list[tuple[int, int, int]]]]:
    """Images of every mode with the RGB each pixel must become."""
    big_endian = np.array([[0, 1000, 257 * 100, 65535]], dtype=">u2")
    return {
        # 16-bit: value / 257 (65535 -> 255); 1000 / 257 = 3.89 -> 4
        "I;16": (Image.fromarray(np.array([[0, 1000, 257 * 100, 65535]], dtype=np.uint16)), _gray(0, 4, 100, 255)),
        "I;16B": (Image.frombytes("I;16B", (4, 1), big_endian.tobytes()), _gray(0, 4, 100, 255)),
        # 32-bit integers follow the 16-bit convention, clipped: 70000 -> 255, -5 -> 0
        "I": (
            Image.fromarray(np.array([[0, 257 * 100, 65535, 70000, -5]], dtype=np.int32)),
            _gray(0, 100, 255, 255, 0),
        ),
        # the scale is the mode's, not the image's: small 16-bit values are a dark image (255 / 257 = 0.99 -> 1)
        "I, only small values": (Image.fromarray(np.array([[0, 51, 255]], dtype=np.int32)), _gray(0, 0, 1)),
        # float in [0, 1] (maximum <= 1): value * 255; 0.2 -> 51, 0.6 -> 153
        "F in [0, 1]": (Image.fromarray(np.array([[0.0, 0.2, 0.6, 1.0]], dtype=np.float32)), _gray(0, 51, 153, 255)),
        # float with a maximum above 1: already on the 0-255 scale, rounded and clipped
        "F in [0, 255]": (
            Image.fromarray(np.array([[-5.0, 12.4, 128.0, 300.0]], dtype=np.float32)),
            _gray(0, 12, 128, 255),
        ),
        # alpha a on white: value * a / 255 + 255 * (1 - a / 255); a = 51 (20%) -> 20 + 204, a = 102 -> 40 + 153
        "LA": (_row("LA", [(100, 0), (100, 255), (100, 51), (100, 102)]), _gray(255, 100, 224, 193)),
        # (200, 40, 10) at 20%: (40 + 204, 8 + 204, 2 + 204)
        "RGBA": (
            _row("RGBA", [(200, 40, 10, 0), (200, 40, 10, 255), (200, 40, 10, 51)]),
            [WHITE, (200, 40, 10), (244, 212, 206)],
        ),
        # blue at 20% on white: (0 + 204, 0 + 204, 51 + 204)
        "PA": (_row("PA", [(0, 255), (1, 0), (1, 51)], RED_BLUE_PALETTE), [RED, WHITE, (204, 204, 255)]),
        "P, transparent index": (_row("P", [0, 1], RED_BLUE_PALETTE, transparency=0), [WHITE, BLUE]),
        "P, alpha per palette entry": (
            _row("P", [0, 1], RED_BLUE_PALETTE, transparency=bytes([255, 51])),
            [RED, (204, 204, 255)],
        ),
        "L, transparent value": (_row("L", [5, 6], transparency=5), [WHITE, (6, 6, 6)]),
        "RGB, transparent colour": (_row("RGB", [(1, 2, 3), (4, 5, 6)], transparency=(1, 2, 3)), [WHITE, (4, 5, 6)]),
        # (255 - c) * (255 - k) / 255 per channel: 127 * 239 / 255 = 119.03, 191 * 239 / 255 = 179.01,
        # 223 * 239 / 255 = 208.99
        "CMYK": (
            _row("CMYK", [(0, 255, 255, 0), (0, 0, 0, 0), (0, 0, 0, 255), (128, 64, 32, 16)]),
            [RED, WHITE, BLACK, (119, 179, 209)],
        ),
    }


MODE_CASES = _mode_cases()


@pytest.mark.parametrize("case", list(MODE_CASES))
def test_every_mode_converts_to_the_rgb_computed_by_hand(case):
    image, expected = MODE_CASES[case]
    rgb = convert_to_rgb(image.copy())
    assert rgb.mode == "RGB" and rgb.size == image.size
    assert [tuple(pixel) for pixel in np.asarray(rgb)[0].tolist()] == expected


@pytest.mark.parametrize("scale", [1, 128], ids=["small", "box-reduced"])
@pytest.mark.parametrize("case", list(MODE_CASES))
def test_processor_converts_every_mode_like_convert_to_rgb(case, scale):
    # at scale 128 the processor box-reduces the image before resizing: the conversion must not depend on that
    processor = CaptionProcessor.from_captions(["a red circle"], image_size=16)
    image, expected = MODE_CASES[case]
    size = (image.width * scale, scale)
    rgb = Image.new("RGB", (len(expected), 1))
    rgb.putdata(expected)
    pixels = processor(images=image.resize(size, Image.Resampling.NEAREST))["pixel_values"]
    expected_pixels = processor(images=rgb.resize(size, Image.Resampling.NEAREST))["pixel_values"]
    torch.testing.assert_close(pixels, expected_pixels, rtol=0, atol=0)


@pytest.mark.parametrize(
    "mode, first, second",
    [("CMYK", (255, 0, 0, 0), (0, 0, 0, 255)), ("LA", (0, 255), (255, 0)), ("PA", (0, 255), (1, 255))],
)
def test_processor_averages_pixels_in_rgb_when_box_reducing(mode, first, second):
    # averaging ink, alpha or palette indices is not averaging colours: a reduction must act on the RGB pixels
    processor = CaptionProcessor.from_captions(["a red circle"], image_size=16)
    checkerboard = _row(mode, [first, second] * 64, RED_BLUE_PALETTE if mode == "PA" else None).resize(
        (128, 128), Image.Resampling.NEAREST
    )
    assert checkerboard.getpixel((0, 0)) != checkerboard.getpixel((1, 0))
    expected = processor(images=convert_to_rgb(checkerboard.copy()))["pixel_values"]
    torch.testing.assert_close(processor(images=checkerboard)["pixel_values"], expected, rtol=0, atol=0)
