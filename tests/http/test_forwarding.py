"""Which headers pass the gateway, each way."""

from __future__ import annotations

from fleetgate.http.forwarding import RequestHeaders, returned


def test_a_client_s_end_to_end_headers_go_on_and_no_others() -> None:
    forward = RequestHeaders(deny=["Cookie", "x-api-key"])
    headers = {
        b"host": b"gw", b"content-length": b"12", b"content-type": b"application/json",
        b"connection": b"keep-alive, x-hop", b"x-hop": b"1", b"keep-alive": b"timeout=5",
        b"te": b"trailers", b"trailer": b"x", b"transfer-encoding": b"chunked",
        b"upgrade": b"h2c", b"proxy-authorization": b"Basic x", b"authorization": b"Bearer sk-1",
        b"expect": b"100-continue", b"x-request-id": b"client",
        b"x-fleetgate-total-timeout-s": b"9",
        b"cookie": b"session=1", b"x-api-key": b"sk-2", b"accept-encoding": b"gzip",
        b"traceparent": b"00-abc-def-01", b"openai-organization": b"org-1", b"x-custom": b"v",
    }  # fmt: skip
    for _ in range(2):  # judged, then remembered
        assert forward.split(headers) == (
            [(b"traceparent", b"00-abc-def-01"), (b"openai-organization", b"org-1"),
             (b"x-custom", b"v")],
            {b"x-fleetgate-total-timeout-s": b"9"},  # the gateway's own: the request's metadata
        )  # fmt: skip


def test_an_upstream_s_answer_headers_come_back_but_hop_by_hop_and_the_gateway_s_own() -> None:
    headers = [
        (b"content-type", b"application/json"), (b"content-length", b"99"),
        (b"transfer-encoding", b"chunked"), (b"connection", b"close, x-hop"), (b"x-hop", b"1"),
        (b"keep-alive", b"timeout=5"), (b"x-request-id", b"upstream"), (b"retry-after", b"2"),
        (b"openai-processing-ms", b"41"), (b"x-ratelimit-remaining-tokens", b"100"),
        (b"x-ratelimit-limit-tokens_usage_based", b"9"), (b"x-ratelimit-remaining", b"8"),
    ]  # fmt: skip
    assert returned(headers) == [
        (b"content-type", b"application/json"), (b"retry-after", b"2"),
        (b"openai-processing-ms", b"41"), (b"x-ratelimit-remaining-tokens", b"100"),
        (b"x-ratelimit-limit-tokens_usage_based", b"9"), (b"x-ratelimit-remaining", b"8"),
    ]  # fmt: skip
    # When the gateway sends its tenant's own x-ratelimit-*, none of the upstream's are returned
    # (nor its provider's other limits, which a client would read as the tenant's).
    assert returned(headers, own_limits=True) == [
        (b"content-type", b"application/json"), (b"retry-after", b"2"),
        (b"openai-processing-ms", b"41"),
    ]  # fmt: skip
