"""The HTTP edge: OpenAI-compatible endpoints, parsing and validation, operator endpoints."""
