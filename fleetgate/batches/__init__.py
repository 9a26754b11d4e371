"""OpenAI's Batch API in the gateway: uploaded files, batches of requests checked at creation,
run in the background through the gateway's own request path on the batch lane, and kept on
disk so that a restart resumes them (docs/batches.md)."""
