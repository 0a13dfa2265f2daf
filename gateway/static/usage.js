// The usage page: asks for a token, keeps it in this tab's sessionStorage and sends it only
// as an Authorization header from fetch (never in a URL, so never in a log or history).
// Data: GET /v1/usage (admin: every producer with its quota), GET /v1/usage/series and,
// for the keys nobody reads, GET /v1/usage/unused/summary and GET /v1/usage/unused.
"use strict";

(function () {
  const KEY = "mercury.usage.token";
  const $ = (id) => document.getElementById(id);
  const charts = {};
  let selected = null;
  let rows = [];
  // The default range, "since the first activity": its start (epoch seconds), found at
  // each load (`findStart`), so a new deployment fills the charts instead of a sliver at
  // the right edge of a day; null when nothing happened yet (then the last hour).
  let autoSince = null;
  const ACTIVITY = ["writes", "deletes", "duplicates", "held", "refused", "expiries"];

  function token() { return sessionStorage.getItem(KEY); }

  function status(msg, isError) {
    const el = $("status");
    el.textContent = msg;
    el.className = isError ? "error" : "";
  }

  async function api(path) {
    const t = token();
    const r = await fetch(path, {
      headers: { Authorization: "Bearer " + t, Accept: "application/json" },
      cache: "no-store",
      referrerPolicy: "no-referrer",
    });
    if (r.status === 401) {
      sessionStorage.removeItem(KEY);
      throw new Error("the token was refused (401); enter it again");
    }
    const body = await r.json();
    if (!r.ok) throw new Error(body.detail || ("HTTP " + r.status));
    return body;
  }

  function iso(t) { return new Date(t * 1000).toISOString().slice(0, 19) + "Z"; }

  function rangeParams() {
    if ($("range").value === "auto") {
      if (autoSince === null) return "since=-1h&step=1m";
      // a margin before the first activity (5 % of the span, at least 5 minutes); the
      // server picks the finest step that fits
      const span = Date.now() / 1000 - autoSince;
      return "since=" + encodeURIComponent(iso(autoSince - Math.max(300, span * 0.05)));
    }
    const [since, step] = $("range").value.split("|");
    return "since=" + encodeURIComponent(since) + "&step=" + step;
  }

  function seriesPath(producer, params) {
    const p = producer ? "producer=" + encodeURIComponent(producer) + "&" : "";
    return "/v1/usage/series?" + p + (params || rangeParams());
  }

  function active(p) { return ACTIVITY.some((k) => p[k]) || p.bytes > 0; }

  // The first activity the token can see (the admin: any producer's): the first active
  // day of the last year, then, when that is within three days, its first active minute.
  async function findStart() {
    const days = await api(seriesPath(null, "since=-365d&step=1d"));
    const day = days.points.find(active);
    if (!day) return null;
    if (Date.now() / 1000 - day.t > 3 * 86400) return day.t;
    const mins = await api(seriesPath(null, "since=" + encodeURIComponent(iso(day.t)) + "&step=1m"));
    const minute = mins.points.find(active);
    return minute ? minute.t : day.t;
  }

  // SI prefixes, three significant digits: "12.3 MB", "950 k", "4". Every number on the
  // page and on every chart axis (uPlot's own labels, "12,000,000", outgrew the axis).
  function si(n, unit) {
    if (n === null || n === undefined) return "–";
    const u = unit || "";
    const abs = Math.abs(n);
    for (const [f, prefix] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
      if (abs >= f) return +(n / f).toPrecision(3) + " " + prefix + u;
    }
    return String(+n.toPrecision(3)) + (u ? " " + u : "");
  }

  function fmt(n) { return si(n); }

  function summary(s) {
    const pts = s.points;
    const stored = pts.map((p) => p.bytes).filter((b) => b !== null);
    const sum = (k) => pts.reduce((a, p) => a + (p[k] || 0), 0);
    return {
      // from the state the range began with (finer than one step) to the last point
      growth: stored.length
        ? stored[stored.length - 1] - (s.start && s.start.bytes !== null ? s.start.bytes : stored[0])
        : 0,
      writes: sum("writes"),
      held: sum("held"),
      // Refusals apart: a 429 is a write the rate quota turned away (the client must send
      // it again later); a 413 a request larger than the quota could ever admit, which
      // the SDK splits and sends again at once, so its ops are usually written after all.
      refused_429: sum("refused_429"),
      refused_413: sum("refused_413"),
      // keys the root expired at their deadline: not the producer's deletes, no quota's
      expiries: sum("expiries"),
    };
  }

  function renderTable() {
    const tbody = $("producers").querySelector("tbody");
    tbody.replaceChildren();
    for (const r of rows) {
      const tr = document.createElement("tr");
      tr.dataset.producer = r.producer;
      if (r.producer === selected) tr.className = "selected";
      const cap = r.quota ? r.quota.max_bytes_stored : null;
      const cells = [r.producer, si(r.growth, "B"), si(r.bytes, "B"), si(cap, "B"),
        r.used_pct === null || r.used_pct === undefined ? "–" : r.used_pct.toFixed(1) + " %",
        fmt(r.keys), fmt(r.writes), fmt(r.held), fmt(r.refused_429), fmt(r.refused_413),
        fmt(r.expiries)];
      for (const c of cells) {
        const td = document.createElement("td");
        td.textContent = c;
        tr.appendChild(td);
      }
      tr.addEventListener("click", () => { selected = r.producer; renderTable(); showCharts(); });
      tbody.appendChild(tr);
    }
  }

  function plot(id, title, s, columns, cap, unit) {
    const el = $(id);
    if (charts[id]) charts[id].destroy();
    const xs = s.points.map((p) => p.t);
    const data = [xs];
    const series = [{}];
    const colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];
    columns.forEach(([key, label], i) => {
      data.push(s.points.map((p) => p[key]));
      // Stored bytes are carried forward between snapshots: join them, show each point.
      series.push({ label, stroke: colors[i % colors.length], width: 1.5, spanGaps: true,
        points: { show: (u, si) => u.data[si].filter((v) => v !== null).length < 50 } });
    });
    if (cap) {
      data.push(xs.map(() => cap));
      series.push({ label: "cap", stroke: "#d62728", dash: [6, 4], width: 1 });
    }
    const first = data[1];
    el.dataset.points = String(xs.length);
    el.dataset.nonzero = String(first.filter((v) => v).length);
    el.dataset.sum = String(first.reduce((a, v) => a + (v || 0), 0));
    // every plotted column's sum, in order (the page's tests tell the lines apart by it)
    el.dataset.sums = data.slice(1, 1 + columns.length)
      .map((col) => String(col.reduce((a, v) => a + (v || 0), 0))).join("|");
    el.dataset.since = String(xs[0]);
    el.replaceChildren();
    // The y axis in SI units; the labels drawn are kept in data-ylabels (the canvas has
    // no text to read back), for the page's tests.
    const yValues = (u, splits) => {
      const labels = splits.map((v) => si(v, unit));
      el.dataset.ylabels = labels.join("|");
      return labels;
    };
    charts[id] = new uPlot(
      { title, width: Math.max(el.clientWidth, 520), height: 220, series,
        scales: { x: { time: true } }, axes: [{}, { size: 70, values: yValues }] },
      data, el);
  }

  async function showCharts() {
    if (!selected) return;
    $("charts-title").textContent = "Producer " + selected;
    const s = await api(seriesPath(selected === "(all)" ? null : selected));
    // Expiries apart from deletes: the root removed those keys at their deadline, no
    // producer asked (and no quota counted them).
    plot("chart-writes", "writes / deletes / duplicates / expiries per " + s.step, s,
      [["writes", "writes"], ["deletes", "deletes"], ["duplicates", "duplicates"],
        ["expiries", "expiries (deadline passed)"]]);
    plot("chart-bytes-written", "bytes written per " + s.step, s,
      [["bytes_written", "bytes written"]], null, "B");
    plot("chart-quota", "ops held / refused (429) / too large (413) per " + s.step, s,
      [["held", "held"], ["refused_429", "refused (429)"],
        ["refused_413", "too large (413: the SDK splits and resends)"]]);
    plot("chart-stored", "stored bytes (and the cap)", s, [["bytes", "stored bytes"]],
      s.max_bytes_stored, "B");
  }

  function cells(tr, values) {
    for (const c of values) {
      const td = document.createElement("td");
      td.textContent = c;
      tr.appendChild(td);
    }
  }

  function unusedDays() {
    const d = Number($("unused-days").value);
    return d > 0 ? d : 30;
  }

  async function showUnusedKeys(producer, keyspace) {
    const q = "producer=" + encodeURIComponent(producer) + "&keyspace=" +
      encodeURIComponent(keyspace) + "&days=" + unusedDays() + "&limit=100";
    const page = await api("/v1/usage/unused?" + q);
    const tbody = $("unused-keys").querySelector("tbody");
    tbody.replaceChildren();
    for (const k of page.keys) {
      const tr = document.createElement("tr");
      cells(tr, [k.key !== undefined ? k.key : "base64:" + k.key_b64, si(k.bytes, "B"), k.version]);
      tbody.appendChild(tr);
    }
    $("unused-keys").dataset.keys = String(page.keys.length);
    $("unused-keys-title").textContent = "Unused keys of " + producer + " in " + keyspace +
      (page.next_cursor ? " (first " + page.keys.length + "; the API pages through all)" : "");
  }

  async function loadUnused() {
    const s = await api("/v1/usage/unused/summary?days=" + unusedDays());
    const tbody = $("unused").querySelector("tbody");
    tbody.replaceChildren();
    for (const r of s.rows) {
      const tr = document.createElement("tr");
      tr.dataset.producer = r.producer;
      tr.dataset.keyspace = r.keyspace;
      tr.dataset.unused = String(r.unused_keys);
      cells(tr, [r.producer, r.keyspace, fmt(r.keys), fmt(r.unused_keys),
        si(r.unused_bytes, "B"), fmt(r.too_new)]);
      tr.addEventListener("click", () => {
        showUnusedKeys(r.producer, r.keyspace).catch((e) => status(e.message, true));
      });
      tbody.appendChild(tr);
    }
    const since = new Date(s.tracked_since * 1000).toISOString().slice(0, 16) + "Z";
    $("unused-note").textContent = "Reads are tracked since " + since + "." +
      (s.complete ? "" : " Incomplete: the window starts before tracking began, or a node " +
        "dropped reads; a listed key may have been read.") +
      (s.truncated ? " The scan stopped early: totals are partial." : "") +
      " Click a row for its keys.";
    $("unused").dataset.loaded = String(Date.now());
  }

  async function load() {
    if (!token()) { status("enter a token to see usage"); return; }
    status("loading…");
    try {
      if ($("range").value === "auto") autoSince = await findStart();
      const own = await api(seriesPath(null));
      if (own.producer !== null) {  // a producer's token: its own usage only
        const sm = summary(own);
        const last = own.points.length ? own.points[own.points.length - 1] : {};
        rows = [Object.assign({ producer: own.producer, bytes: last.bytes, keys: last.keys,
          quota: { max_bytes_stored: own.max_bytes_stored }, used_pct: null }, sm)];
      } else {
        const all = await api("/v1/usage");
        rows = await Promise.all(all.producers.map(async (r) => {
          const s = await api(seriesPath(r.producer));
          return Object.assign({}, r, summary(s));
        }));
      }
      rows.sort((a, b) => b.growth - a.growth || b.writes - a.writes);
      if (!rows.some((r) => r.producer === selected)) {
        selected = rows.length ? rows[0].producer : null;
      }
      renderTable();
      await showCharts();
      await loadUnused();
      status("updated " + new Date().toISOString().slice(0, 19) + "Z");
    } catch (err) {
      status(err.message, true);
    }
  }

  $("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("token").value.trim());
    $("token").value = "";
    load();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    rows = [];
    renderTable();
    for (const id of ["unused", "unused-keys"]) $(id).querySelector("tbody").replaceChildren();
    status("token forgotten");
  });
  $("range").addEventListener("change", load);
  $("unused-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    $("unused-keys").querySelector("tbody").replaceChildren();
    $("unused-keys-title").textContent = "";
    loadUnused().catch((e) => status(e.message, true));
  });
  load();
})();
