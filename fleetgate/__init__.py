"""fleetgate: one OpenAI-compatible endpoint in front of a fleet of model servers."""

__all__ = ["__version__"]

__version__ = "0.1.0"
