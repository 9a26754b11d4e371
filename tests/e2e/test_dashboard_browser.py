"""The live dashboard in a real headless Chromium (Debian's `chromium`, installed when missing,
driven by Playwright without a browser download): during a `fleetgate bench` run against a
gateway over two sim workers (in regions eu and us), one worker is killed. The page loads with
no console errors, shows every backend and a row for each region, a GPU agent's verdict and
then, once it says nothing more, the agent stale, its numbers (each region's too) change as
traffic flows, the killed backend is shown ejected and the TTFT objective burning. Screenshots
are saved under build/test-artifacts/dashboard/ (or $FLEETGATE_ARTIFACTS/dashboard/)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.debian import debian_program
from tests.e2e.procs import Proc, fleetgate, gateway

MODEL = "sim-8b"
ADMIN, KEY = "sk-dashboard-browser-admin", "sk-dashboard-browser-tenant"
HEARTBEAT = "sk-dashboard-browser-heartbeat"
ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("FLEETGATE_ARTIFACTS", ROOT / "build" / "test-artifacts")) / "dashboard"


@contextmanager
def worker() -> Iterator[tuple[str, Proc]]:
    with fleetgate(["worker", "sim", "--port", "0", "--model", MODEL,
                    "--profile", "h100-llama3-8b"]) as proc:  # fmt: skip
        port = proc.wait_for(r"on http://127\.0\.0\.1:(\d+)")[0]
        yield f"http://127.0.0.1:{port}", proc


def test_the_dashboard_shows_an_ejection_and_the_objective_burning_during_a_bench_run(
    tmp_path: Path,
) -> None:
    chromium = debian_program("chromium", "chromium")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        url_a, _ = stack.enter_context(worker())
        url_b, doomed = stack.enter_context(worker())
        config = tmp_path / "gateway.yaml"
        config.write_text(json.dumps({
            "auth": {"admin_keys": [ADMIN], "heartbeat_keys": [HEARTBEAT]},
            "tenants": [{"name": "bench", "keys": [KEY]}],
            "pools": [{
                "model": MODEL, "backends": [{"url": url_a, "labels": {"region": "eu"}},
                                             {"url": url_b, "labels": {"region": "us"}}],
                "outlier": {"consecutive_failures": 2, "base_ejection_s": 60.0},
                "health_check": {"interval_s": 1.0},
                "engine_metrics": {"interval_s": 0.5},
                "slo": {"ttft_s": 0.25, "ttft_percentile": 99, "availability": 0.99},
                "gpu": {"enabled": True, "stale_after_s": 1.5},
            }],
        }))  # fmt: skip
        url, _ = stack.enter_context(gateway(["--config", str(config)]))
        problems: list[str] = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            context = browser.new_context(
                viewport={"width": 1400, "height": 1000},
                http_credentials={"username": "admin", "password": ADMIN},
            )
            page = context.new_page()
            page.on(
                "console",
                lambda m: problems.append(m.text) if m.type in ("error", "warning") else None,
            )
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(url + "/dashboard")
            page.wait_for_selector(".tile[data-backend]")
            tiles = page.eval_on_selector_all(
                ".tile[data-backend]", "ts => ts.map(t => t.dataset.backend)"
            )
            assert sorted(tiles) == sorted([url_a[7:], url_b[7:]])
            regions = "#region-table tbody tr[data-region]"
            assert page.eval_on_selector_all(regions, "rs => rs.map(r => r.dataset.region)") == [
                "eu", "us"]  # fmt: skip

            # One GPU agent pushes once, then falls silent: its GPU cell turns stale.
            _push_gpu_reading(url, url_a[7:])
            gpu = f'.tile[data-backend="{url_a[7:]}"] .gpu'
            _until(lambda: page.locator(gpu + ".gpu-ok").count() == 1, 10,
                   "the agent's reading was never shown")  # fmt: skip
            _until(lambda: page.locator(gpu + ".gpu-stale").count() == 1, 10,
                   "the silent agent was never shown stale")  # fmt: skip
            assert page.inner_text(gpu).startswith("stale · ")
            before = page.inner_text("#stat-rps")
            page.screenshot(path=str(SHOTS / "1-idle.png"), full_page=True)

            bench = stack.enter_context(fleetgate([
                "bench", "--target", url, "--api-key", KEY, "--model", MODEL, "--quiet",
                "--workload", "synthetic", "--input-len", "2048", "--output-len", "32",
                "--rate", "24", "--duration", "25", "--grace", "5",
            ]))  # fmt: skip
            _until(lambda: page.inner_text("#stat-rps") not in (before, "0", "0.0"), 15,
                   "the request rate never moved")  # fmt: skip
            rates = "rs => rs.map(r => r.cells[2].textContent)"  # requests/s
            _until(lambda: "0" not in page.eval_on_selector_all(regions, rates), 10,
                   "a region's request rate never moved")  # fmt: skip
            time.sleep(3)
            page.screenshot(path=str(SHOTS / "2-traffic.png"), full_page=True)

            doomed.popen.send_signal(signal.SIGKILL)  # one worker dies mid-run
            dead = f'.tile[data-backend="{url_b[7:]}"]'
            _until(lambda: "verdict-unhealthy" in (page.get_attribute(dead, "class") or ""), 20,
                   "the killed backend was never shown unhealthy")  # fmt: skip
            _until(lambda: page.locator("#slo-table .slo-burning").count() > 0, 20,
                   "no objective was shown burning")  # fmt: skip
            page.screenshot(path=str(SHOTS / "3-worker-killed.png"), full_page=True)
            classes = page.get_attribute(dead, "class") or ""
            assert "flag-ejected" in classes or "flag-active_check_failed" in classes, classes
            assert "ejected" in page.inner_text("#events")
            bench.stop(signal.SIGINT)
            browser.close()
        assert problems == [], problems


def _push_gpu_reading(url: str, backend: str) -> None:
    """What `fleetgate worker gpu-agent` pushes, once: one cool, unthrottled GPU."""
    reading = {"index": 0, "temperature_c": 60, "xid_errors": [], "throttle_reasons": []}
    request = urllib.request.Request(
        url + "/fleet/heartbeat",
        data=json.dumps({"backend": backend, "gpu": [reading]}).encode(),
        headers={"authorization": f"Bearer {HEARTBEAT}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def _until(ready: object, timeout_s: float, why: str) -> None:
    assert callable(ready)
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, why
        time.sleep(0.25)
