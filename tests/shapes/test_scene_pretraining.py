import pytest
import torch

from rlcaption.data import load_shapes
from rlcaption.models.show_tell_rl.encoders import ConvImageEncoder
from rlcaption.processing import CaptionProcessor
from rlcaption.shapes.dataset import COLORS, SHAPES
from rlcaption.shapes.scene_pretraining import pretrain_image_encoder_on_scenes, scene_cell_labels


def test_scene_cell_labels_by_hand():
    scene = [
        {"shape": "star", "color": "blue", "size": "large", "row": 0, "column": 2},
        {"shape": "circle", "color": "red", "size": "small", "row": 2, "column": 1},
    ]
    labels = scene_cell_labels([scene])
    assert labels.shape == (1, 9, 3)
    expected = torch.zeros(9, 3, dtype=torch.long)
    expected[2] = torch.tensor([1 + SHAPES.index("star"), 1 + list(COLORS).index("blue"), 2])
    expected[7] = torch.tensor([1 + SHAPES.index("circle"), 1 + list(COLORS).index("red"), 1])
    assert torch.equal(labels[0], expected)
    with pytest.raises(ValueError, match="unknown shape 'blob'"):
        scene_cell_labels([[{**scene[0], "shape": "blob"}]])


@pytest.fixture(scope="module")
def shapes_and_processor(tmp_path_factory):
    shapes = load_shapes(
        num_train=200, num_validation=1, num_test=1, image_size=48, cache_dir=tmp_path_factory.mktemp("s")
    )
    processor = CaptionProcessor.from_captions(["a red circle"], image_size=48)
    return shapes, processor


def test_pretraining_teaches_the_grid_the_cells_objects(shapes_and_processor):
    shapes, processor = shapes_and_processor
    torch.manual_seed(0)
    encoder = ConvImageEncoder(48, 3, [8, 16, 16, 16])  # 3x3 grid at 48 px
    before = {name: value.clone() for name, value in encoder.state_dict().items()}
    untrained = pretrain_image_encoder_on_scenes(encoder, processor, shapes["train"], num_steps=0)
    trained = pretrain_image_encoder_on_scenes(encoder, processor, shapes["train"], num_steps=150, batch_size=32)
    assert any(not torch.equal(before[name], value) for name, value in encoder.state_dict().items())
    # 6 shapes and 7 colours are at 1/6 and 1/7 by chance; a short run already moves both well above
    assert trained["color_accuracy"] > untrained["color_accuracy"] + 0.2, (untrained, trained)
    assert trained["shape_accuracy"] > untrained["shape_accuracy"] + 0.1, (untrained, trained)
    assert all(0.0 <= trained[key] <= 1.0 for key in ("shape_accuracy", "color_accuracy", "size_accuracy"))


def test_pretraining_needs_a_three_by_three_grid(shapes_and_processor):
    shapes, processor = shapes_and_processor
    with pytest.raises(ValueError, match="3x3"):
        pretrain_image_encoder_on_scenes(ConvImageEncoder(48, 3, [8, 8, 8]), processor, shapes["train"], num_steps=1)
    with pytest.raises(ValueError, match="scene"):
        pretrain_image_encoder_on_scenes(
            ConvImageEncoder(48, 3, [8, 8, 8, 8]), processor, shapes["train"].remove_columns("scene"), num_steps=1
        )
