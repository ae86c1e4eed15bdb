// Observability dashboard: draw the server's snapshot with Chart.js, then redraw it
// whenever the server pushes a fresh one over ws/dashboard/ (sent when a run finishes).
(() => {
  const root = document.getElementById("dashboard");
  if (!root) return;
  const liveState = document.getElementById("live-state");
  const COLORS = { uncached: "#8a94a8", cache_write: "#e0a030", cache_read: "#2e9d6a", output: "#2f5fd0" };
  const SERIES = ["#2f5fd0", "#2e9d6a", "#c2410c", "#7c3aed", "#0891b2", "#be185d"];
  const percent = (v) => (v === null || v === undefined ? "—" : `${(v * 100).toFixed(1)}%`);
  const tokens = (v) => (v === null || v === undefined ? "—" : v.toLocaleString("en-US"));
  const charts = {};

  function el(tag, text, attrs = {}) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = text;
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    return node;
  }
  function link(href, text) { return el("a", text, { href }); }

  function code(text) { return el("code", text); }
  // Rebuild a table body from rows; numbers are right-aligned like the server's render.
  function fillTable(id, rows, empty, cells, numFrom) {
    const body = document.querySelector(`#${id} tbody`);
    const width = document.querySelectorAll(`#${id} thead th`).length;
    body.replaceChildren();
    for (const row of rows) {
      const tr = el("tr");
      for (const [i, value] of cells(row).entries()) {
        const td = el("td", typeof value === "object" ? null : String(value), numFrom !== undefined && i >= numFrom ? { class: "num" } : {});
        if (typeof value === "object") td.appendChild(value);
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
    if (!rows.length) {
      const tr = el("tr");
      tr.appendChild(el("td", empty, { colspan: String(width), class: "muted" }));
      body.appendChild(tr);
    }
  }

  function chart(id, config) {
    if (typeof Chart === "undefined") return; // the figures and tables still show
    if (charts[id]) {
      charts[id].data = config.data;
      charts[id].update();
    } else {
      config.options = { animation: false, responsive: true, maintainAspectRatio: false, ...config.options };
      charts[id] = new Chart(document.getElementById(id), config);
    }
  }

  function render(snapshot) {
    document.getElementById("cache-ratio").textContent = percent(snapshot.totals.cache_ratio);
    const base = snapshot.totals.ratio_prompt === snapshot.totals.prompt
      ? "" : `; the ratio is over the ${tokens(snapshot.totals.ratio_prompt)} whose server reports its cache`;
    document.getElementById("prompt-total").textContent = `${tokens(snapshot.totals.prompt)} prompt tokens${base}`;
    for (const category of snapshot.categories) {
      root.querySelector(`[data-total="${category.key}"]`).textContent = tokens(category.total);
    }
    document.getElementById("in-flight-count").textContent = snapshot.in_flight.length;

    const inFlight = document.getElementById("in-flight");
    inFlight.replaceChildren();
    for (const run of snapshot.in_flight) {
      const li = el("li");
      li.append(link(`/runs/${run.id}/`, `run ${run.id}`), ` ${run.status} · ${run.title}`);
      inFlight.appendChild(li);
    }
    if (!snapshot.in_flight.length) inFlight.appendChild(el("li", "None.", { class: "muted" }));

    const body = document.querySelector("#recent-runs tbody");
    body.replaceChildren();
    for (const run of snapshot.recent_runs) {
      const tr = el("tr");
      const cells = [
        link(`/runs/${run.id}/`, `#${run.id}`), link(`/conversations/${run.conversation_id}/`, run.title),
        run.status, run.model, tokens(run.prompt), tokens(run.output), percent(run.cache_ratio),
      ];
      cells.forEach((value, i) => {
        const td = el("td", typeof value === "string" ? value : null, i >= 4 ? { class: "num" } : {});
        if (typeof value !== "string") td.appendChild(value);
        tr.appendChild(td);
      });
      body.appendChild(tr);
    }
    if (!snapshot.recent_runs.length) {
      const tr = el("tr");
      tr.appendChild(el("td", "No runs yet.", { colspan: "7", class: "muted" }));
      body.appendChild(tr);
    }

    const byDay = document.querySelector("#by-day tbody");
    byDay.replaceChildren();
    for (const row of snapshot.by_day) {
      const tr = el("tr");
      [row.day, row.model, tokens(row.uncached), tokens(row.cache_write), tokens(row.cache_read), tokens(row.output), percent(row.cache_ratio)]
        .forEach((value, i) => tr.appendChild(el("td", value, i >= 2 ? { class: "num" } : {})));
      byDay.appendChild(tr);
    }
    if (!snapshot.by_day.length) {
      const tr = el("tr");
      tr.appendChild(el("td", "No usage recorded yet.", { colspan: "7", class: "muted" }));
      byDay.appendChild(tr);
    }

    const cache = snapshot.savings.cache;
    document.getElementById("saved-cache").textContent = tokens(cache.saved_tokens);
    document.getElementById("saved-cache-note").textContent = cache.cache_read === null || cache.cache_read === undefined
      ? "the model server reports no cache figures" : `input-token equivalents: ${tokens(cache.cache_read)} reads at 0.1×`;
    document.getElementById("saved-deferral").textContent = tokens(snapshot.savings.deferral.saved_tokens);
    document.getElementById("saved-deferral-note").textContent =
      `${tokens(snapshot.savings.deferral.withheld_per_request)} withheld schema tokens × ${tokens(snapshot.savings.deferral.requests)} requests`;
    fillTable("top-activations", snapshot.top_activations, "No deferred tool was loaded.",
      (row) => [code(row.tool_name), row.activations, row.runs, row.direct, row.search], 1);
    fillTable("retrieval-misses", snapshot.retrieval_misses, "No misses.",
      (row) => [row.query, link(`/runs/${row.run_id}/`, `#${row.run_id}`)]);
    fillTable("compactions", snapshot.compactions, "No compactions.",
      (row) => [row.rung, row.passes, tokens(row.before), tokens(row.after), tokens(row.freed)], 1);

    const ratioScale = { min: 0, max: 1, ticks: { callback: (v) => `${Math.round(v * 100)}%` } };
    chart("chart-ratio-time", {
      type: "line",
      data: {
        labels: snapshot.ratio_over_time.labels,
        datasets: snapshot.ratio_over_time.series.map((series, i) => ({
          label: series.model, data: series.points, spanGaps: true,
          borderColor: SERIES[i % SERIES.length], backgroundColor: SERIES[i % SERIES.length],
        })),
      },
      options: { scales: { y: ratioScale } },
    });

    const days = [...new Set(snapshot.by_day.map((row) => row.day))];
    chart("chart-tokens", {
      type: "bar",
      data: {
        labels: days,
        datasets: snapshot.categories.map((category) => ({
          label: category.label,
          backgroundColor: COLORS[category.key],
          data: days.map((day) => snapshot.by_day.filter((row) => row.day === day).reduce((sum, row) => sum + row[category.key], 0)),
        })),
      },
      options: { scales: { x: { stacked: true }, y: { stacked: true } } },
    });

    chart("chart-conversations", {
      type: "bar",
      data: {
        labels: snapshot.by_conversation.map((row) => row.title),
        datasets: [{ label: "cache ratio", backgroundColor: COLORS.cache_read, data: snapshot.by_conversation.map((row) => row.cache_ratio) }],
      },
      options: { indexAxis: "y", scales: { x: ratioScale }, plugins: { legend: { display: false } } },
    });
    root.dataset.generatedAt = snapshot.generated_at;
  }

  render(JSON.parse(document.getElementById("dashboard-snapshot").textContent));

  let retryDelay = 500;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/dashboard/`);
    let openedAt = 0;
    socket.onopen = async () => {
      liveState.textContent = "live";
      root.dataset.live = "1";
      openedAt = Date.now();
      // What was pushed before this socket joined is lost: after any reconnect, however quick
      // (OP-1), and on the first connect too, since the figures are only computed for a
      // dashboard that is open (the page's own snapshot may be older than a run that just ended).
      const response = await fetch("/dashboard/data/", { credentials: "same-origin" });
      if (response.ok) render(await response.json());
    };
    socket.onmessage = (message) => {
      const data = JSON.parse(message.data);
      if (data.type === "dashboard_update") render(data.snapshot);
    };
    socket.onclose = (close) => {
      liveState.textContent = "reconnecting…";
      delete root.dataset.live;
      if (window.ccSocketLived(openedAt, close)) retryDelay = 500;
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 8000);
    };
  }
  connect();
})();
