// Run page: while the run is in flight, append its events as they arrive and reload
// once it finishes (the model requests are written at the turn boundary). The socket
// reconnects with a backoff, and every (re)connect catches up from the stored log (OP-1).
(() => {
  const root = document.getElementById("run");
  if (!root || root.dataset.finished) return;
  const runId = root.dataset.runId;
  const timeline = document.getElementById("timeline");
  // A set, not the highest seq: a run's log has more than one writer (a subagent's approval
  // is written by another worker), so an event may arrive after a later one.
  const seen = new Set([...timeline.querySelectorAll("[data-seq]")].map((li) => Number(li.dataset.seq)));
  // Everything up to here is shown; the catch-up asks for what comes after it.
  function contiguous() {
    let n = 0;
    while (seen.has(n + 1)) n += 1;
    return n;
  }
  async function catchUp() {
    const response = await fetch(`/api/runs/${runId}/events/?after=${contiguous()}`, { credentials: "same-origin" });
    if (response.ok) for (const event of await response.json()) apply({ ...event, run_id: Number(runId) });
  }
  let retryDelay = 500;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/runs/${runId}/`);
    // The run may have moved on between rendering (or the last socket) and this one.
    let openedAt = 0;
    socket.onopen = () => { openedAt = Date.now(); root.dataset.live = "1"; catchUp(); };
    socket.onmessage = (message) => {
      const event = JSON.parse(message.data);
      apply(event);
      // A gap before this event: one was not delivered live (a Redis restart loses what was in
      // flight); the log has it.
      if (event.seq > contiguous() + 1) catchUp();
    };
    socket.onclose = (close) => {
      delete root.dataset.live;
      if (window.ccSocketLived(openedAt, close)) retryDelay = 500;
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 8000);
    };
  }
  function apply(event) {
    if (seen.has(event.seq)) return;
    seen.add(event.seq);
    if (event.type === "run_finished") { location.reload(); return; }
    const li = document.createElement("li");
    li.className = `event event-${event.type}`;
    li.dataset.seq = event.seq;
    const type = document.createElement("span");
    type.className = "type";
    type.textContent = event.type;
    const summary = document.createElement("span");
    summary.className = "summary";
    summary.textContent = event.type === "text_delta" ? event.payload.text : JSON.stringify(event.payload).slice(0, 400);
    li.append(type, summary);
    timeline.querySelector(".muted")?.remove();
    // In sequence order, wherever it arrived from.
    const later = [...timeline.querySelectorAll("[data-seq]")].find((other) => Number(other.dataset.seq) > event.seq);
    timeline.insertBefore(li, later || null);
  }
  connect();
})();
