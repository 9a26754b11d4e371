"""deploy/: the alert rules and the Grafana dashboard, against a real Prometheus server (Debian's
`prometheus`, from scripts/test-deps.sh) scraping a real gateway in front of real sim workers:
after a clean run (plain traffic, no fault, no refusal) every panel's query returns data through
Prometheus's HTTP API, since a series is shown at 0 before its first event; then faults are
injected and what they cause is counted; the rules load and evaluate without error."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.debian import debian_program
from tests.e2e.procs import free_port, gateway, metric, sim_workers

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MODEL = "m"
RULES = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "fleetgate.json"


def promtool() -> str:
    debian_program("prometheus", "prometheus")
    return debian_program("promtool", "prometheus")


def test_the_alert_rules_pass_promtools_check_and_their_unit_tests() -> None:
    tool = promtool()
    check = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 16 rules found" in check.stdout
    tests = subprocess.run(
        [tool, "test", "rules", "alerts_test.yml"], capture_output=True, text=True,
        cwd=RULES.parent,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout + tests.stderr


def panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_the_dashboard_is_well_formed_for_grafana() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "model"}
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, list[str]]]:
    """A gateway over three sim workers, scraped every second by a real Prometheus loaded with
    the alert rules; yields (Prometheus's base URL, the gateway's, the workers') once plain
    traffic has been scraped."""
    binary = debian_program("prometheus", "prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    with sim_workers(MODEL, 3) as workers:
        config = tmp / "gateway.yaml"
        config.write_text(json.dumps({
            "server": {"admin": True},
            "pools": [{
                "model": MODEL, "policy": "round_robin",
                "backends": [{"url": w, "cost_per_hour_usd": 2.5} for w in workers],
                "hedge": {"enabled": True, "min_delay_s": 0.05, "percentile": 0.5},
                "outlier": {"consecutive_failures": 3, "base_ejection_s": 2.0},
                "pricing": {"input_per_1m_usd": 1.0, "output_per_1m_usd": 2.0},
                "engine_metrics": {"interval_s": 0.5},
                "slo": {"ttft_s": 1.0, "availability": 0.99, "mean_e2e_s": 10.0},
            }],
        }))  # fmt: skip
        with gateway(["--config", str(config)]) as (url, _):
            port = free_port()
            (tmp / "prometheus.yml").write_text(json.dumps({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [{"job_name": "fleetgate",
                                    "static_configs": [{"targets": [url[len("http://"):]]}]}],
            }))  # fmt: skip
            args = [binary, f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}"]  # fmt: skip
            server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            base = f"http://127.0.0.1:{port}"
            try:
                _wait_ready(base, server)
                _plain_traffic(_client(url))
                _wait_for_series(base, "fleetgate_tokens_total", server)
                yield base, url, workers
            finally:
                server.terminate()
                server.wait(10)


def _wait_ready(base: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            assert server.stderr is not None
            raise RuntimeError(f"prometheus exited: {server.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(base + "/-/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("prometheus did not get ready in 30 s")


def _faults(worker: str, **faults: object) -> None:
    request = urllib.request.Request(
        worker + "/admin/faults", data=json.dumps(faults).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _streams(client: openai.OpenAI, n: int) -> None:
    for _ in range(n):
        try:
            for _ in client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hello there"}],
                max_tokens=6,
                stream=True,
            ):
                pass
        except openai.APIError:
            pass  # a failure the faults caused: counted, which is what is wanted


def _plain_traffic(client: openai.OpenAI) -> None:
    """Bounded plain traffic: enough first tokens for the hedge's delay (a percentile of them),
    then a few streams over a few scrapes, so that every rate has samples."""
    _streams(client, 24)
    for _ in range(6):
        _streams(client, 3)
        time.sleep(0.4)


def _wait_for_series(base: str, name: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = api(base, "/api/v1/query", query=f"count_over_time({name}[1m])")["data"]["result"]
        if found and float(found[0]["value"][1]) >= 3:  # three scrapes of it at least
            return
        time.sleep(0.5)
    raise RuntimeError(f"prometheus never scraped {name}")


def test_after_a_clean_run_every_dashboard_panel_returns_data(
    scraped: tuple[str, str, list[str]],
) -> None:
    base, url, _ = scraped
    assert metric(url, "fleetgate_backend_ejections_total") == 0  # nothing went wrong
    empty = []
    for panel in panels():
        for target in panel["targets"]:
            expr = target["expr"].replace("$model", ".*").replace("$__rate_interval", "1m")
            answer = api(base, "/api/v1/query", query=expr)
            assert answer["status"] == "success", (panel["title"], expr, answer)
            if not answer["data"]["result"]:
                empty.append(f"{panel['title']}: {expr}")
    assert not empty, "panels with no data:\n" + "\n".join(empty)


def test_what_faults_cause_is_counted_through_prometheus(
    scraped: tuple[str, str, list[str]],
) -> None:
    """Each worker's fault in turn until the gateway has counted what it causes, then plain
    traffic: Prometheus sees each count rise from its 0."""
    base, url, workers = scraped
    client = _client(url)

    def until(series: str, worker: str, **faults: object) -> None:
        _faults(worker, **faults)
        for _ in range(20):  # at most 60 streams
            _streams(client, 3)
            if metric(url, series) > 0:
                break
        _faults(worker)
        assert metric(url, series) > 0, f"{faults} caused no {series}"

    until("fleetgate_backend_ejections_total", workers[0], error_rate=1.0, error_status=502)
    until("fleetgate_stream_continuations_total", workers[1], close_after_tokens=2)
    until("fleetgate_hedges_total", workers[2], added_latency_s=0.4)
    with pytest.raises(openai.NotFoundError):  # a refusal before routing
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}]
        )
    _plain_traffic(client)
    client.close()
    rising = {
        "fleetgate_backend_ejections_total", "fleetgate_stream_continuations_total",
        "fleetgate_hedges_total", "fleetgate_upstream_errors_total", "fleetgate_rejected_total",
    }  # fmt: skip
    deadline = time.monotonic() + 15
    while rising:
        rising = {name for name in rising if not _rose(base, name)}
        assert time.monotonic() < deadline, f"no rise seen by prometheus in {sorted(rising)}"
        time.sleep(0.5)


def _rose(base: str, name: str) -> bool:
    found = api(base, "/api/v1/query", query=f"sum(increase({name}[1m])) > 0")
    return bool(found["data"]["result"])


def test_the_alert_rules_load_and_evaluate_without_error(
    scraped: tuple[str, str, list[str]],
) -> None:
    base, _, _ = scraped
    groups = api(base, "/api/v1/rules")["data"]["groups"]
    assert {g["name"] for g in groups} == {
        "fleetgate-slo-burn", "fleetgate-slo-alerts", "fleetgate-fleet"
    }  # fmt: skip
    deadline = time.monotonic() + 10
    while True:  # each rule evaluated at least once since it loaded
        rules = [r for g in api(base, "/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        if all(r.get("lastEvaluation", "").startswith("20") for r in rules):
            break
        assert time.monotonic() < deadline, "rules not evaluated"
        time.sleep(0.5)
    assert len(rules) == 16
    assert [(r["name"], r["lastError"]) for r in rules if r["health"] != "ok"] == []
    # The recorded burn ratio has a figure per objective from the real traffic.
    ratios = api(base, "/api/v1/query", query="fleetgate:slo_bad_ratio:rate5m")["data"]["result"]
    assert {r["metric"]["objective"] for r in ratios} == {"ttft_p99", "availability"}
