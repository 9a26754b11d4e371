"""Worker processes that stand in for inference servers."""
