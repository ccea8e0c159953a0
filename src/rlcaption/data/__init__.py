"""Datasets: the embedded synthetic shapes dataset, COCO / Flickr loaders, image handling, feature extraction."""

from .coco import load_caption_imagefolder, load_coco, load_karpathy
from .features import extract_features
from .images import check_image_files, convert_to_rgb, open_image
from .shapes import load_shapes

__all__ = [
    "check_image_files",
    "convert_to_rgb",
    "extract_features",
    "load_caption_imagefolder",
    "load_coco",
    "load_karpathy",
    "load_shapes",
    "open_image",
]
