import numpy as np
import pytest
from PIL import Image

from rlcaption.data.images import check_image_files, convert_to_rgb, open_image


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
