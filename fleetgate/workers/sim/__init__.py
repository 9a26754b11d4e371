"""A simulated continuous-batching GPU engine (vLLM V1 semantics) and its fitted profiles."""
