"""voltgate: an OpenAI-compatible gateway for V100 GPUs."""

__version__ = "0.1.0"
