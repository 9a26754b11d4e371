"""The engines' KV-cache events: what each engine actually holds, read from its ZMQ publisher."""
