"""Tiny CLIPs with random weights for fast tests: a ShapesCLIP, a transformers CLIPModel, and a stub with known
embeddings."""

import numpy as np
import torch
from torch import nn
from transformers import CLIPConfig, CLIPModel
from transformers.modeling_outputs import BaseModelOutputWithPooling

from rlcaption.models import ShapesCLIPConfig, ShapesCLIPModel
from rlcaption.processing import CaptionProcessor

CAPTIONS = [
    "a red circle",
    "a blue square left of a green star",
    "two shapes on a white background",
    "a small yellow triangle above a large purple hexagon",
]


def make_processor(image_size: int = 16) -> CaptionProcessor:
    return CaptionProcessor.from_captions(CAPTIONS, image_size=image_size)


def make_shapes_clip(processor: CaptionProcessor, image_size: int = 16, seed: int = 0) -> ShapesCLIPModel:
    torch.manual_seed(seed)
    tokenizer = processor.tokenizer
    config = ShapesCLIPConfig(
        vocab_size=len(tokenizer),
        word_embedding_size=8,
        text_hidden_size=8,
        image_size=image_size,
        cnn_channels=[4, 8],
        projection_dim=8,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return ShapesCLIPModel(config).eval()


def save_reward_clip(folder, captions: list[str], seed: int = 1) -> str:
    """A tiny random shapes CLIP over the words of `captions`, saved in `folder` with its own processor, as the
    `reward_clip` option names one; returns the folder."""
    clip_processor = CaptionProcessor.from_captions(captions, image_size=16)
    make_shapes_clip(clip_processor, image_size=16, seed=seed).save_pretrained(folder)
    clip_processor.save_pretrained(folder)
    return str(folder)


def make_transformers_clip(processor: CaptionProcessor, image_size: int = 16, seed: int = 0) -> CLIPModel:
    """OpenAI CLIP's architecture in miniature (ViT and text transformer), over the processor's word vocabulary."""
    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(processor.tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=32),
        vision_config=dict(image_size=image_size, patch_size=8, hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=2),
        projection_dim=8,
    )  # fmt: skip
    return CLIPModel(config).eval()


def random_images(count: int, side: int = 16, seed: int = 0) -> list[np.ndarray]:
    """`count` random uint8 RGB images `(side, side, 3)`."""
    generator = np.random.default_rng(seed)
    return [generator.integers(0, 256, (side, side, 3), dtype=np.uint8) for _ in range(count)]


class StubCLIP(nn.Module):
    """A "CLIP" with chosen embeddings: image i embeds as `image_vectors[i]`, a text as `text_vectors[text]`.

    Images are identified by the value of their top-left red pixel (`index`), texts by their string; the matching
    [`StubProcessor`] passes both through.
    """

    def __init__(self, image_vectors: list[list[float]], text_vectors: dict[str, list[float]]):
        super().__init__()
        self.image_vectors = torch.tensor(image_vectors, dtype=torch.float32)
        self.texts = list(text_vectors)
        self.text_vectors = torch.tensor(list(text_vectors.values()), dtype=torch.float32)
        self.dummy = nn.Parameter(torch.zeros(()))  # so the stub has a device
        self.image_calls = 0

    def get_image_features(self, pixel_values):
        self.image_calls += len(pixel_values)
        return BaseModelOutputWithPooling(pooler_output=self.image_vectors[pixel_values[:, 0, 0, 0].long()])

    def get_text_features(self, input_ids, attention_mask=None):
        return BaseModelOutputWithPooling(pooler_output=self.text_vectors[input_ids[:, 0]])


class StubProcessor:
    """Images -> `(N, 3, 1, 1)` holding each image's index; texts -> their row in `StubCLIP.texts`."""

    def __init__(self, texts: list[str]):
        self.texts = texts

    def __call__(self, images=None, text=None, padding=True, return_tensors="pt"):
        batch = {}
        if images is not None:
            batch["pixel_values"] = torch.tensor([[[[float(np.asarray(image)[0, 0, 0])]]] * 3 for image in images])
        if text is not None:
            batch["input_ids"] = torch.tensor([[self.texts.index(t)] for t in text])
            batch["attention_mask"] = torch.ones_like(batch["input_ids"])
        return batch


def indexed_images(count: int) -> list[np.ndarray]:
    """Images the stub recognises: image i has i in its top-left red pixel."""
    images = []
    for index in range(count):
        image = np.zeros((2, 2, 3), dtype=np.uint8)
        image[0, 0, 0] = index
        images.append(image)
    return images
