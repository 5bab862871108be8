// The vcasync status page: polls ./data and renders it. No dependencies, no build step.
// Every value from the server is written with textContent or as an SVG attribute, never as HTML.
"use strict";

(function () {
  const TOKEN_KEY = "vcasync-status-token";
  const SVG = "http://www.w3.org/2000/svg";
  let refreshMs = 2000;
  let timer = null;

  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
  }

  function setToken(value) {
    try { sessionStorage.setItem(TOKEN_KEY, value); } catch (e) { /* private mode: not kept */ }
  }

  function takeTokenFromFragment() {
    // #token=... is never sent to the server (nor logged); it is kept for this tab, then removed.
    const m = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
    if (m) {
      setToken(decodeURIComponent(m[1]));
      history.replaceState(null, "", location.pathname + location.search);
    }
  }

  function get(obj, path) {
    let node = obj;
    for (const part of path.split(".")) {
      if (node === null || typeof node !== "object" || !(part in node)) { return undefined; }
      node = node[part];
    }
    return node;
  }

  function fmt(value) {
    if (value === undefined || value === null) { return "-"; }
    if (typeof value === "number" && !Number.isInteger(value)) { return value.toFixed(2); }
    return String(value);
  }

  function ago(seconds) {
    if (seconds < 60) { return seconds.toFixed(0) + " s ago"; }
    if (seconds < 3600) { return (seconds / 60).toFixed(0) + " min ago"; }
    return (seconds / 3600).toFixed(1) + " h ago";
  }

  function clear(el) { while (el.firstChild) { el.removeChild(el.firstChild); } }

  function row(tbody, cells, cls) {
    const tr = document.createElement("tr");
    if (cls) { tr.className = cls; }
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = fmt(c);
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
    return tr;
  }

  function svg(parent, name, attrs, text) {
    const el = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) { el.setAttribute(k, String(v)); }
    if (text !== undefined) { el.textContent = text; }
    parent.appendChild(el);
    return el;
  }

  function banner(text, kind) {
    const el = document.getElementById("banner");
    el.textContent = text || "";
    el.className = "banner " + (kind || "");
    el.hidden = !text;
  }

  function fields(doc) {
    for (const el of document.querySelectorAll("[data-field]")) {
      el.textContent = fmt(get(doc, el.getAttribute("data-field")));
    }
  }

  function progress(doc) {
    const units = doc.units || {};
    const total = doc.units.total;
    const pct = total ? 100 * (units.done || 0) / total : 0;
    document.getElementById("progress-bar").style.width = pct.toFixed(1) + "%";
    doc.progress = pct.toFixed(1) + " %";
  }

  function parked(status) {
    const tbody = document.querySelector("#parked tbody");
    clear(tbody);
    const items = Object.entries(status.parked || {});
    if (!items.length) { row(tbody, ["none", ""], "muted"); }
    for (const [unit, why] of items) { row(tbody, [unit, why]); }
  }

  function workers(live) {
    const states = live.worker_states || {};
    document.getElementById("worker-states").textContent = Object.entries(states)
      .map(([k, v]) => v + " " + k.replace("_", " ")).join(", ");
    const tbody = document.querySelector("#workers tbody");
    clear(tbody);
    for (const w of live.worker_rows || []) {
      const tr = row(tbody, [w.name ? w.name + " (" + w.id + ")" : w.id, w.state.replace("_", " "),
        ago(w.last_seen_s), w.done, w.failures], "state-" + w.state);
      tr.setAttribute("data-worker", w.id);
    }
  }

  function staleness(status) {
    const chart = document.getElementById("staleness");
    clear(chart);
    const buckets = get(status, "metrics.staleness.buckets") || {};
    const labels = Object.keys(buckets);
    let previous = 0;
    const counts = labels.map((le) => { const n = buckets[le] - previous; previous = buckets[le]; return n; });
    const top = Math.max(1, ...counts);
    const w = 300 / Math.max(1, labels.length);
    labels.forEach((le, i) => {
      const h = 90 * counts[i] / top;
      const bar = svg(chart, "rect", { x: 10 + i * w, y: 110 - h, width: w - 4, height: h, class: "bar" });
      svg(bar, "title", {}, "<= " + le + ": " + counts[i]);
      svg(chart, "text", { x: 10 + i * w + (w - 4) / 2, y: 125, "text-anchor": "middle" }, le);
      if (counts[i]) { svg(chart, "text", { x: 10 + i * w + (w - 4) / 2, y: 106 - h, "text-anchor": "middle" }, counts[i]); }
    });
  }

  function curve(live) {
    const chart = document.getElementById("curve");
    const legend = document.getElementById("curve-legend");
    clear(chart);
    clear(legend);
    const curves = Object.entries(live.curves || {}).filter(([, pts]) => pts.length);
    document.getElementById("curve-empty").hidden = curves.length > 0;
    chart.style.display = curves.length ? "" : "none";
    if (!curves.length) { return; }
    const versions = curves.flatMap(([, pts]) => pts.map((p) => p[1]));
    const vmin = Math.min(...versions);
    const vmax = Math.max(vmin + 1, ...versions);
    svg(chart, "line", { x1: 30, y1: 140, x2: 310, y2: 140, class: "axis" });
    svg(chart, "text", { x: 30, y: 155 }, "v" + vmin);
    svg(chart, "text", { x: 310, y: 155, "text-anchor": "end" }, "v" + vmax);
    curves.forEach(([name, pts], i) => {
      const values = pts.map((p) => p[2]);
      const lo = Math.min(...values);
      const hi = Math.max(lo + 1e-9, ...values);
      const xy = pts.map((p) => [30 + 280 * (p[1] - vmin) / (vmax - vmin), 135 - 125 * (p[2] - lo) / (hi - lo)]);
      svg(chart, "polyline", { points: xy.map((q) => q[0].toFixed(1) + "," + q[1].toFixed(1)).join(" "),
        class: "series s" + i });
      const last = pts[pts.length - 1];
      const item = document.createElement("span");
      item.className = "legend s" + i;
      item.setAttribute("data-curve", name);
      item.textContent = name + " " + last[2].toFixed(4) + " (v" + last[1] + "; range " +
        lo.toFixed(3) + " to " + hi.toFixed(3) + ")";
      legend.appendChild(item);
    });
  }

  function events(live) {
    const tbody = document.querySelector("#events tbody");
    clear(tbody);
    const list = live.events || [];
    if (!list.length) { row(tbody, ["", "none yet", "", "", ""], "muted"); }
    for (const e of list) {
      row(tbody, [new Date(e.t * 1000).toLocaleTimeString(), e.kind.replace("_", " "), e.worker, e.unit,
        e.detail], "event-" + e.kind);
    }
  }

  function render(data) {
    const status = data.status || {};
    const live = data.live || {};
    const units = status.units || {};
    const doc = Object.assign({}, status, {
      units: Object.assign({}, units, {
        total: Object.values(units).reduce((a, b) => a + b, 0),
      }),
      merges_per_s: live.merges_per_s,
      storage: status.storage || {},
    });
    progress(doc);
    fields(doc);
    parked(status);
    workers(live);
    staleness(status);
    curve(live);
    events(live);
    const err = status.error ? "coordinator error: " + status.error : "";
    banner(err, err ? "error" : "");
    document.body.setAttribute("data-version", String(status.version));
    document.body.setAttribute("data-loaded", "true");
    document.getElementById("updated").textContent = new Date(data.now * 1000).toLocaleTimeString();
    if (typeof data.refresh_s === "number" && data.refresh_s > 0) { refreshMs = data.refresh_s * 1000; }
  }

  function askToken(message) {
    const form = document.getElementById("auth");
    document.getElementById("auth-message").textContent = message;
    form.hidden = false;
  }

  async function poll() {
    const headers = {};
    const t = token();
    if (t) { headers.Authorization = "Bearer " + t; }
    try {
      const resp = await fetch("data", { headers: headers, cache: "no-store", credentials: "omit" });
      const body = await resp.json();
      if (resp.status === 401 || resp.status === 403) {
        askToken(body.message || "a status read token is needed");
        banner("not authorised: " + (body.error || resp.status), "error");
      } else if (!resp.ok) {
        banner("the coordinator answered " + resp.status + ": " + (body.message || ""), "error");
      } else {
        document.getElementById("auth").hidden = true;
        render(body);
      }
    } catch (e) {
      banner("the coordinator is unreachable (" + e.name + "); retrying", "warn");
    }
    timer = setTimeout(poll, refreshMs);
  }

  document.addEventListener("DOMContentLoaded", () => {
    takeTokenFromFragment();
    document.getElementById("auth").addEventListener("submit", (ev) => {
      ev.preventDefault();
      setToken(document.getElementById("auth-token").value.trim());
      document.getElementById("auth-token").value = "";
      if (timer !== null) { clearTimeout(timer); }
      poll();
    });
    poll();
  });
}());
