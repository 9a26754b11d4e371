"""What several gateways share through Redis (issue 29): the load board first; each part
stands behind the protocol its in-process twin implements, and falls back to this
gateway's own state while Redis is away."""
