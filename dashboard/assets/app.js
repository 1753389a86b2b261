// app.js — the medley dashboard page: polls the JSON documents of `medley dashboard`
// (dashboard/dash.h) and draws them. Everything from the server is data: the DOM is built
// with createElement and textContent only (never innerHTML), so markup in a batch id, a
// custom_id or a worker name shows as text and cannot run.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const TERMINAL = new Set(["completed", "failed", "cancelled", "expired"]);
  const state = { config: null, token: "", armed: new Map() };

  const $ = (id) => document.getElementById(id);

  // el("td", {class: "num"}, "12", child): attributes by setAttribute, children appended as
  // nodes (strings become text nodes).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c !== undefined && c !== null) e.append(c);
    }
    return e;
  }

  const list = (v) => (Array.isArray(v) ? v : []);

  // Each cell gets its column's heading as data-label: on a phone the rows become cards
  // that print it beside the value (style.css).
  function labelCells(table) {
    const heads = [...table.tHead.rows[0].cells].map((th) => th.textContent);
    for (const tr of table.tBodies[0].rows) {
      [...tr.cells].forEach((td, i) => td.setAttribute("data-label", heads[i] || ""));
    }
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = String(text);
    return e;
  }

  // ---- formatting -------------------------------------------------------------------------

  function fmtDuration(s) {
    if (s === null || s === undefined || !isFinite(s) || s < 0) return "--";
    s = Math.round(s);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  }

  function fmtUsd(v) {
    if (v === null || v === undefined || !isFinite(v)) return "--";
    return "$" + v.toFixed(v >= 100 ? 0 : v >= 1 ? 2 : 4);
  }

  function fmtNum(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return "--";
    return v.toFixed(digits);
  }

  function fmtBytes(b) {
    if (!b) return "";
    return (b / 2 ** 30).toFixed(b >= 10 * 2 ** 30 ? 0 : 1) + " GiB";
  }

  function fmtAge(ms) {
    if (ms === null || ms === undefined) return "never";
    return fmtDuration(Math.max(0, ms) / 1000) + " ago";
  }

  function statusBadge(s) {
    return el("span", { class: "status " + String(s || "").replace(/[^a-z_]/g, "") }, s || "?");
  }

  // ---- HTTP -------------------------------------------------------------------------------

  // With a token typed (the admin token, or the read token of --read-token-file), every
  // read carries it: a dashboard started with a read token answers 401 without it.
  async function getJSON(path) {
    const headers = state.token ? { Authorization: "Bearer " + state.token } : {};
    const r = await fetch(path, { cache: "no-store", headers });
    const body = await r.json().catch(() => ({ error: "not JSON (HTTP " + r.status + ")" }));
    if (!r.ok) throw new Error(body.error || "HTTP " + r.status);
    return body;
  }

  function showMessage(text, bad) {
    const m = $("action-msg");
    m.textContent = text;
    m.className = "action-msg" + (bad ? " bad" : "");
    m.hidden = false;
  }

  // An action button: the first click arms it for 4 s, the second sends the request.
  function actionButton(key, label, path) {
    const armed = (state.armed.get(key) || 0) > Date.now();
    const b = el("button", { type: "button", class: armed ? "armed" : null, "data-action": key },
      armed ? "confirm " + label : label);
    b.addEventListener("click", async () => {
      if (!((state.armed.get(key) || 0) > Date.now())) {
        state.armed.set(key, Date.now() + 4000);
        b.textContent = "confirm " + label;
        b.className = "armed";
        return;
      }
      state.armed.delete(key);
      if (!state.token) {
        showMessage(label + ": enter the admin token first", true);
        return;
      }
      try {
        const r = await fetch(path, {
          method: "POST", cache: "no-store",
          headers: { Authorization: "Bearer " + state.token },
        });
        const body = await r.json().catch(() => ({}));
        if (r.ok) showMessage(label + " " + (body.batch || body.worker) + ": " + body.status, false);
        else showMessage(label + ": " + (body.error || "HTTP " + r.status), true);
      } catch (err) {
        showMessage(label + ": " + err.message, true);
      }
      refresh();
    });
    return b;
  }

  // ---- batches ----------------------------------------------------------------------------

  function renderBatches(doc) {
    const rows = doc.batches.map((b) => {
      const pct = b.total > 0 ? (100 * b.done) / b.total : 0;
      const failPct = b.total > 0 ? (100 * b.failed) / b.total : 0;
      const bar = el("span", { class: "bar" },
        el("span", { style: null }), el("span", { class: "failed" }));
      bar.children[0].style.width = (pct - failPct).toFixed(2) + "%";
      bar.children[0].style.float = "left";
      bar.children[1].style.width = failPct.toFixed(2) + "%";
      bar.children[1].style.float = "left";
      const codes = Object.entries(b.failures || {}).sort((x, y) => y[1] - x[1])
        .map(([c, n]) => c + " ×" + n).join(", ");
      const failed = el("td", { class: "num c-failed" }, String(b.failed));
      if (codes) failed.append(el("div", { class: "small c-codes" }, codes));
      if (b.errors) failed.append(el("div", { class: "small" }, b.errors));
      const cost = el("td", { class: "num c-cost", "data-usd": b.cost_usd }, fmtUsd(b.cost_usd));
      if (b.cost_partial) cost.append(el("div", { class: "small" }, "summing…"));
      const act = el("td", { class: "c-actions" });
      if (state.config && state.config.actions && !TERMINAL.has(b.status) &&
          b.status !== "cancelling") {
        act.append(actionButton("cancel:" + b.id, "cancel",
          "/api/cancel?batch=" + encodeURIComponent(b.id)));
      }
      return el("tr", { "data-batch": b.id },
        el("td", { class: "id c-id" }, b.id),
        el("td", { class: "c-status" }, statusBadge(b.status)),
        el("td", { class: "c-model" }, b.model,
          b.tenant && b.tenant !== "default" ? el("div", { class: "small c-tenant" },
            "tenant " + b.tenant) : null,
          b.unserved ? el("span", {
            class: "badge unserved", title: "no live worker lists this model: the batch waits " +
              "until one serves it (a cancel answers its lines at once)" }, "no worker serves it")
            : null),
        el("td", { class: "c-progress" }, bar, pct.toFixed(1) + "%"),
        el("td", { class: "num c-done" }, b.done + "/" + b.total),
        failed,
        el("td", { class: "num c-rate" }, fmtNum(b.rate_per_s, 1) + "/s"),
        el("td", { class: "num c-eta" }, TERMINAL.has(b.status) ? "done" : fmtDuration(b.eta_s)),
        cost,
        el("td", { class: "num c-mtok" }, fmtUsd(b.usd_per_mtok),
          b.embedding_inputs > 0 ? el("div", { class: "small c-embedded" },
            "embedded " + fmtNum(b.embedding_inputs, 0) + " inputs, " +
            fmtNum(b.embedding_tokens, 0) + " tok") : null),
        act);
    });
    $("batches").tBodies[0].replaceChildren(...rows);
    labelCells($("batches"));
    $("batches-empty").hidden = rows.length > 0;
    $("batches-count").textContent = "(" + doc.batches.length + " of " + doc.indexed + ")";
    renderTenants(doc);
  }

  // The batches shown, summed by tenant (`medley api`'s keys, docs/api.md "Tenants"); shown
  // once a tenant other than "default" has a batch.
  function renderTenants(doc) {
    const by = new Map();
    for (const b of doc.batches) {
      const name = b.tenant || "default";
      const t = by.get(name) || { batches: 0, running: 0, done: 0, total: 0, failed: 0,
        rate: 0, cost: 0 };
      t.batches += 1;
      t.done += b.done || 0;
      t.total += b.total || 0;
      t.failed += b.failed || 0;
      t.cost += isFinite(b.cost_usd) ? b.cost_usd : 0;
      if (!TERMINAL.has(b.status)) {
        t.running += 1;
        t.rate += isFinite(b.rate_per_s) ? b.rate_per_s : 0;
      }
      by.set(name, t);
    }
    const names = [...by.keys()].sort();
    const rows = names.map((name) => {
      const t = by.get(name);
      return el("tr", { "data-tenant": name },
        el("td", { class: "id c-tenant-name" }, name),
        el("td", { class: "num c-tbatches" }, String(t.batches)),
        el("td", { class: "num c-trunning" }, String(t.running)),
        el("td", { class: "num c-tdone" }, t.done + "/" + t.total),
        el("td", { class: "num c-tfailed" }, String(t.failed)),
        el("td", { class: "num c-trate" }, fmtNum(t.rate, 1) + "/s"),
        el("td", { class: "num c-tcost" }, fmtUsd(t.cost)));
    });
    $("tenants").tBodies[0].replaceChildren(...rows);
    labelCells($("tenants"));
    $("tenants-section").hidden = !names.some((n) => n !== "default");
    $("tenants-count").textContent = "(" + names.length + ", over the batches above)";
  }

  // ---- fleet ------------------------------------------------------------------------------

  function renderFleet(doc) {
    const rows = doc.workers.map((w) => {
      const hb = w.heartbeat || {};
      const devices = el("td", { class: "c-devices" });
      for (const d of list(hb.devices)) {
        const obj = typeof d === "object" && d !== null;
        const name = obj ? d.type + (d.name ? " (" + d.name + ")" : "") : String(d);
        const extra = obj
          ? [fmtBytes(d.memory_bytes), d.tokens_per_s !== undefined
            ? fmtNum(d.tokens_per_s, 1) + " tok/s" : ""].filter(Boolean).join(", ") : "";
        devices.append(el("div", null, name, extra ? el("span", { class: "small" }, " " + extra) : null));
      }
      const serves = el("td", { class: "c-serves" });
      for (const m of list(hb.models)) {
        if (typeof m !== "object" || m === null) continue;
        const line = el("div", null, String(m.model),
          el("span", { class: "small" }, " " + (m.live ?? 0) + "/" + (m.capacity ?? 0) + " slots"));
        if (m.not_serving) line.append(el("div", { class: "small" }, m.not_serving));
        serves.append(line);
      }
      if (w.replicas.length) serves.append(el("div", { class: "small" }, "replicas " + w.replicas.join(", ")));
      const id = el("td", { class: "id c-worker" }, w.id);
      if (w.stale) id.append(el("span", { class: "badge stale" }, "stale"));
      const st = el("td", { class: "c-state" }, statusBadge(w.state));
      if (w.drain) st.append(el("span", { class: "badge drain" }, "drain asked"));
      const beat = el("td", { class: "c-heartbeat" }, fmtAge(w.age_ms));
      if (w.heartbeat_error) beat.append(el("div", { class: "small" }, w.heartbeat_error));
      const act = el("td", { class: "c-actions" });
      if (state.config && state.config.actions && w.state === "drained") {
        // held after a drain (a restarted pod or unit): undrain lets it serve again
        act.append(actionButton("undrain:" + w.id, "undrain",
          "/api/undrain?worker=" + encodeURIComponent(w.id)));
      } else if (state.config && state.config.actions && !w.drain && w.state !== "draining") {
        act.append(actionButton("drain:" + w.id, "drain",
          "/api/drain?worker=" + encodeURIComponent(w.id)));
      }
      return el("tr", { "data-worker": w.id, class: w.stale ? "stale" : null },
        id, st,
        el("td", { class: "c-host" }, hb.host !== undefined ? hb.host + ":" + hb.pid : ""),
        devices, serves, beat,
        el("td", { class: "num c-completed" }, String(hb.completed ?? "")),
        el("td", { class: "num c-failed" }, String(hb.failed ?? "")),
        el("td", { class: "num c-inflight" }, String(hb.in_flight ?? "")),
        el("td", { class: "num c-tps" }, fmtNum(hb.tokens_per_s, 1)),
        el("td", { class: "num c-usdh" }, hb.usd_per_hour ? fmtUsd(hb.usd_per_hour) : "--"),
        act);
    });
    $("fleet").tBodies[0].replaceChildren(...rows);
    labelCells($("fleet"));
    $("fleet-empty").hidden = rows.length > 0;
    const stale = doc.workers.filter((w) => w.stale).length;
    $("fleet-count").textContent = "(" + doc.workers.length + " workers" +
      (stale ? ", " + stale + " stale" : "") + "; heartbeat every " + doc.heartbeat_ms / 1000 + " s)";
  }

  // ---- plan -------------------------------------------------------------------------------

  // One row per replica: its stages as boxes (width by layers) on their GPUs, then predicted
  // and measured tokens/s as two bars on a common scale, with $/M tokens.
  function renderPlan(doc) {
    const box = $("plan");
    const notes = $("plan-notes");
    const p = doc.plan;
    $("plan-version").textContent = doc.version !== null ? "(version " + doc.version + ")" : "";
    notes.replaceChildren();
    if (!p) {
      $("plan-summary").textContent = doc.error || "No plan published (medley scheduler writes one).";
      box.replaceChildren();
      return;
    }
    const t = p.totals || {};
    $("plan-summary").textContent = [
      p.objective, p.created_at, p.reason,
      fmtNum(t.tokens_per_s, 0) + " tok/s predicted",
      fmtUsd(t.usd_per_hour) + "/h", fmtUsd(t.usd_per_mtok) + "/M tok",
    ].filter((x) => x !== undefined && x !== null && x !== "").join(" · ");
    const reps = list(p.replicas).filter((r) => typeof r === "object" && r !== null);
    // Wide: replica, stages and bars side by side. Narrow (a phone): the three stacked in a
    // 360-unit-wide picture that fits the screen at its own size, nothing cut off.
    const narrow = box.clientWidth > 0 && box.clientWidth < 700;
    const L = narrow
      ? { W: 360, rowH: 140, head: 0, sx: 4, sy: 38, sw: 352, bx: 4, by: 88, bw: 150, tx: 160 }
      : { W: 960, rowH: 58, head: 22, sx: 190, sy: 4, sw: 430, bx: 640, by: 4, bw: 150, tx: 796 };
    const top = 22;
    const H = top + L.rowH * Math.max(reps.length, 1) + 8;
    const s = svg("svg", { class: "plan" + (narrow ? " narrow" : ""),
      viewBox: "0 0 " + L.W + " " + H, role: "img",
      "aria-label": "plan: " + reps.length + " replicas" });
    if (narrow) {
      s.append(svg("text", { x: 4, y: 14, class: "muted" }, "replica · stages · tokens/s predicted / measured"));
    } else {
      s.append(svg("text", { x: 4, y: 14, class: "muted" }, "replica"),
        svg("text", { x: 190, y: 14, class: "muted" }, "stages on GPUs (width: layers)"),
        svg("text", { x: 640, y: 14, class: "muted" }, "tokens/s: predicted / measured"));
    }
    // a label cut to the characters that fit w units (about 7 units a character)
    const fit = (text, w) => {
      const n = Math.max(1, Math.floor((w - 8) / 7));
      return text.length > n ? text.slice(0, Math.max(1, n - 1)) + "…" : text;
    };
    let scale = 1;
    for (const r of reps) {
      const m = (doc.measured || {})[r.id] || {};
      scale = Math.max(scale, r.predicted_tokens_per_s || 0, m.tokens_per_s || 0);
    }
    reps.forEach((r, i) => {
      const y = top + i * L.rowH;
      const g = svg("g", { "data-replica": r.id, transform: "translate(0," + y + ")" });
      if (narrow) {
        g.append(svg("text", { x: 4, y: 16, class: "label" }, fit(r.id, 200)),
          svg("text", { x: 4, y: 32, class: "muted" },
            fit(r.model + " · " + fmtUsd(r.usd_per_hour) + "/h", 352)));
      } else {
        g.append(svg("text", { x: 4, y: 18, class: "label" }, r.id),
          svg("text", { x: 4, y: 34, class: "muted" }, r.model),
          svg("text", { x: 4, y: 48, class: "muted" }, fmtUsd(r.usd_per_hour) + "/h"));
      }
      const stages = list(r.stages).filter((st) => typeof st === "object" && st !== null);
      const span = (st) => (Array.isArray(st.layers) && st.layers.length === 2
        ? [Number(st.layers[0]), Number(st.layers[1])] : [0, 1]);
      const layers = stages.reduce((n, st) => n + Math.max(1, span(st)[1] - span(st)[0] || 1), 0) || 1;
      let x = L.sx;
      stages.forEach((st, k) => {
        const [lo, hi] = span(st);
        const w = Math.max(40, (L.sw * Math.max(1, hi - lo || 1)) / layers) - 4;
        const gpus = list(st.gpus).join(", ");
        const sg = svg("g", { class: "stage-box" });
        sg.append(svg("title", {}, "stage " + k + ": " + st.gpu_type + " ×" + st.tp +
            ", layers " + lo + "–" + (hi - 1) + "\n" + gpus),
          svg("rect", { x: x, y: L.sy, width: w, height: 46, rx: 4, class: "stage" }),
          svg("text", { x: x + 5, y: L.sy + 15, class: "label" },
            fit("S" + k + " " + st.gpu_type + " ×" + st.tp, w)),
          svg("text", { x: x + 5, y: L.sy + 28, class: "muted" }, fit("layers " + lo + "–" + (hi - 1), w)),
          svg("text", { x: x + 5, y: L.sy + 41, class: "muted" }, fit(gpus, Math.min(w, 200))));
        g.append(sg);
        x += w + 4;
      });
      const m = (doc.measured || {})[r.id] || {};
      const pred = r.predicted_tokens_per_s || 0, meas = m.tokens_per_s || 0;
      g.append(svg("rect", { x: L.bx, y: L.by + 4, height: 14, width: Math.max(1, (L.bw * pred) / scale), class: "pred" }),
        svg("rect", { x: L.bx, y: L.by + 24, height: 14, width: Math.max(1, (L.bw * meas) / scale), class: "meas" }),
        svg("text", { x: L.tx, y: L.by + 15, class: "label c-pred" },
          fmtNum(pred, 1) + " · " + fmtUsd(r.usd_per_mtok) + "/M"),
        svg("text", { x: L.tx, y: L.by + 35, class: "label c-meas" },
          fmtNum(meas, 1) + " · " + fmtUsd(m.usd_per_mtok) + "/M"));
      s.append(g);
    });
    box.replaceChildren(s);
    if (list(p.idle_gpus).length) notes.append(el("li", null, "idle GPUs: " + p.idle_gpus.join(", ")));
    for (const n of list(p.notes)) notes.append(el("li", null, String(n)));
  }

  // ---- DLQ --------------------------------------------------------------------------------

  function renderDlq(doc) {
    const out = [];
    let total = 0;
    for (const q of doc.queues) {
      total += q.length;
      out.push(el("h3", null, q.model, el("span", { class: "muted" },
        " " + q.length + " dead letter" + (q.length === 1 ? "" : "s") +
        (q.length > q.entries.length ? ", newest " + q.entries.length + " shown" : ""))));
      const rows = q.entries.map((d) => el("tr", { "data-entry": d.entry_id },
        el("td", { class: "c-time" }, new Date(d.time_ms).toISOString().replace("T", " ").slice(0, 19)),
        el("td", { class: "id c-custom-id" }, d.custom_id ?? "(none)"),
        el("td", { class: "id c-batch" }, d.batch ?? ""),
        el("td", { class: "c-reason small" }, d.reason ?? ""),
        el("td", { class: "id c-worker" }, d.worker ?? ""),
        el("td", { class: "line" }, d.line_head === undefined || d.line_head === null
          ? el("span", { class: "muted c-hidden" }, "hidden (" + d.line_bytes +
            " bytes; --dlq-lines shows the start)")
          : el("code", null, d.line_head + (d.line_bytes > d.line_head.length ? "…" : "")))));
      const table = el("table", { class: "dlq cards", "data-model": q.model },
        el("thead", null, el("tr", null, el("th", null, "Time (UTC)"), el("th", null, "custom_id"),
          el("th", null, "Batch"), el("th", null, "Reason"), el("th", null, "Worker"),
          el("th", null, "Line"))),
        el("tbody", null, ...rows));
      labelCells(table);
      out.push(el("div", { class: "scroll" }, table));
    }
    if (!out.length) out.push(el("p", { class: "muted" }, "The dead-letter queues are empty."));
    $("dlq").replaceChildren(...out);
    $("dlq-count").textContent = "(" + total + ")";
  }

  // ---- loop -------------------------------------------------------------------------------

  const parts = [
    ["/api/batches", renderBatches], ["/api/fleet", renderFleet],
    ["/api/plan", renderPlan], ["/api/dlq", renderDlq],
  ];
  let busy = false;

  async function refresh() {
    if (busy) return;
    busy = true;
    const errors = [];
    await Promise.all(parts.map(async ([path, render]) => {
      try {
        render(await getJSON(path));
      } catch (err) {
        errors.push(path + ": " + err.message);
      }
    }));
    busy = false;
    const conn = $("conn");
    conn.textContent = errors.length ? "error" : "live";
    conn.className = "conn " + (errors.length ? "bad" : "ok");
    conn.title = errors.join("\n");
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.setAttribute("data-refreshed", String(Date.now()));
  }

  async function start() {
    try {
      state.config = await getJSON("/api/config");
    } catch (err) {
      $("conn").textContent = "dashboard unreachable: " + err.message;
      $("conn").className = "conn bad";
      setTimeout(start, 2000);
      return;
    }
    $("source").textContent = state.config.redis + " " + state.config.prefix;
    if (state.config.actions || state.config.read_token) {
      $("admin").hidden = false;
      $("token-label").textContent = state.config.actions ? "Admin token" : "Read token";
      $("admin").addEventListener("submit", (ev) => ev.preventDefault());
      const input = $("token");
      input.value = sessionStorage.getItem("medley-admin-token") || "";
      state.token = input.value;
      input.addEventListener("input", () => {
        state.token = input.value.trim();
        sessionStorage.setItem("medley-admin-token", state.token);
      });
    }
    await refresh();
    setInterval(refresh, state.config.refresh_ms);
  }

  document.addEventListener("DOMContentLoaded", start);
})();
