"""Image encoders shared by the captioning models, and the LSTM they decode with ([`MixedPrecisionLSTM`]).

Every encoder maps one batch of images to one feature vector per image, `(batch_size, output_size)`; the image
encoders can also return the spatial grid of features that vector came from (`forward_with_grid`), which attention
decoders read at every step:

- [`ConvImageEncoder`]: a small convolutional network trained from scratch, sized for the synthetic shapes data
  (64x64 images). It keeps the spatial layout (the last feature map is flattened, not pooled) because captions
  such as "a red circle left of a blue square" depend on where things are.
- [`BackboneImageEncoder`]: any `transformers` vision model (ViT, ResNet, ConvNeXt, CLIP vision, ...) built from a
  config dict or loaded from a hub id / local path; its pooled output is the feature. It can be frozen.
- [`PrecomputedFeatureEncoder`]: features extracted beforehand (`rlcaption extract-features`, or released region
  features) pass through unchanged, so training never runs the vision model: pooled vectors, or fixed grids and
  variable-count regions with a padding mask, pooled by their masked mean and kept as the grid for attention. Given
  `pixel_values` instead, it runs the backbone that extracted the features (when the config records it), so that a
  captioner trained on features captions photos.

The encoder types (`ENCODER_TYPES`), the config fields that choose and size an encoder ([`ImageEncoderConfigMixin`],
built by `build_image_encoder`), the image inputs each encoder reads (`image_encoder_arguments`) and the pooling of a
vision model's output into one vector per image or its grid (`pool_image_features`, also what feature extraction
stores) are defined here and nowhere else: the captioner, the value network, the listener, the visual-semantic
embedding and the shapes CLIP all take their image encoder from here.

The module sits in the captioner's folder and imports only `torch` and `transformers`: the captioner's files import it
relatively, so `save_pretrained` copies it beside them for `trust_remote_code` loading, unchanged.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel
from transformers import initialization as init
from transformers.utils import logging

__all__ = [
    "ENCODER_TYPES",
    "IMAGE_ENCODER_DEFAULTS",
    "IMAGE_ENCODER_TYPES",
    "IMAGE_FEATURE_LAYOUTS",
    "POOLING_MODES",
    "BackboneImageEncoder",
    "ConvImageEncoder",
    "ImageEncoderConfigMixin",
    "MixedPrecisionLSTM",
    "PrecomputedFeatureEncoder",
    "build_image_encoder",
    "check_cnn_fields",
    "cpu_runs_lstm_in",
    "encode_images_with_backbone",
    "image_encoder_arguments",
    "init_cnn_and_gru_weights",
    "pool_image_features",
]

logger = logging.get_logger(__name__)

# The encoders that read pixels; a model that must embed pixels itself (a CLIP) accepts only these.
IMAGE_ENCODER_TYPES = ("cnn", "backbone")
# Every `encoder_type` of a captioning config: the image encoders, then precomputed features.
ENCODER_TYPES = (*IMAGE_ENCODER_TYPES, "features")
# How precomputed features hold an image: one pooled vector, or a grid / regions of vectors (with a padding mask).
IMAGE_FEATURE_LAYOUTS = ("pooled", "grid")
# How `pool_image_features` reduces a vision model's output: one vector per image, or the grid of positions kept.
POOLING_MODES = ("auto", "none")


def _num_groups(num_channels: int, max_groups: int = 8) -> int:
    """The largest number of GroupNorm groups, at most `max_groups`, that divides `num_channels`."""
    return next(groups for groups in range(min(max_groups, num_channels), 0, -1) if num_channels % groups == 0)


class ConvImageEncoder(nn.Module):
    """Conv blocks (3x3 conv, GroupNorm, ReLU, 2x2 max-pool) followed by flattening of the last feature map.

    Args:
        image_size (`int`): side of the square input images; must be divisible by `2 ** len(channels)`.
        num_channels (`int`): input channels (3 for RGB).
        channels (`list[int]`): output channels of each block.
    """

    def __init__(self, image_size: int, num_channels: int, channels: list[int]):
        super().__init__()
        blocks = []
        in_channels = num_channels
        for out_channels in channels:
            blocks += [
                nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1),
                # Per-image normalisation keeps the features of small coloured objects on a large uniform background
                # from being drowned by the background's constant response (without it the image embedding grows
                # by orders of magnitude during training and saturates the LSTM). GroupNorm, unlike BatchNorm,
                # behaves the same in training and evaluation mode, so sampled captions and their log-probabilities
                # come from the same policy.
                nn.GroupNorm(num_groups=_num_groups(out_channels), num_channels=out_channels),
                nn.ReLU(),
                nn.MaxPool2d(kernel_size=2),
            ]
            in_channels = out_channels
        self.blocks = nn.Sequential(*blocks)
        self.image_size = image_size
        final_side = image_size // 2 ** len(channels)
        self.output_size = in_channels * final_side * final_side
        self.grid_feature_size = in_channels
        self.num_grid_positions = final_side * final_side

    @torch.no_grad()
    def init_weights(self) -> None:
        """He initialisation of the conv layers, for the models' `_init_weights` (it skips weights already loaded)."""
        # ReLU conv stacks trained from scratch need it; N(0, 0.02) makes activations vanish
        for layer in self.blocks:
            if isinstance(layer, nn.Conv2d):
                init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
                init.zeros_(layer.bias)

    def _feature_map(self, pixel_values: torch.FloatTensor) -> torch.FloatTensor:
        if pixel_values.shape[-2:] != (self.image_size, self.image_size):
            raise ValueError(
                f"The CNN encoder was built for {self.image_size}x{self.image_size} images but got pixel_values of "
                f"shape {tuple(pixel_values.shape)}; resize the images with the model's processor "
                "(CaptionProcessor with the same image_size)."
            )
        return self.blocks(pixel_values)  # (B, C, S, S)

    def forward(self, pixel_values: torch.FloatTensor) -> torch.FloatTensor:
        """`pixel_values` `(batch_size, num_channels, image_size, image_size)` -> `(batch_size, output_size)`."""
        return self._feature_map(pixel_values).flatten(1)  # (B, C * S * S)

    def forward_with_grid(self, pixel_values: torch.FloatTensor) -> tuple[torch.FloatTensor, torch.FloatTensor]:
        """The flattened features `(batch_size, output_size)` and the same map as a grid `(batch_size, S * S, C)`."""
        feature_map = self._feature_map(pixel_values)
        return feature_map.flatten(1), feature_map.flatten(2).transpose(1, 2)


def pool_image_features(outputs, pooling: str = "auto") -> torch.Tensor:
    """One vector per image from a vision model's output, or its grid of features with `pooling="none"`.

    With `pooling="auto"`, uses `pooler_output` when the model has one (ViT's [CLS] pooler, CLIP/SigLIP projected
    embeddings from `get_image_features`, ResNet's global average pool), else averages `last_hidden_state` over
    tokens (`(batch, tokens, hidden)`) or spatial positions (`(batch, channels, height, width)`).

    With `pooling="none"`, returns `last_hidden_state` as a sequence of positions: a transformer's tokens as they are
    (for a ViT, its [CLS] token then its patch tokens) and a CNN's feature map flattened row by row (a ResNet's
    `(batch, 2048, 7, 7)` becomes `(batch, 49, 2048)`), what an attention decoder reads.

    Args:
        outputs (`torch.Tensor` or `transformers.utils.ModelOutput`): the model output.
        pooling (`str`, *optional*, defaults to `"auto"`): one of `POOLING_MODES`.

    Returns:
        `torch.Tensor` of shape `(batch_size, feature_size)`, or `(batch_size, num_positions, feature_size)` with
        `pooling="none"`.
    """
    if pooling not in POOLING_MODES:
        raise ValueError(f"Unknown pooling {pooling!r}; expected one of {POOLING_MODES}.")
    if pooling == "auto":
        if isinstance(outputs, torch.Tensor):
            return outputs.flatten(1)
        pooled = getattr(outputs, "pooler_output", None)
        if pooled is not None:
            return pooled.flatten(1)  # ResNet pools to (B, C, 1, 1)
    hidden = outputs if isinstance(outputs, torch.Tensor) else getattr(outputs, "last_hidden_state", None)
    if hidden is None:
        raise ValueError(
            f"Cannot pool image features from a {type(outputs).__name__}: it has neither `pooler_output` nor "
            "`last_hidden_state`. Use a vision backbone loadable with `AutoModel` (ViT, DINOv2, ResNet, CLIP, ...)."
        )
    if hidden.dim() not in (3, 4):
        raise ValueError(
            f"Unexpected last_hidden_state of shape {tuple(hidden.shape)}; expected 3 or 4 dimensions"
            + (" (a grid needs the backbone's hidden states, not a pooled embedding)." if pooling == "none" else ".")
        )
    if pooling == "none":
        return hidden if hidden.dim() == 3 else hidden.flatten(2).transpose(1, 2)  # (B, C, H, W) -> (B, H * W, C)
    if hidden.dim() == 3:
        return hidden.mean(dim=1)  # (B, T, D) -> (B, D)
    return hidden.mean(dim=(2, 3))  # (B, C, H, W) -> (B, C)


def encode_images_with_backbone(backbone: nn.Module, pixel_values: torch.FloatTensor, pooling: str = "auto"):
    """
    The features `rlcaption extract-features` stores for images: `pool_image_features` of a vision model's output;
    dual encoders (CLIP, SigLIP) give their projected image embedding, or their vision tower's grid with
    `pooling="none"`.

    Args:
        backbone (`nn.Module`): a vision model loaded with `AutoModel`.
        pixel_values (`torch.FloatTensor` of shape `(batch_size, 3, H, W)`): from the backbone's image processor.
        pooling (`str`, *optional*, defaults to `"auto"`): one of `POOLING_MODES`.

    Returns:
        `torch.Tensor` of shape `(batch_size, feature_size)`, or `(batch_size, num_positions, feature_size)` with
        `pooling="none"`.
    """
    if pooling == "none":
        # a dual encoder's `get_image_features` is already pooled and projected: the grid is its vision tower's
        vision_model = getattr(backbone, "vision_model", backbone)
        return pool_image_features(vision_model(pixel_values=pixel_values), pooling="none")
    if hasattr(backbone, "get_image_features"):
        return pool_image_features(backbone.get_image_features(pixel_values=pixel_values))
    return pool_image_features(backbone(pixel_values=pixel_values))


def _backbone_output_size(backbone_config) -> int:
    """Width of a backbone's pooled output, read from its config."""
    if getattr(backbone_config, "hidden_sizes", None):
        return backbone_config.hidden_sizes[-1]  # ResNet, ConvNeXt, Swin-style hierarchical backbones
    if getattr(backbone_config, "hidden_size", None):
        return backbone_config.hidden_size  # ViT, DeiT, CLIP vision, DINOv2
    raise ValueError(
        f"Cannot tell the output width of a {type(backbone_config).__name__} backbone: its config has neither "
        "`hidden_sizes` nor `hidden_size`. Extract features with it instead (encoder_type='features')."
    )


class BackboneImageEncoder(nn.Module):
    """A `transformers` vision model whose pooled output (or mean over positions) is the image feature.

    Args:
        backbone_config (`dict`): the backbone's config as a dict with its `model_type`.
        freeze (`bool`): keep the backbone's parameters fixed (no gradient, always in eval mode).
    """

    def __init__(self, backbone_config: dict, freeze: bool):
        super().__init__()
        config_kwargs = dict(backbone_config)
        model_type = config_kwargs.pop("model_type")
        self.backbone = AutoModel.from_config(AutoConfig.for_model(model_type, **config_kwargs))
        # The backbone's own blocks (its layers) must each stay on one device; the captioning model's `post_init`
        # collects the `_no_split_modules` of its children, and this wrapper is the child that holds the backbone.
        self._no_split_modules = set(self.backbone._no_split_modules or ())
        self.output_size = _backbone_output_size(self.backbone.config)
        self.grid_feature_size = self.output_size
        self.num_grid_positions = None  # the backbone's own position embeddings locate its tokens
        self.freeze = freeze
        if freeze:
            self.backbone.requires_grad_(False)

    def load_pretrained_backbone(self, name_or_path: str) -> None:
        """Replace the backbone's weights by those of `name_or_path` (hub id or local folder)."""
        pretrained = AutoModel.from_pretrained(name_or_path)
        self.backbone.load_state_dict(pretrained.state_dict())

    def train(self, mode: bool = True) -> BackboneImageEncoder:
        super().train(mode)
        if self.freeze:
            # a frozen backbone keeps its batch-norm statistics and disables its dropout
            self.backbone.eval()
        return self

    def forward(self, pixel_values: torch.FloatTensor) -> torch.FloatTensor:
        """`pixel_values` `(batch_size, 3, H, W)` -> `(batch_size, output_size)`."""
        return self.forward_with_grid(pixel_values)[0]

    def forward_with_grid(self, pixel_values: torch.FloatTensor) -> tuple[torch.FloatTensor, torch.FloatTensor]:
        """The pooled feature `(batch_size, output_size)` and the backbone's tokens or feature map as a grid
        `(batch_size, num_positions, output_size)`."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze):
            outputs = self.backbone(pixel_values=pixel_values)
        return pool_image_features(outputs), pool_image_features(outputs, pooling="none")


class PrecomputedFeatureEncoder(nn.Module):
    """Checks and passes through precomputed features: one vector per image, or a grid or regions per image.

    With `layout="pooled"` the features are `(batch_size, feature_size)` and pass through unchanged. With
    `layout="grid"` they are `(batch_size, num_regions, feature_size)` (a fixed grid, or bottom-up regions padded to
    the batch's largest count) with an optional `image_feature_mask` `(batch_size, num_regions)`, 1 for a real region
    and 0 for padding: the pooled vector is the mean over the real regions, and the grid an attention decoder reads
    has its padding zeroed (whatever the padding held, it cannot leak into the result). Regions have no fixed
    positions, so `num_grid_positions` is None: no position embeddings.

    With the record of the `extractor` that made the features, [`features_of_pixels`] computes them from images: the
    recorded backbone, loaded on first use and then kept, runs on `pixel_values` prepared by its own image processor
    (the captioner's processor carries it) and is pooled as recorded. The backbone is not a submodule: it is neither
    trained, nor in the state dict, nor saved with the captioner, whose config names it.

    Args:
        feature_size (`int`): width of the features (the extractor's).
        layout (`str`, *optional*, defaults to `"pooled"`): one of `IMAGE_FEATURE_LAYOUTS`.
        extractor (`dict`, *optional*): what extracted the features, a config's `image_feature_extractor` (`model`,
            the backbone's Hub id or folder; `pooling`; ...); `None` for features no backbone here can compute
            (region features, which need an object detector).
    """

    def __init__(self, feature_size: int, layout: str = "pooled", extractor: dict | None = None):
        super().__init__()
        if layout not in IMAGE_FEATURE_LAYOUTS:
            raise ValueError(f"Unknown image feature layout {layout!r}; expected one of {IMAGE_FEATURE_LAYOUTS}.")
        self.output_size = feature_size
        self.layout = layout
        self.grid_feature_size = feature_size if layout == "grid" else None
        self.num_grid_positions = None
        self.extractor = extractor
        # set through `__dict__`: `nn.Module.__setattr__` would register the backbone as a submodule, and its weights
        # would then be saved, trained and moved with the captioner's
        self.__dict__["backbone"] = None

    def features_of_pixels(self, pixel_values: torch.FloatTensor) -> torch.FloatTensor:
        """
        The features the recorded extractor gives for images, as `rlcaption extract-features` computed them.

        Args:
            pixel_values (`torch.FloatTensor` of shape `(batch_size, 3, H, W)`): from the backbone's image processor
                (the processor saved with a captioner trained on features carries it).

        Returns:
            `torch.FloatTensor` of shape `(batch_size, feature_size)`, or `(batch_size, num_positions, feature_size)`
            for grids, in float32.
        """
        if self.extractor is None:
            raise ValueError(
                f"This model reads precomputed features of width {self.output_size} ({self.layout}) and its config "
                "records no extractor (image_feature_extractor) to compute them from pixel_values: region features "
                "(bottom-up attention) need an object detector, which it does not run, and checkpoints of older "
                "versions did not record the backbone. Extract the features of your photos as the training features "
                "were and pass image_features, e.g. `model.generate(image_features=..., image_feature_mask=...)`."
            )
        if self.backbone is None:
            self.__dict__["backbone"] = AutoModel.from_pretrained(self.extractor["model"]).eval()
        if next(self.backbone.parameters()).device != pixel_values.device:
            self.backbone.to(pixel_values.device)
        dtype = next(self.backbone.parameters()).dtype
        with torch.no_grad():  # the backbone is fixed: its features were precomputed for training
            features = encode_images_with_backbone(self.backbone, pixel_values.to(dtype), self.extractor["pooling"])
        return features.float()

    def forward(
        self, image_features: torch.FloatTensor, image_feature_mask: torch.Tensor | None = None
    ) -> torch.FloatTensor:
        """`image_features` `(batch_size, feature_size)`, or `(batch_size, num_regions, feature_size)` with its
        optional `image_feature_mask` `(batch_size, num_regions)` -> `(batch_size, feature_size)`."""
        if self.layout == "pooled":
            self._check_pooled(image_features, image_feature_mask)
            return image_features
        return self.forward_with_grid(image_features, image_feature_mask)[0]

    def forward_with_grid(
        self, image_features: torch.FloatTensor, image_feature_mask: torch.Tensor | None = None
    ) -> tuple[torch.FloatTensor, torch.FloatTensor]:
        """The mean over each image's real regions `(batch_size, feature_size)` and its regions as a grid
        `(batch_size, num_regions, feature_size)`, zero at padding."""
        if self.layout != "grid":
            raise ValueError(
                "Attention needs a grid or regions per image, but this encoder reads pooled features "
                "(batch_size, feature_size); set image_feature_layout='grid' in the config."
            )
        if image_features.dim() != 3 or image_features.shape[-1] != self.output_size:
            raise ValueError(
                f"Expected image_features of shape (batch_size, num_regions, {self.output_size}) but got "
                f"{tuple(image_features.shape)}; set image_feature_size in the config to the extractor's width"
                + (" (pooled features need image_feature_layout='pooled')." if image_features.dim() == 2 else ".")
            )
        if image_feature_mask is None:
            return image_features.mean(dim=1), image_features
        real = self._region_mask(image_features, image_feature_mask)  # (B, N)
        grid = image_features.masked_fill(~real[..., None], 0.0)
        num_regions = real.sum(dim=1, keepdim=True).to(grid.dtype)  # (B, 1), at least 1
        return grid.sum(dim=1) / num_regions, grid

    def _check_pooled(self, image_features: torch.FloatTensor, image_feature_mask: torch.Tensor | None) -> None:
        if image_features.dim() != 2 or image_features.shape[-1] != self.output_size:
            raise ValueError(
                f"Expected image_features of shape (batch_size, {self.output_size}) but got "
                f"{tuple(image_features.shape)}; set image_feature_size in the config to the extractor's width"
                + (" (grids and regions need image_feature_layout='grid')." if image_features.dim() == 3 else ".")
            )
        if image_feature_mask is not None:
            raise ValueError(
                "Got an image_feature_mask with pooled image features (one vector per image, nothing to mask); "
                "drop the mask, or set image_feature_layout='grid' for features of several regions per image."
            )

    @staticmethod
    def _region_mask(image_features: torch.FloatTensor, image_feature_mask: torch.Tensor) -> torch.BoolTensor:
        """`image_feature_mask` as booleans on the features' device, checked: its shape, and a region in every row."""
        if image_feature_mask.shape != image_features.shape[:2]:
            raise ValueError(
                f"image_feature_mask of shape {tuple(image_feature_mask.shape)} does not match image_features of "
                f"shape {tuple(image_features.shape)}: it needs one entry per region, "
                f"{tuple(image_features.shape[:2])}."
            )
        real = image_feature_mask.to(image_features.device) != 0
        # a masked mean and an attention over no region at all are undefined (NaN): refuse such images. A CUDA graph
        # being captured cannot read the device; the replayed pass (an RL step's scoring of its samples) gets inputs
        # that the step's decoding encoded, checked, eagerly.
        has_region = real.any(dim=1)
        capturing = has_region.is_cuda and torch.cuda.is_current_stream_capturing()
        if not capturing and not bool(has_region.all()):
            empty_rows = (~has_region).nonzero().flatten().tolist()
            raise ValueError(
                f"image_feature_mask marks no region at all in batch rows {empty_rows}: every image needs at "
                "least one real region (mask value 1); drop the images without regions from the dataset."
            )
        return real


# The fields that choose and size an image encoder, with their defaults; `ImageEncoderConfigMixin` documents them.
IMAGE_ENCODER_DEFAULTS = {
    "encoder_type": "cnn",
    "image_size": 64,
    "num_channels": 3,
    "cnn_channels": (32, 64, 64, 64),
    "backbone": None,
    "backbone_config": None,
    "use_pretrained_backbone": None,
    "freeze_backbone": True,
    "freeze_image_encoder": False,
    "image_feature_size": None,
    "image_feature_layout": "pooled",
}


class ImageEncoderConfigMixin:
    r"""
    The fields of a model config that choose and size its image encoder, declared, documented and checked here for
    every model that has one: [`build_image_encoder`] builds the encoder from them. A config takes them as keyword
    arguments and keeps them as flat attributes, saved at the top level of its `config.json`.

    A config has every field, with the defaults of `IMAGE_ENCODER_DEFAULTS`, and accepts every encoder type, unless its
    class sets `image_encoder_defaults` to the fields it has and their defaults, and `image_encoder_types` to the types
    it accepts: a CLIP that embeds pixels with an image tower trained from scratch has neither precomputed features
    nor a pretrained backbone.

    Args:
        encoder_type (`str`, *optional*, defaults to `"cnn"`):
            `"cnn"` (a small CNN trained from scratch, see [`ConvImageEncoder`]), `"backbone"` (any `transformers`
            vision model, its pooled output) or `"features"` (precomputed `image_features` as input).
        image_size (`int`, *optional*, defaults to 64):
            Side of the square input images (`"cnn"` encoder).
        num_channels (`int`, *optional*, defaults to 3):
            Input image channels (`"cnn"` encoder).
        cnn_channels (`list[int]`, *optional*, defaults to `[32, 64, 64, 64]`):
            Output channels of the CNN blocks; each block halves the image side.
        backbone (`str`, *optional*):
            Hub id or local folder of a `transformers` vision model (`"backbone"` encoder). Its config is read at
            once and stored in `backbone_config`.
        backbone_config (`dict`, *optional*):
            Config of the vision backbone as a dict with its `model_type` (`"backbone"` encoder); builds a randomly
            initialised backbone when `use_pretrained_backbone` is False.
        use_pretrained_backbone (`bool`, *optional*):
            Load the weights of `backbone` when the model is built. Defaults to True when `backbone` is given. The
            model sets it to False once the weights are part of it, so reloading a saved model downloads nothing.
        freeze_backbone (`bool`, *optional*, defaults to `True`):
            Keep the backbone's weights fixed (`"backbone"` encoder).
        freeze_image_encoder (`bool`, *optional*, defaults to `False`):
            Keep the `"cnn"` encoder's weights fixed, e.g. once pretrained on scene annotations
            ([`rlcaption.shapes.scene_pretraining`]) or copied from a captioner: saved with the model, so every later
            training keeps it fixed.
        image_feature_size (`int`, *optional*):
            Width of precomputed `image_features` (`"features"` encoder).
        image_feature_layout (`str`, *optional*, defaults to `"pooled"`):
            How precomputed `image_features` hold an image (`"features"` encoder): `"pooled"`, one vector per image
            `(batch_size, image_feature_size)`; or `"grid"`, several per image `(batch_size, num_regions,
            image_feature_size)`, a fixed grid (`extract-features --pooling none`) or regions whose count varies
            (bottom-up features), padded with an `image_feature_mask` `(batch_size, num_regions)`, 1 for a real
            region and 0 for padding. The pooled image is the mean over the real regions; an attention decoder reads
            them all, with no position embeddings (regions have no fixed positions).
    """

    # the fields a config has, with their defaults, and the encoder types it accepts
    image_encoder_defaults = IMAGE_ENCODER_DEFAULTS
    image_encoder_types = ENCODER_TYPES

    def _init_image_encoder_fields(self, kwargs: dict) -> None:
        """Sets this config's image encoder fields from `kwargs`, popping them, or from `image_encoder_defaults`."""
        for name, default in self.image_encoder_defaults.items():
            setattr(self, name, kwargs.pop(name, default))
        self.cnn_channels = list(self.cnn_channels)
        backbone = getattr(self, "backbone", None)
        if self.encoder_type == "backbone" and self.backbone_config is None and backbone is not None:
            self.backbone_config = AutoConfig.from_pretrained(backbone).to_dict()
        if hasattr(self.backbone_config, "to_dict"):
            self.backbone_config = self.backbone_config.to_dict()
        if "use_pretrained_backbone" in self.image_encoder_defaults and self.use_pretrained_backbone is None:
            self.use_pretrained_backbone = backbone is not None

    def _validate_image_encoder_fields(self) -> None:
        """
        Refuses fields that cannot build an image encoder: `encoder_type`, and the fields of that type
        (`cnn_channels` and `image_size`; `backbone` and `backbone_config`; `image_feature_size` and
        `image_feature_layout`).
        """
        config_name = type(self).__name__
        if self.encoder_type not in self.image_encoder_types:
            # the one known type a config refuses is precomputed features, for a model that embeds pixels (a CLIP)
            known = self.encoder_type in ENCODER_TYPES
            why = " (this model embeds pixels: precomputed features are not an option)" if known else ""
            raise ValueError(
                f"{config_name}.encoder_type={self.encoder_type!r} is not supported; expected one of "
                f"{self.image_encoder_types}{why}."
            )
        if self.encoder_type == "cnn":
            check_cnn_fields(self.cnn_channels, self.image_size)
        elif self.encoder_type == "backbone":
            backbone = getattr(self, "backbone", None)
            if not isinstance(self.backbone_config, dict) or "model_type" not in self.backbone_config:
                needs = "`backbone_config` (a transformers vision config, or its dict with its model_type)"
                if "backbone" in self.image_encoder_defaults:
                    needs = f"`backbone` (a hub id or local folder of a transformers vision model) or {needs}"
                raise ValueError(
                    f"encoder_type='backbone' needs {needs}, got backbone_config={self.backbone_config!r}."
                )
            if getattr(self, "use_pretrained_backbone", False) and backbone is None:
                raise ValueError("use_pretrained_backbone=True needs `backbone` (the hub id or folder to load).")
        else:
            if not isinstance(self.image_feature_size, int) or self.image_feature_size < 1:
                raise ValueError(
                    "encoder_type='features' needs image_feature_size (the width of the precomputed image features), "
                    f"got {self.image_feature_size!r}."
                )
            if self.image_feature_layout not in IMAGE_FEATURE_LAYOUTS:
                raise ValueError(
                    f"{config_name}.image_feature_layout={self.image_feature_layout!r} is not supported; expected "
                    f"one of {IMAGE_FEATURE_LAYOUTS}."
                )


def check_cnn_fields(cnn_channels: list[int] | None, image_size: int, channels_field: str = "cnn_channels") -> None:
    """Refuses CNN blocks that cannot build a [`ConvImageEncoder`] for images of side `image_size`; `channels_field`
    names the config field that holds the blocks' channels in the messages."""
    if not cnn_channels or any(not isinstance(c, int) or c < 1 for c in cnn_channels):
        raise ValueError(f"{channels_field} must be a non-empty list of positive ints, got {cnn_channels!r}.")
    reduction = 2 ** len(cnn_channels)
    if image_size % reduction != 0:
        raise ValueError(
            f"image_size={image_size} must be divisible by {reduction} (each of the {len(cnn_channels)} CNN blocks "
            f"halves the side); change image_size or {channels_field}."
        )


def build_image_encoder(
    config, cnn_channels: list[int] | None = None
) -> ConvImageEncoder | BackboneImageEncoder | PrecomputedFeatureEncoder:
    """
    Build the encoder named by `config.encoder_type` from the fields of a model config (see
    [`ImageEncoderConfigMixin`]). A network that mirrors another model's image input (a value network, a listener)
    passes that model's config and, for a CNN of its own size, its `cnn_channels`.
    """
    if config.encoder_type == "cnn":
        channels = config.cnn_channels if cnn_channels is None else cnn_channels
        return ConvImageEncoder(config.image_size, config.num_channels, list(channels))
    if config.encoder_type == "backbone":
        return BackboneImageEncoder(config.backbone_config, freeze=config.freeze_backbone)
    if config.encoder_type == "features":
        # configs written before grids and regions existed have no layout: their features are pooled; configs written
        # before extractors were recorded have none
        return PrecomputedFeatureEncoder(
            config.image_feature_size,
            getattr(config, "image_feature_layout", "pooled"),
            getattr(config, "image_feature_extractor", None),
        )
    raise ValueError(f"Unknown encoder_type {config.encoder_type!r}; expected one of {ENCODER_TYPES}.")


def image_encoder_arguments(
    encoder: nn.Module,
    pixel_values: torch.FloatTensor | None = None,
    image_features: torch.FloatTensor | None = None,
    image_feature_mask: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """
    The arguments of `encoder`'s `forward` (or `forward_with_grid`) among a batch's image inputs, in `dtype`, checked:
    `(pixel_values,)` for an encoder of pixels, `(image_features, image_feature_mask)` for precomputed features, which
    `pixel_values` alone give through the recorded extractor ([`PrecomputedFeatureEncoder.features_of_pixels`]). An
    input the encoder does not read (the `pixel_values` a batch may also carry beside its features) is left out.
    """
    if isinstance(encoder, PrecomputedFeatureEncoder):
        if image_features is None and pixel_values is None:
            raise ValueError(
                "This image encoder reads precomputed features (encoder_type='features'): pass image_features, or "
                "pixel_values from the model's processor, which the backbone recorded in the config's "
                "image_feature_extractor turns into features."
            )
        if image_features is None:
            if image_feature_mask is not None:
                raise ValueError(
                    "Got an image_feature_mask without the image_features it masks; features computed from "
                    "pixel_values have no padding: drop the mask."
                )
            image_features = encoder.features_of_pixels(pixel_values)  # (B, D) or (B, N, D)
        return image_features.to(dtype), image_feature_mask
    encoder_type = "cnn" if isinstance(encoder, ConvImageEncoder) else "backbone"
    if pixel_values is None:
        raise ValueError(
            f"This image encoder reads images (encoder_type={encoder_type!r}): pass pixel_values (from "
            "CaptionProcessor)."
        )
    if image_feature_mask is not None:
        raise ValueError(
            "Got an image_feature_mask, which masks the regions of precomputed image_features, but this image encoder "
            f"reads pixel_values (encoder_type={encoder_type!r}); drop the mask."
        )
    return (pixel_values.to(dtype),)


@torch.no_grad()
def init_cnn_and_gru_weights(module: nn.Module) -> bool:
    """
    Initialises the layers that the models of rlcaption with a CNN and a GRU (listener, value network, visual-semantic
    embedding) set up alike: a [`ConvImageEncoder`] by its own `init_weights` (its convolutions included), a GRU
    with Xavier-uniform weights and zero biases.

    Returns:
        `True` when `module` was handled here; `False` for any other layer, left to the model's default
        `_init_weights`.
    """
    if isinstance(module, ConvImageEncoder):
        module.init_weights()
    elif isinstance(module, nn.GRU):
        for name, parameter in module.named_parameters():
            if "weight" in name:
                init.xavier_uniform_(parameter)
            else:
                init.zeros_(parameter)
    return isinstance(module, ConvImageEncoder | nn.GRU | nn.Conv2d)  # convolutions: set by their ConvImageEncoder


@functools.cache
def cpu_runs_lstm_in(dtype: torch.dtype) -> bool:
    """Whether this CPU's oneDNN runs an `nn.LSTM` under `torch.autocast("cpu", dtype)`: CPUs without AVX-512 (AVX2
    only) have no reduced-precision LSTM and refuse it ("could not create a primitive descriptor")."""
    probe = nn.LSTM(8, 8, batch_first=True)
    try:
        with torch.autocast("cpu", dtype=dtype):
            probe(torch.zeros(2, 3, 8))
    except RuntimeError:
        return False
    return True


class MixedPrecisionLSTM(nn.LSTM):
    """
    `nn.LSTM` that runs in float32 under CPU autocast where the CPU has no reduced-precision LSTM, and as `nn.LSTM`
    everywhere else (same parameters, same state dict).

    Under autocast the rest of the model still computes in the reduced precision; only the recurrence is in float32,
    its inputs and state cast up, so that the dtypes it sees are consistent.
    """

    def forward(self, input, hx=None):
        data = input.data if isinstance(input, nn.utils.rnn.PackedSequence) else input
        if data.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
            return super().forward(input, hx)
        dtype = torch.get_autocast_dtype("cpu")
        if cpu_runs_lstm_in(dtype):
            return super().forward(input, hx)
        logger.warning_once(
            f"This CPU has no {dtype} LSTM (oneDNN needs AVX-512 for it): under mixed precision the LSTM runs in "
            "float32 and the rest of the model in the reduced precision."
        )
        with torch.autocast("cpu", enabled=False):
            return super().forward(input.float(), None if hx is None else tuple(state.float() for state in hx))

    def step(
        self, inputs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """
        One time step through every layer with `torch.lstm_cell` (the kernel of `nn.LSTMCell`) on the same weights:
        the same function as `forward` over a sequence of one, up to rounding. A one-step call of cuDNN's sequence RNN
        costs the host several times what the fused cell's launches cost (its backward about ten times), and a
        decoder that attends at every token makes one call per token, in sampling and in teacher forcing alike.

        Args:
            inputs (`torch.Tensor` of shape `(batch_size, input_size)`): one input per sequence.
            state (`tuple` of two `torch.Tensor` of shape `(num_layers, batch_size, hidden_size)`): `(h, c)`.

        Returns:
            the top layer's output `(batch_size, hidden_size)` and the new `(h, c)`.
        """
        hidden, cell = state
        next_hidden, next_cell = [], []
        layer_input = inputs
        for layer in range(self.num_layers):
            biases = (getattr(self, f"bias_ih_l{layer}"), getattr(self, f"bias_hh_l{layer}")) if self.bias else ()
            weights = (getattr(self, f"weight_ih_l{layer}"), getattr(self, f"weight_hh_l{layer}"))
            layer_hidden, layer_cell = torch.lstm_cell(layer_input, (hidden[layer], cell[layer]), *weights, *biases)
            next_hidden.append(layer_hidden)
            next_cell.append(layer_cell)
            is_last = layer == self.num_layers - 1
            # nn.LSTM's dropout between layers, in training mode only
            layer_input = layer_hidden if is_last else F.dropout(layer_hidden, self.dropout, self.training)
        if self.num_layers == 1:  # a view, where stacking one layer would copy it: a kernel less per token
            return layer_input, (next_hidden[0].unsqueeze(0), next_cell[0].unsqueeze(0))
        return layer_input, (torch.stack(next_hidden), torch.stack(next_cell))
