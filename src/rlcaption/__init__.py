"""rlcaption: reinforcement learning for image captioning with Hugging Face models."""

__version__ = "0.1.0.dev0"
