"""Datasets: the embedded synthetic shapes dataset, COCO / Flickr loaders, image handling, feature extraction,
released region features."""

from ..shapes.dataset import load_shapes
from .coco import load_caption_imagefolder, load_coco, load_karpathy
from .collator import CaptionCollator
from .features import extract_features
from .image_checks import check_dataset_images
from .images import check_image_files, convert_to_rgb, find_undecodable_images, open_image
from .loading import load_caption_dataset, save_dataset_referencing_images
from .regions import BottomUpTSVRegions, RegionFeatureFolder, add_region_features, open_region_features

__all__ = [
    "BottomUpTSVRegions",
    "CaptionCollator",
    "RegionFeatureFolder",
    "add_region_features",
    "check_dataset_images",
    "check_image_files",
    "convert_to_rgb",
    "extract_features",
    "find_undecodable_images",
    "load_caption_dataset",
    "load_caption_imagefolder",
    "load_coco",
    "load_karpathy",
    "load_shapes",
    "open_image",
    "open_region_features",
    "save_dataset_referencing_images",
]
