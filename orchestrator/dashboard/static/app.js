// The dashboard's pages (#/ queue and sweeps, #/job/ID, #/sweep/ID, #/bill), refreshed by polling the read-only
// JSON API. Everything is built with textContent: job names and log lines are never parsed as HTML.
"use strict";
(function () {
  const main = document.getElementById("main");
  const statusEl = document.getElementById("status");
  let timer = null, generation = 0;

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else if (k === "onclick") node.addEventListener("click", v);
      else node.setAttribute(k, String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    return node;
  }

  const money = (v, cur) => v === null || v === undefined ? "—" : v.toFixed(v >= 100 ? 0 : 2) + (cur ? " " + cur : "");
  function dur(s) {
    if (s === null || s === undefined) return "—";
    s = Math.round(s);
    const hh = Math.floor(s / 3600), mm = Math.floor((s % 3600) / 60), ss = s % 60;
    return hh ? `${hh}h${String(mm).padStart(2, "0")}m` : mm ? `${mm}m${String(ss).padStart(2, "0")}s` : `${ss}s`;
  }
  const when = (t) => t ? new Date(t * 1000).toLocaleString() : "—";
  const stateBadge = (s) => h("span", { class: `state state-${s}`, text: s });

  async function getJSON(path) {
    const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
    const body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
    if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
    return body;
  }

  function setNav(which) {
    for (const id of ["nav-queue", "nav-bill"]) document.getElementById(id).classList.toggle("active", id === "nav-" + which);
  }

  // replaceChildren would write a null argument as the text "null".
  const put = (...nodes) => main.replaceChildren(...nodes.filter((n) => n !== null && n !== undefined));

  function showError(err) {
    main.replaceChildren(h("p", { class: "error", text: String(err.message || err) }));
  }

  // -- the queue ---------------------------------------------------------------------------
  function progressCell(r) {
    if (r.step === null || r.step === undefined) return h("td", { text: "—" });
    const total = r.total_steps;
    const bar = h("span", { class: "bar" }, h("span"));
    if (total) bar.firstChild.style.width = Math.min(100, 100 * r.step / total).toFixed(1) + "%";
    return h("td", {}, total ? bar : null, `${r.step}${total ? " / " + total : ""}`);
  }

  // -- sweeps ----------------------------------------------------------------------------------
  let sweepList = [];
  function sweepsTable() {
    if (!sweepList.length) return null;
    return h("table", { id: "sweeps" },
      h("thead", {}, h("tr", {}, ...["sweep", "name", "state", "trials", "objective"].map((t) => h("th", { text: t })))),
      h("tbody", {}, ...sweepList.map((s) => h("tr", { class: "sweep-row", "data-sweep-id": s.id, onclick: () => { location.hash = `#/sweep/${s.id}`; } },
        h("td", {}, h("a", { href: `#/sweep/${s.id}`, text: String(s.id) })), h("td", { text: s.name }),
        h("td", {}, stateBadge(s.state)), h("td", { text: `${s.trials} of ${s.planned}` }), h("td", { text: s.objective })))));
  }

  function renderSweep(d) {
    const cur = d.currency;
    const chart = window.OrchChart.line({ title: `${d.objective} against step, every trial`, xLabel: "step",
      markers: d.markers, series: d.curves.map((c) => ({ name: c.name, points: c.points, dots: c.state === "pruned" })) });
    const fmtv = (v) => v === null || v === undefined ? "—" : Number(v).toPrecision(4);
    const table = h("table", { id: "trials" },
      h("thead", {}, h("tr", {}, ...["job", "params", "state", d.objective, "steps", "cost"].map((t) => h("th", { text: t })))),
      h("tbody", {}, ...d.trials.map((t) => h("tr", { "data-state": t.state, onclick: () => { location.hash = `#/job/${t.id}`; } },
        h("td", {}, h("a", { href: `#/job/${t.id}`, text: String(t.id) })), h("td", { text: t.params_text }),
        h("td", {}, stateBadge(t.state)), h("td", { class: "num", text: fmtv(t.value) }),
        h("td", { class: "num", text: String(t.steps) }), h("td", { class: "num", text: money(t.cost, cur) })))));
    const best = d.best ? `job ${d.best.trial}, ${d.objective} = ${fmtv(d.best.value)}` : "no trial finished yet";
    put(
      h("h1", {}, `Sweep ${d.id} · ${d.name} `, stateBadge(d.state)),
      d.reason ? h("p", { class: "reason", text: d.reason }) : null,
      h("div", { class: "grid" }, kv("trials", `${d.trials.length} of ${d.trials_planned}`), kv("best", best),
        kv("steps", String(d.steps_total)), kv("cost", money(d.cost_total, cur)), kv("pruned", String(d.pruned)),
        kv("pruning saved", money(d.saved, cur) + " · " + dur(d.saved_seconds))),
      h("h2", { text: "Objective" }), h("div", { class: "charts", id: "charts" }, chart),
      h("h2", { text: "Trials (best first)" }), table);
  }

  function renderQueue(data) {
    const cur = data.currency;
    const active = data.jobs.filter((j) => j.state === "queued" || j.state === "running");
    const rows = data.jobs.map((r) => {
      const projected = r.projected_cost === null ? "—" : (r.projection_is_upper_bound ? "≤ " : "") + money(r.projected_cost, cur);
      const tr = h("tr", { class: "job-row", "data-job-id": r.id, "data-state": r.state, onclick: () => { location.hash = `#/job/${r.id}`; } },
        h("td", { class: "num" }, h("a", { href: `#/job/${r.id}`, text: String(r.id) })),
        h("td", { text: r.name }),
        h("td", {}, stateBadge(r.state)),
        h("td", { class: "num", text: r.attempt ? String(r.attempt) : "—" }),
        progressCell(r),
        h("td", { class: "num", text: r.eta_s === null ? "—" : dur(r.eta_s) }),
        h("td", { class: "num", text: dur(r.runtime_s) }),
        h("td", { class: "num", text: money(r.cost, cur) }),
        h("td", { class: "num", text: projected }),
        h("td", { class: "reason", text: r.state === "succeeded" ? (r.mirror_lag || "") : (r.reason || "") }));
      return tr;
    });
    const table = h("table", { id: "queue" },
      h("thead", {}, h("tr", {}, ...["id", "name", "state", "attempt", "progress", "ETA", "runtime", "cost", "projected", "why"]
        .map((t, i) => h("th", { class: [0, 3, 5, 6, 7, 8].includes(i) ? "num" : null, text: t })))),
      h("tbody", {}, ...rows));
    const daemon = data.daemon_pid ? `daemon running (pid ${data.daemon_pid})` : "no daemon running: `orch daemon start` runs the queue";
    const waiting = (data.recovery || []).map((r) => h("tr", {},
      h("td", { text: r.uid.slice(0, 12) }), h("td", { text: r.name }), h("td", { text: r.state }),
      h("td", { text: r.waiting_since ? new Date(r.waiting_since * 1000).toLocaleString() : "—" }),
      h("td", { class: "num", text: String(r.launches) }), h("td", { text: r.market || "—" }),
      h("td", { class: "reason", text: r.note || "" })));
    const recovery = waiting.length ? [
      h("h1", { text: "Waiting for a replacement machine" }),
      h("table", { id: "recovery" },
        h("thead", {}, h("tr", {}, ...["job", "name", "state", "since", "launches", "market", "note"]
          .map((t, i) => h("th", { class: i === 4 ? "num" : null, text: t })))),
        h("tbody", {}, ...waiting))] : [];
    put(
      ...recovery,
      sweepList.length ? h("h1", { text: "Sweeps" }) : null, sweepsTable(),
      h("h1", { text: "Queue" }),
      h("p", { class: "muted", id: "summary", text: `${active.length} queued or running, ${data.jobs.length} in all · ${daemon}` }),
      data.jobs.length ? table : h("p", { class: "muted", text: "No jobs yet: `orch submit job.toml`." }));
  }

  // -- a job ---------------------------------------------------------------------------------
  function groupCharts(metrics) {
    const cols = metrics.columns || [];
    const groups = [];
    const losses = cols.filter((c) => /loss/.test(c));
    const scores = cols.filter((c) => !/loss/.test(c) && /^val_|^test_/.test(c));
    if (losses.length) groups.push(["Loss", losses]);
    if (scores.length) groups.push(["Validation metrics", scores]);
    if (cols.includes("lr")) groups.push(["Learning rate", ["lr"]]);
    if (cols.includes("samples_per_s")) groups.push(["Samples per second", ["samples_per_s"]]);
    const used = new Set(groups.flatMap((g) => g[1]));
    for (const c of cols) if (!used.has(c)) groups.push([c, [c]]);
    return groups;
  }

  function kv(k, v) { return h("div", { class: "kv" }, h("div", { class: "k", text: k }), h("div", { class: "v", text: v })); }

  // What the job ran with: the summary, and a link to each file of runs/ID/provenance/ (served as text).
  function provenance(d) {
    const p = d.provenance || { files: {} };
    const names = Object.keys(p.files || {});
    if (!names.length) return h("p", { class: "muted", id: "provenance", text: "none recorded yet (written when the first attempt starts)" });
    const facts = [p.packages ? `${p.packages} packages` : null, p.python ? `python ${p.python}` : null,
      p.torch ? `torch ${p.torch}${p.cuda ? " (CUDA " + p.cuda + ")" : ""}` : null].filter(Boolean).join(", ");
    const changed = d.events.filter((e) => e.kind === "env_changed").length;
    return h("div", { id: "provenance" },
      h("p", { text: `${facts}${facts ? " · " : ""}${changed ? "environment changed " + changed + " time(s) since the first attempt" : "every attempt in the first attempt's environment"}` }),
      h("p", {}, ...names.map((n) => h("a", { class: "prov-file", href: `/api/job/${d.id}/provenance/${n}`, text: `${n} (${p.files[n]} B)  ` }))));
  }

  function renderJob(d) {
    const cur = d.currency;
    const charts = h("div", { class: "charts", id: "charts", "data-rows": d.metrics.rows });
    for (const [title, cols] of groupCharts(d.metrics)) {
      charts.appendChild(window.OrchChart.line({ title, xLabel: "step", markers: d.markers,
        series: cols.map((c) => ({ name: c, points: d.metrics.series[c] || [] })) }));
    }
    const events = h("table", { id: "events" }, h("thead", {}, h("tr", {}, h("th", { text: "when" }), h("th", { text: "event" }), h("th", { text: "detail" }))),
      h("tbody", {}, ...d.events.slice().reverse().map((e) => h("tr", { class: `ev-${e.kind}`, "data-kind": e.kind },
        h("td", { text: when(e.at) }), h("td", { class: "event-kind", text: e.kind }), h("td", {}, h("pre", { class: "reason", text: e.detail }))))));
    const attempts = h("table", { id: "attempts" }, h("thead", {}, h("tr", {}, ...["#", "started", "ran", "resumed from", "reached", "outcome", "exit", "where"].map((t) => h("th", { text: t })))),
      h("tbody", {}, ...d.attempts.map((a) => h("tr", { "data-outcome": a.outcome },
        h("td", { text: String(a.n) }), h("td", { text: when(a.started_at) }),
        h("td", { text: a.ended_at ? dur(a.ended_at - a.started_at) : "running" }),
        h("td", { text: a.resumed_from_step === null ? "—" : String(a.resumed_from_step) }),
        h("td", { text: a.step_reached === null ? "—" : String(a.step_reached) }),
        h("td", { text: a.outcome || "running" }),
        h("td", { text: a.signal ? `signal ${a.signal}` : a.exit_code === null ? "—" : String(a.exit_code) }),
        // a Ray attempt: its submission id and node, in the words `orch show` uses (views/ray_where.py)
        h("td", { class: "where", text: a.where || "—" })))));
    const ckpts = h("table", { id: "checkpoints" }, h("thead", {}, h("tr", {}, h("th", { text: "checkpoint" }), h("th", { class: "num", text: "step" }), h("th", { class: "num", text: "MB" }))),
      h("tbody", {}, ...d.checkpoints.map((c) => h("tr", {}, h("td", { text: c.path.split("/").pop() }),
        h("td", { class: "num", text: c.step === null ? "—" : String(c.step) }), h("td", { class: "num", text: (c.bytes / 1e6).toFixed(1) })))));
    const progress = d.step === null || d.step === undefined ? "—" : `${d.step}${d.total_steps ? " / " + d.total_steps : ""}`;
    // What `orch show` says beside the numbers (views/job_view.py): the deadline, the bill, trackers, the mirror.
    const deadline = d.deadline ? h("p", { class: d.deadline_at_risk ? "reason late" : "reason", id: "deadline",
      text: `deadline ${d.deadline}; projected finish ${d.projected_finish ? when(d.projected_finish) : "—"}` +
        (d.projected_finish_is_lower_bound ? " or later" : "") + (d.deadline_at_risk ? " (late)" : "") }) : null;
    const bill = d.bill && d.bill.billed_s > 0 ? h("table", { id: "job-bill" },
      h("thead", {}, h("tr", {}, ...["part", "cost", "time"].map((t) => h("th", { text: t })))),
      h("tbody", {}, ...Object.keys(d.bill.money).map((part) => h("tr", { "data-part": part },
        h("td", { text: part }), h("td", { class: "num", text: money(d.bill.money[part], cur) }),
        h("td", { class: "num", text: dur(d.bill.seconds[part]) }))))) : h("p", { class: "muted", text: "nothing billed yet" });
    const advice = ((d.bill && d.bill.advice) || []).map((line) => h("p", { class: "reason", text: line }));
    const trackers = Object.entries((d.tracking && d.tracking.backends) || {}).map(([name, run]) =>
      h("p", { class: "tracker", text: `${name}: run ${run.run_id || "—"} ${[run.project, run.mode, run.url].filter(Boolean).join(" ")}` +
        (run.warning ? ` — not logging: ${run.warning}` : "") }));
    const mirror = d.mirror ? h("p", { id: "mirror", text: `mirror ${d.mirror.url}: step ${d.mirror.step === null ? "—" : d.mirror.step}, ` +
      `${d.mirror.pending} upload(s) waiting` + (d.mirror.error ? `; ERROR ${d.mirror.error}` : "") }) : null;
    put(
      h("h1", {}, `Job ${d.id} · ${d.name} `, stateBadge(d.state)),
      d.reason ? h("p", { class: "reason", text: d.reason }) : null,
      deadline, mirror,
      h("div", { class: "grid" }, kv("attempt", String(d.attempt || "—")), kv("progress", progress),
        kv("ETA", d.eta_s === null ? "—" : dur(d.eta_s)), kv("cost so far", money(d.cost, cur)),
        kv("projected", d.projected_cost === null ? "—" : money(d.projected_cost, cur)),
        kv("steps lost", String(d.steps_lost || 0)), kv("waste", money(d.waste_cost, cur) + " · " + dur(d.waste_s)),
        kv("GPU-hours", d.gpu_hours.toFixed(3))),
      h("h2", { text: "Curves" }),
      d.metrics.rows ? charts : h("p", { class: "muted", id: "charts", "data-rows": 0, text: "No metrics.csv rows yet (the built-in runner logs every 10 steps)." }),
      h("h2", { text: "Bill" }), bill, ...advice,
      trackers.length ? h("h2", { text: "Trackers" }) : null, ...trackers,
      h("h2", { text: "Attempts" }), attempts,
      h("h2", { text: "Events" }), events,
      h("h2", { text: "Checkpoints" }), d.checkpoints.length ? ckpts : h("p", { class: "muted", text: "none" }),
      h("h2", { text: "Provenance" }), provenance(d),
      h("h2", { text: `Log (attempt ${d.attempt || "—"}, last lines)` }), h("pre", { class: "log", id: "log", text: d.log_tail || "(empty)" }));
  }

  // -- the bill ------------------------------------------------------------------------------
  function renderBill(d) {
    const cur = d.currency;
    const rows = d.jobs.map((j) => h("tr", { "data-job-id": j.id },
      h("td", { class: "num" }, h("a", { href: `#/job/${j.id}`, text: String(j.id) })), h("td", { text: j.name }), h("td", {}, stateBadge(j.state)),
      h("td", { class: "num", text: dur(j.runtime_s) }), h("td", { class: "num", text: j.gpu_hours.toFixed(3) }),
      h("td", { class: "num", text: money(j.cost, cur) }), h("td", { class: "num", text: money(j.waste, cur) }),
      h("td", { class: "num", text: j.steps_lost ? String(j.steps_lost) : "—" }),
      h("td", { class: "num", text: j.budget_left === null ? "—" : money(j.budget_left, cur) })));
    const table = h("table", { id: "bill" }, h("thead", {}, h("tr", {}, ...["id", "name", "state", "runtime", "GPU-h", "cost", "preemption waste", "steps redone", "budget left"]
      .map((t, i) => h("th", { class: i > 2 ? "num" : null, text: t })))), h("tbody", {}, ...rows));
    const tl = d.timeline;
    const chart = tl.series.length ? window.OrchChart.line({ title: "Cost over time (cumulative)", time: true, xLabel: "time",
      width: 1100, height: 300,
      series: tl.series.map((s) => ({ name: s.name, points: s.points,
        label: `${s.name}: ${money(s.points.length ? s.points[s.points.length - 1][1] : 0, cur)}` })) }) : h("p", { class: "muted", text: "Nothing billed yet." });
    put(
      h("h1", { text: "The bill" }),
      h("div", { class: "grid" }, kv("total", money(d.total, cur)), kv("jobs", money(d.jobs_cost, cur)), kv("idle", money(d.idle_cost, cur)),
        kv("preemption waste", money(d.waste, cur)), kv("GPU-hours", d.gpu_hours.toFixed(3)),
        kv("budget left", d.budget_left === null ? "no [budget] total" : money(d.budget_left, cur)),
        d.savings !== undefined ? kv("spot savings", money(d.savings, cur)) : null),
      h("h2", { text: "Over time" }), chart,
      h("p", { class: "muted", text: "Each job's cost is spread over its attempts; the idle cost over the gaps between them (the totals are exact). " + d.note.charAt(0).toUpperCase() + d.note.slice(1) + "." }),
      h("h2", { text: "By job" }), table,
      h("h2", { text: "Where the money went" }), ledgerBars(d.ledger, cur));
  }

  // The goodput ledger: one bar per job, its parts stacked in proportion to what they cost.
  const PARTS = [["useful", "useful training"], ["redone", "redone steps"], ["checkpoint", "checkpoint stall"],
    ["startup", "start-up and restore"], ["data_wait", "data wait"], ["eval", "evaluation"]];
  function ledgerBars(ledger, cur) {
    if (!ledger) return null;
    const jobs = ledger.jobs.filter((j) => j.billed > 0);
    if (!jobs.length) return h("p", { class: "muted", text: "Nothing billed yet." });
    const legend = h("div", { class: "legend" }, ...PARTS.map(([k, label]) => h("span", {}, h("span", { class: `sw part-${k}` }), label)));
    const rows = jobs.map((j) => h("div", { class: "stack-row", "data-job-id": j.id },
      h("span", { class: "stack-name", text: `${j.id} ${j.name}` }),
      h("span", { class: "stack" }, ...PARTS.filter(([k]) => j.money[k] > 0).map(([k, label]) => {
        const part = h("span", { class: `part part-${k}`, "data-part": k, "data-money": j.money[k].toFixed(6),
          title: `${label}: ${money(j.money[k], cur)} (${dur(j.seconds[k])})` });
        part.style.width = (100 * j.money[k] / j.billed).toFixed(2) + "%";  // CSSOM: the CSP allows no style attribute
        return part;
      })),
      h("span", { class: "num stack-total", text: money(j.billed, cur) })));
    const advice = ledger.jobs.flatMap((j) => j.advice.map((a) => `job ${j.id} (${j.name}): ${a}`)).concat(ledger.advice);
    return h("div", { class: "card", id: "ledger" }, legend, ...rows,
      advice.length ? h("ul", { class: "advice" }, ...advice.map((a) => h("li", { text: a }))) : null);
  }

  // -- routing and polling ---------------------------------------------------------------------
  function route() {
    const hash = location.hash || "#/";
    const m = hash.match(/^#\/job\/(\d+)/);
    if (m) return { page: "job", path: `/api/job/${m[1]}`, render: renderJob, every: 3000, nav: "queue" };
    const sw = hash.match(/^#\/sweep\/(\d+)/);
    if (sw) return { page: "sweep", path: `/api/sweep/${sw[1]}`, render: renderSweep, every: 3000, nav: "queue" };
    if (hash.startsWith("#/bill")) return { page: "bill", path: "/api/bill", render: renderBill, every: 5000, nav: "bill" };
    return { page: "queue", path: "/api/queue", render: renderQueue, every: 2000, nav: "queue" };
  }

  async function refresh(r, gen) {
    try {
      const data = await getJSON(r.path);
      if (r.page === "queue") sweepList = await getJSON("/api/sweeps").catch(() => []);
      if (gen !== generation) return;
      const y = window.scrollY;
      r.render(data);
      window.scrollTo(0, y);
      document.body.setAttribute("data-page", r.page);
      document.body.setAttribute("data-loaded", "1");
      statusEl.textContent = "updated " + new Date().toLocaleTimeString();
    } catch (err) {
      if (gen === generation) { showError(err); statusEl.textContent = "not updated: " + err.message; }
    }
    if (gen === generation) timer = setTimeout(() => refresh(r, gen), r.every);
  }

  function start() {
    clearTimeout(timer);
    generation += 1;
    const r = route();
    setNav(r.nav);
    document.body.removeAttribute("data-loaded");
    refresh(r, generation);
  }

  window.addEventListener("hashchange", start);
  start();
})();
