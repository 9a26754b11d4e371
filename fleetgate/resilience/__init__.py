"""Resilience around the upstream call: retry policy, retry budget, backoff."""
