"""The GPU health agent: reads a host's GPUs through NVML and pushes them to the gateway."""
