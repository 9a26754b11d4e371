"""Data residency through the whole gateway: a tenant pinned to a region is served there alone
and refused with a 503 that says why when that region cannot serve it, while another tenant
uses every region. Real sim workers, a real gateway process, the official SDK."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import gateway, sim_workers
from tests.e2e.test_discovery_file import served

MODEL = "sim-8b"
EU_KEY, ANY_KEY = "sk-residency-eu-tenant", "sk-residency-any-tenant"


def test_a_tenant_pinned_to_a_region_is_served_there_or_refused(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    with sim_workers(MODEL, 2) as (us, eu):
        config.write_text(json.dumps({
            "tenants": [{"name": "eu-bank", "keys": [EU_KEY], "regions": ["eu-west"]},
                        {"name": "anyone", "keys": [ANY_KEY]}],
            "pools": [{"model": MODEL, "policy": "round_robin", "backends": [
                {"url": us, "labels": {"region": "us-east"}},
                {"url": eu, "labels": {"region": "eu-west"}}]}],
        }))  # fmt: skip
        with gateway(["--config", str(config)]) as (url, _):
            pinned = openai.OpenAI(base_url=url + "/v1", api_key=EU_KEY, max_retries=0)
            anyone = openai.OpenAI(base_url=url + "/v1", api_key=ANY_KEY, max_retries=0)
            for _ in range(6):
                pinned.completions.create(model=MODEL, prompt="x", max_tokens=1)
            assert (served(us), served(eu)) == (0, 6)
            for _ in range(4):
                anyone.completions.create(model=MODEL, prompt="x", max_tokens=1)
            assert served(us) == 2 and served(eu) == 8

    with sim_workers(MODEL, 1) as (us,):
        config.write_text(json.dumps({
            "tenants": [{"name": "eu-bank", "keys": [EU_KEY], "regions": ["eu-west"]}],
            "pools": [{"model": MODEL, "backends": [{"url": us, "labels": {"region": "us-east"}}]}],
        }))  # fmt: skip
        with gateway(["--config", str(config)]) as (url, _):
            pinned = openai.OpenAI(base_url=url + "/v1", api_key=EU_KEY, max_retries=0)
            with pytest.raises(openai.APIStatusError) as refused:
                pinned.completions.create(model=MODEL, prompt="x", max_tokens=1)
            assert refused.value.status_code == 503
            assert refused.value.code == "region_unavailable"
            assert served(us) == 0
