"""One inference request's lifecycle, knowing no HTTP: the Director, and the request it takes."""

from fleetgate.director.director import Director
from fleetgate.director.request import InferenceRequest

__all__ = ["Director", "InferenceRequest"]
