"""
The shapes benchmark: an embedded synthetic dataset of scenes ([`load_shapes`]) on which every method trains on a
laptop CPU in minutes, and the scene grounding of its captions ([`scene_grounding`]: are the objects, sizes and
relations a caption states true of its image?). Beside them, in their own modules: the scene pretraining of an image
encoder (`scene_pretraining`), the demo (`demo`, `demo_report`, `gallery`) and the shapes CLIPs' model card
(`clip_model_card`).
"""

from .dataset import SceneObject, describe_scene, load_shapes, most_specific_reference, render_scene
from .grounding import SCENE_GROUNDING_KEYS, ground_caption, parse_shapes_caption, scene_grounding

__all__ = [
    "SCENE_GROUNDING_KEYS",
    "SceneObject",
    "describe_scene",
    "ground_caption",
    "load_shapes",
    "most_specific_reference",
    "parse_shapes_caption",
    "render_scene",
    "scene_grounding",
]
