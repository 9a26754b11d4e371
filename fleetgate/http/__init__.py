"""fleetgate's one HTTP stack: a protocol-level server and a pooled client (uvloop, httptools)."""
