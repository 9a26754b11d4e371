"""Backends found while the gateway runs: sources that say which backends exist (a watched
file, ...), and the reconciler that makes each pool's members follow what they say."""
