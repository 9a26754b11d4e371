"""Tenants: which models, which priority a header may ask for, settings checked at load."""

from __future__ import annotations

import msgspec
import pytest

from fleetgate.traffic.priority import Priority
from fleetgate.traffic.tenants import Tenant, TenantSettings


def tenant(**fields: object) -> Tenant:
    return Tenant.of(msgspec.convert({"name": "t", **fields}, TenantSettings))


def test_models_are_names_or_shell_patterns() -> None:
    t = tenant(models=["llama-3.1-8b-instruct", "qwen-*"])
    assert t.may_use("llama-3.1-8b-instruct")
    assert t.may_use("qwen-72b")
    assert not t.may_use("llama-3.3-70b-instruct")
    assert tenant().may_use("anything")


def test_a_header_may_lower_the_class_and_raise_it_only_to_the_tenants_top() -> None:
    t = tenant(priority="standard")
    assert t.priority_for(None) is Priority.STANDARD
    assert t.priority_for(b"sheddable") is Priority.SHEDDABLE
    assert t.priority_for(b"critical") is Priority.STANDARD  # not allowed above its own
    top = tenant(priority="standard", max_priority="critical")
    assert top.priority_for(b"CRITICAL") is Priority.CRITICAL
    with pytest.raises(ValueError, match="use one of critical, standard, sheddable"):
        t.priority_for(b"urgent")


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"name": "a b"}, "letters, digits"),
        ({"priority": "urgent"}, "no priority class"),
        ({"priority": "critical", "max_priority": "standard"}, "must not be below"),
        ({"max_concurrency": 2, "min_concurrency": 3}, "must not exceed"),
        ({"models": []}, "is empty"),
        ({"limits": {"tokens_burst": 10}}, "needs `tokens_per_minute`"),
        ({"limits": {"requests_per_minute": 0}}, "> 0"),
        ({"budget": {"period": "year", "tokens": 1}}, "period"),
        ({"budget": {"tokens": 1, "cost_usd": 1}}, "exactly one"),
        ({"weight": -1}, "> 0"),
        ({"limits": {"rpm": 10}}, "rpm"),
        ({"regions": ["eu west"]}, "not a region name"),
        ({"regions": [""]}, "not a region name"),
        ({"regions": "eu-west"}, "Expected `array`"),
    ],
)
def test_bad_tenant_settings_are_refused_by_name(fields: dict[str, object], error: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=error):
        msgspec.convert({"name": "t", **fields}, TenantSettings)


def test_a_tenant_may_opt_out_of_spillover() -> None:
    assert not Tenant.of(TenantSettings(name="a", models=["*"])).stays
    assert Tenant.of(TenantSettings(name="a", models=["*"], spill=False)).stays
