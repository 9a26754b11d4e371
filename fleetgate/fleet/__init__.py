"""What the gateway knows about its backends: identity, live load, and pools per model."""
