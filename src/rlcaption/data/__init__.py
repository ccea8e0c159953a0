"""Datasets: the embedded synthetic shapes dataset, COCO / Flickr loaders, image handling, feature extraction."""

from .shapes import load_shapes

__all__ = ["load_shapes"]
