"""A real embeddings server on the CPU: MiniLM through onnxruntime, behind a dynamic batcher."""
