// Run page: while the run is in flight, append its events as they arrive and reload
// once it finishes (the model requests are written at the turn boundary).
(() => {
  const root = document.getElementById("run");
  if (!root || root.dataset.finished) return;
  const runId = root.dataset.runId;
  const timeline = document.getElementById("timeline");
  let lastSeq = Math.max(0, ...[...timeline.querySelectorAll("[data-seq]")].map((li) => Number(li.dataset.seq)));
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/ws/runs/${runId}/`);
  // The run may have moved on between rendering and connecting: catch up from the log.
  socket.onopen = async () => {
    const response = await fetch(`/api/runs/${runId}/events/?after=${lastSeq}`, { credentials: "same-origin" });
    if (response.ok) for (const event of await response.json()) apply({ ...event, run_id: Number(runId) });
  };
  socket.onmessage = (message) => apply(JSON.parse(message.data));
  function apply(event) {
    if (event.seq <= lastSeq) return;
    lastSeq = event.seq;
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
    timeline.appendChild(li);
  }
})();
