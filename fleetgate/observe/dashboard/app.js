// fleetgate live dashboard: draws GET /dashboard/snapshot, then keeps up with the
// /dashboard/events stream (SSE, one "snapshot" message a second, new points only).
// Every value from the server goes in through textContent: ids, names and labels come
// from config and are treated as untrusted.
"use strict";

(function () {
  const WINDOW_S = 300; // the charts show the last 5 minutes
  const STAT_WINDOW_S = 10; // the stat cards average the last 10 seconds
  const STALE_MS = 5000; // no message for this long while "live" means the stream is stuck
  const RETRY_MAX_MS = 30000;

  const FLAG_WORDS = {
    ejected: "EJECTED",
    draining: "DRAINING",
    active_check_failed: "CHECK FAILED",
    gone: "GONE",
  };

  const COLORS = {
    ok: "#4cc38a", errors: "#f0605d", shed: "#f2b441",
    p50: "#5aa9f8", p99: "#f08c4a",
    retried: "#b88cf7", hedged: "#5ad1d1", continued: "#e8d16b", ejected: "#f0605d",
    axis: "#9aa7b4", grid: "#2a3441",
  };

  // Load 0 -> 0.5 -> 1 as tile fill: slate, indigo, magenta (kept apart from the
  // green/amber/red that the verdict border uses).
  const LOAD_STOPS = [[36, 46, 60], [59, 79, 168], [176, 54, 154]];

  const state = { snapshot: null, points: [], lastMessageAt: 0, conn: "connecting" };

  // ---- formatting ----

  function fmtSeconds(s) {
    if (s == null) return "–";
    if (s === 0) return "0";
    if (s < 0.01) return (s * 1000).toFixed(1) + " ms";
    if (s < 1) return Math.round(s * 1000) + " ms";
    if (s < 100) return s.toFixed(2) + " s";
    return Math.round(s) + " s";
  }

  function fmtInt(n) {
    return n == null ? "–" : Math.round(n).toLocaleString("en-US");
  }

  function fmtRate(perSecond) {
    if (perSecond == null) return "–";
    return perSecond === 0 ? "0" : perSecond.toFixed(perSecond < 10 ? 2 : 1);
  }

  function fmtPct(ratio) {
    // 0.99 -> "99%", 0.995 -> "99.5%", 0.99912 -> "99.912%"
    return ratio == null ? "–" : String(Number((ratio * 100).toFixed(3))) + "%";
  }

  function pad2(n) {
    return String(n).padStart(2, "0");
  }

  function fmtClock(unix) {
    const d = new Date(unix * 1000);
    return pad2(d.getHours()) + ":" + pad2(d.getMinutes()) + ":" + pad2(d.getSeconds());
  }

  function fmtDate(unix) {
    const d = new Date(unix * 1000);
    return d.getFullYear() + "-" + pad2(d.getMonth() + 1) + "-" + pad2(d.getDate()) + " " + fmtClock(unix);
  }

  function fmtUptime(s) {
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
    if (d > 0) return d + "d " + pad2(h) + "h";
    if (h > 0) return h + "h " + pad2(m) + "m";
    if (m > 0) return m + "m " + pad2(s % 60) + "s";
    return s + "s";
  }

  // A server value turned into one safe class-name token.
  function token(value) {
    return String(value).toLowerCase().replace(/[^a-z0-9_-]/g, "-");
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text != null) node.textContent = String(text);
    return node;
  }

  function setText(id, text) {
    document.getElementById(id).textContent = text;
  }

  // ---- data ----

  // Appends the points newer than those held and drops those older than the window.
  // A reconnect's first message repeats history we already have; it is skipped here.
  function mergePoints(incoming) {
    const points = state.points;
    let last = points.length ? points[points.length - 1].t : -Infinity;
    for (const p of incoming) {
      if (p.t > last) {
        points.push(p);
        last = p.t;
      }
    }
    let drop = 0;
    while (drop < points.length && points[drop].t <= last - WINDOW_S) drop++;
    points.splice(0, drop);
  }

  function onSnapshot(snap) {
    // The fetched snapshot and the stream race at start: never go back to an older one. Older
    // means earlier by both clocks: the gateway's wall clock may be stepped back, and its
    // uptime starts again when it restarts.
    const prev = state.snapshot;
    if (prev && snap.time < prev.time && snap.uptime_s < prev.uptime_s) return;
    state.snapshot = snap;
    mergePoints(snap.points || []);
    render();
  }

  // ---- connection ----

  function setConn(kind, text) {
    state.conn = kind;
    document.getElementById("conn").className = "conn conn-" + kind;
    setText("conn-text", text);
  }

  let retryMs = 1000;

  function connect() {
    const source = new EventSource("/dashboard/events");
    source.addEventListener("snapshot", function (event) {
      retryMs = 1000;
      state.lastMessageAt = Date.now();
      if (state.conn !== "live") setConn("live", "live");
      onSnapshot(JSON.parse(event.data));
    });
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) {
        // The browser gives up for good on an HTTP error (say a 502 from a proxy);
        // a dropped connection it retries by itself.
        setConn("down", "disconnected, retrying");
        setTimeout(connect, retryMs);
        retryMs = Math.min(retryMs * 2, RETRY_MAX_MS);
      } else {
        setConn("down", "disconnected, retrying");
      }
    };
  }

  function watchStale() {
    const idle = Date.now() - state.lastMessageAt;
    if (state.conn === "live" && idle > STALE_MS) setConn("stale", "stale");
    if (state.conn === "stale") setText("conn-text", "no data for " + Math.round(idle / 1000) + " s");
  }

  // ---- rendering ----

  function render() {
    const snap = state.snapshot;
    const pools = snap.pools || [];
    setText("gateway-time", fmtDate(snap.time));
    setText("uptime", fmtUptime(snap.uptime_s));
    renderStats(pools);
    renderPools(pools);
    renderCharts();
    renderRegions(snap.regions);
    renderSlos(pools);
    renderTenants(snap.tenants || []);
    renderEvents(snap.events || []);
  }

  function renderStats(pools) {
    const points = state.points;
    const last = points.length ? points[points.length - 1].t : 0;
    const recent = points.filter(function (p) { return p.t > last - STAT_WINDOW_S; });
    const seconds = Math.max(1, recent.length);
    const sum = function (key) { return recent.reduce(function (acc, p) { return acc + (p[key] || 0); }, 0); };
    // Percentiles of different seconds do not combine; the worst second's p99 is an upper bound.
    const worst = function (key) {
      const values = recent.map(function (p) { return p[key]; }).filter(function (v) { return v != null; });
      return values.length ? Math.max.apply(null, values) : null;
    };
    const requests = sum("requests");
    let inFlight = 0;
    for (const pool of pools) for (const b of pool.backends) inFlight += b.in_flight;

    setText("stat-rps", recent.length ? (requests / seconds).toFixed(1) : "–");
    setText("stat-errors", requests ? (100 * sum("errors") / requests).toFixed(1) + "%" : "–");
    setText("stat-shed", recent.length ? (sum("shed") / seconds).toFixed(1) : "–");
    setText("stat-ttft", fmtSeconds(worst("ttft_p99")));
    setText("stat-e2e", fmtSeconds(worst("e2e_p99")));
    setText("stat-inflight", fmtInt(inFlight));
    document.getElementById("stat-errors").classList.toggle("bad", requests > 0 && sum("errors") > 0);
  }

  function renderPools(pools) {
    const root = document.getElementById("pools");
    if (!pools.length) {
      root.replaceChildren(el("p", "empty", "no pools"));
      return;
    }
    root.replaceChildren.apply(root, pools.map(renderPool));
  }

  function renderPool(pool) {
    const box = el("div", "pool");
    const head = el("div", "pool-head");
    head.append(el("h3", null, pool.model));
    const adm = pool.admission;
    head.append(el("span", "admission", adm
      ? "admission " + fmtInt(adm.in_flight) + " / " + fmtInt(adm.limit) + " in flight, " + fmtInt(adm.waiting) + " waiting"
      : "no admission limit"));
    box.append(head);

    const tiles = el("div", "tiles");
    const busiest = Math.max.apply(null, [0].concat(pool.backends.map(function (b) { return b.in_flight; })));
    for (const b of pool.backends) tiles.append(renderTile(b, busiest));
    if (!pool.backends.length) tiles.append(el("p", "empty", "no backends"));
    box.append(tiles);
    return box;
  }

  // The engine's KV cache use when it reports one, else in flight against the pool's busiest.
  function loadOf(b, busiest) {
    if (b.engine && b.engine.kv_usage != null) return { value: b.engine.kv_usage, source: "KV" };
    return { value: busiest > 0 ? b.in_flight / busiest : 0, source: "of busiest" };
  }

  function loadColor(load) {
    const x = Math.min(1, Math.max(0, load)) * (LOAD_STOPS.length - 1);
    const i = Math.min(LOAD_STOPS.length - 2, Math.floor(x));
    const f = x - i;
    const rgb = LOAD_STOPS[i].map(function (c, k) { return Math.round(c + (LOAD_STOPS[i + 1][k] - c) * f); });
    return "rgb(" + rgb.join(", ") + ")";
  }

  function renderTile(b, busiest) {
    const tile = el("div", "tile verdict-" + token(b.verdict));
    for (const flag of b.flags) tile.classList.add("flag-" + token(flag));
    tile.dataset.backend = b.id;
    const load = loadOf(b, busiest);
    tile.style.backgroundColor = loadColor(load.value);

    const top = el("div", "tile-top");
    top.append(el("span", "tile-name", b.name), el("span", "verdict", b.verdict));
    tile.append(top);
    tile.append(el("div", "tile-id", b.id + " · " + b.role));

    const labels = b.labels || {};
    const keys = Object.keys(labels);
    if (keys.length) {
      const row = el("div", "labels");
      for (const key of keys) row.append(el("span", "label", key + ": " + labels[key]));
      tile.append(row);
    }

    if (b.flags.length) {
      const row = el("div", "flags");
      for (const flag of b.flags) {
        let word = FLAG_WORDS[flag] || String(flag).toUpperCase().replace(/_/g, " ");
        if (flag === "ejected" && b.ejected_for_s != null) word += " · back in " + Math.ceil(b.ejected_for_s) + " s";
        row.append(el("span", "flag", word));
      }
      tile.append(row);
    }

    const facts = el("dl", "facts");
    const fact = function (name, value) {
      const dd = el("dd", null, value);
      facts.append(el("dt", null, name), dd);
      return dd;
    };
    fact("load", Math.round(load.value * 100) + "% " + load.source);
    fact("in flight", fmtInt(b.in_flight) + " · " + fmtInt(b.in_flight_tokens) + " tok");
    if (b.role === "prefill" || b.pending_prefill) fact("prefill queue", fmtInt(b.pending_prefill) + " tok");
    const e = b.engine;
    fact("engine", e
      ? fmtInt(e.running) + " run · " + fmtInt(e.waiting) + " wait · KV " + (e.kv_usage == null ? "–" : Math.round(e.kv_usage * 100) + "%")
      : "no reading");
    fact("TTFT · E2E", fmtSeconds(b.ttft_s) + " · " + fmtSeconds(b.e2e_s));
    fact("weight", b.weight.toFixed(2) + " · speed " + b.speed.toFixed(2));
    // Its GPU agent's verdict; "stale": nothing heard for the pool's stale_after_s, so the
    // last readings no longer count (the age says for how long).
    const g = b.gpu;
    if (g) {
      const cell = fact("GPU", g.state + " · " + Math.round(g.age_s) + " s ago");
      cell.classList.add("gpu", "gpu-" + token(g.state));
    }
    tile.append(facts);
    return tile;
  }

  // ---- charts ----

  const CHARTS = [
    { id: "chart-requests", unit: "count", series: [["ok", "ok", COLORS.ok], ["errors", "errors", COLORS.errors], ["shed", "shed", COLORS.shed]] },
    { id: "chart-ttft", unit: "seconds", series: [["ttft_p50", "p50", COLORS.p50], ["ttft_p99", "p99", COLORS.p99]] },
    { id: "chart-itl", unit: "seconds", series: [["itl_p50", "p50", COLORS.p50], ["itl_p99", "p99", COLORS.p99]] },
    { id: "chart-e2e", unit: "seconds", series: [["e2e_p50", "p50", COLORS.p50], ["e2e_p99", "p99", COLORS.p99]] },
    { id: "chart-events", unit: "count", series: [
      ["retried", "retries", COLORS.retried], ["hedged", "hedges", COLORS.hedged],
      ["continued", "continuations", COLORS.continued], ["ejected", "ejections", COLORS.ejected]] },
  ];
  const CHART_HEIGHT = 170;
  const COUNT_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];

  function makeChart(spec) {
    const box = document.getElementById(spec.id);
    const fmt = spec.unit === "seconds" ? fmtSeconds : function (v) { return v == null ? "–" : fmtInt(v); };
    const axis = { stroke: COLORS.axis, grid: { stroke: COLORS.grid, width: 1 }, ticks: { stroke: COLORS.grid, width: 1 } };
    // The window is always 5 minutes, so whole-minute ticks are enough.
    const xAxis = Object.assign({}, axis, {
      space: 40,
      incrs: [60, 120, 300],
      values: function (u, splits) { return splits.map(function (t) { return fmtClock(t).slice(0, 5); }); },
    });
    const yAxis = Object.assign({}, axis, {
      size: 64,
      values: function (u, splits) { return splits.map(fmt); },
    });
    if (spec.unit === "count") yAxis.incrs = COUNT_INCRS;
    const opts = {
      width: box.clientWidth,
      height: CHART_HEIGHT,
      cursor: { sync: { key: "fleetgate" } },
      scales: {
        x: { time: true },
        y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.1 : 1]; } },
      },
      axes: [xAxis, yAxis],
      series: [{ label: "time", value: function (u, v) { return v == null ? "–" : fmtClock(v); } }].concat(
        spec.series.map(function (s) {
          return { label: s[1], stroke: s[2], width: 1.5, value: function (u, v) { return fmt(v); } };
        })),
    };
    const empty = [[]].concat(spec.series.map(function () { return []; }));
    const chart = new uPlot(opts, empty, box);
    // Follows the container (window resize, a scrollbar appearing); drawn on the next frame so
    // the resize does not re-enter the observer in the same frame.
    new ResizeObserver(function () {
      requestAnimationFrame(function () {
        if (box.clientWidth !== chart.width) chart.setSize({ width: box.clientWidth, height: CHART_HEIGHT });
      });
    }).observe(box);
    return { spec: spec, chart: chart };
  }

  let charts = [];

  // One slot per second of the window, null where there is no point, so a missing
  // second or a null percentile shows as a gap.
  function renderCharts() {
    const points = state.points;
    if (!points.length) return;
    const end = points[points.length - 1].t;
    const start = end - WINDOW_S + 1;
    const xs = [];
    for (let t = start; t <= end; t++) xs.push(t);
    for (const c of charts) {
      const columns = c.spec.series.map(function () { return new Array(WINDOW_S).fill(null); });
      for (const p of points) {
        const i = p.t - start;
        if (i < 0) continue;
        c.spec.series.forEach(function (s, k) { columns[k][i] = p[s[0]] == null ? null : p[s[0]]; });
      }
      c.chart.setData([xs].concat(columns));
    }
  }

  // ---- tables ----

  function fillTable(id, rows, columns, emptyText) {
    const body = document.querySelector("#" + id + " tbody");
    if (!rows.length) {
      const tr = el("tr", "empty");
      const td = el("td", null, emptyText);
      td.colSpan = columns;
      tr.append(td);
      body.replaceChildren(tr);
      return;
    }
    body.replaceChildren.apply(body, rows);
  }

  function cell(text, className) {
    return el("td", className, text);
  }

  const REGION_COLUMNS = 15;

  // One row per region; the gateway's own spans a row per pool whose routing keeps traffic in
  // it. Shown once some backend (or the gateway) has a region; "" is the unlabelled backends.
  function renderRegions(view) {
    const regions = (view && view.regions) || [];
    const rows = [];
    if (regions.some(function (r) { return r.region !== ""; })) {
      for (const r of regions) {
        const local = r.local || [];
        const tr = el("tr", local.length ? "region-here" : null);
        tr.dataset.region = r.region;
        const name = cell(r.region === "" ? "(none)" : r.region, "region-name");
        if (local.length) name.append(el("span", "here", "here"));
        const errors = r.error_rate == null ? "–" : fmtPct(r.error_rate);
        const traffic = [
          name, cell(fmtInt(r.backends), "num"), cell(fmtRate(r.requests_per_s), "num"),
          cell(errors, r.errors > 0 ? "num bad" : "num"),
          cell(fmtSeconds(r.ttft_p50), "num"), cell(fmtSeconds(r.ttft_p99), "num"),
          cell(fmtSeconds(r.e2e_p50), "num"), cell(fmtSeconds(r.e2e_p99), "num"),
        ];
        for (const td of traffic) {
          td.rowSpan = Math.max(1, local.length);
          tr.append(td);
        }
        if (!local.length) {
          const none = cell("");
          none.colSpan = REGION_COLUMNS - traffic.length;
          tr.append(none);
        }
        local.forEach(function (l, i) {
          const row = i === 0 ? tr : el("tr", "region-here");
          const phase = el("td");
          phase.append(el("span", "phase phase-" + token(l.phase), l.phase));
          row.append(cell(l.model, "pool-name"), phase, cell(fmtPct(l.keep), "num"), cell(fmtPct(l.spill), "num"),
            cell(fmtInt(l.spilled), "num"), cell(fmtInt(l.failovers), "num"), cell(fmtSeconds(l.last_failover_s), "num"));
          rows.push(row);
        });
        if (!local.length) rows.push(tr);
      }
    }
    fillTable("region-table", rows, REGION_COLUMNS, "no regions: no backend has a region label");
  }

  function renderSlos(pools) {
    const rows = [];
    for (const pool of pools) {
      for (const slo of pool.slo || []) {
        const alerts = slo.alerts || [];
        const tr = el("tr", alerts.length || !slo.met ? "slo-burning" : null);
        const asValue = slo.kind === "mean" ? fmtSeconds : fmtPct;
        tr.append(cell(pool.model, "pool-name"), cell(slo.name), cell(asValue(slo.target)),
          cell(asValue(slo.value), "num"), cell(fmtInt(slo.requests), "num"));
        for (const span of ["5m", "1h", "6h"]) {
          const burn = (slo.burn || {})[span];
          // A burn rate above 1 spends the error budget faster than the objective allows.
          tr.append(cell(burn == null ? "–" : burn.toFixed(2), burn > 1 ? "num burn-high" : "num"));
        }
        tr.append(cell(slo.met ? "✓" : "✗", slo.met ? "met-yes" : "met-no"));
        const alertCell = el("td");
        for (const alert of alerts) alertCell.append(el("span", "badge alert-" + token(alert), alert));
        tr.append(alertCell);
        rows.push(tr);
      }
    }
    fillTable("slo-table", rows, 10, "no objectives configured");
  }

  function renderTenants(tenants) {
    const rows = tenants.map(function (t) {
      const tr = el("tr");
      tr.append(cell(t.tenant), cell(fmtInt(t.requests), "num"), cell(fmtInt(t.prompt_tokens), "num"),
        cell(fmtInt(t.completion_tokens), "num"), cell(t.spend_usd == null ? "–" : t.spend_usd.toFixed(4), "num"));
      return tr;
    });
    fillTable("tenant-table", rows, 5, "no tenant traffic yet");
  }

  const EVENT_KNOWN_KEYS = ["time", "kind", "model", "backend", "reason", "for_s"];

  function renderEvents(events) {
    const list = document.getElementById("events");
    if (!events.length) {
      list.replaceChildren(el("li", "empty", "no events"));
      return;
    }
    const items = events.slice().reverse().map(function (ev) {
      const li = el("li", "event kind-" + token(ev.kind));
      li.append(el("span", "event-time", fmtClock(ev.time)), el("span", "event-kind", ev.kind));
      if (ev.backend) li.append(el("span", "event-backend", ev.backend));
      if (ev.reason) li.append(el("span", null, "(" + ev.reason + ")"));
      if (ev.for_s != null) li.append(el("span", null, "for " + Number(ev.for_s.toFixed(1)) + " s"));
      // Kinds this page does not know yet still show their fields.
      for (const key of Object.keys(ev)) {
        const value = ev[key];
        if (EVENT_KNOWN_KEYS.indexOf(key) < 0 && value != null && typeof value !== "object") {
          li.append(el("span", "event-extra", key + "=" + value));
        }
      }
      if (ev.model) li.append(el("span", "event-model", ev.model));
      return li;
    });
    list.replaceChildren.apply(list, items);
  }

  // ---- start ----

  function start() {
    charts = CHARTS.map(makeChart);
    fetch("/dashboard/snapshot", { cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (snap) { if (snap) onSnapshot(snap); })
      .catch(function () { /* the stream below reports the connection state */ });
    connect();
    setInterval(watchStale, 1000);
  }

  start();
})();
