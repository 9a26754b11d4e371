"""The HTTP edge: OpenAI-compatible endpoints, validation, error shapes, the proxy path."""
