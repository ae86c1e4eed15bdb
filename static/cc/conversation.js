// Live conversation page: send through the API, stream run events over a websocket,
// and catch up from the stored event log after a reconnect (events carry a seq).
(() => {
  const root = document.getElementById("conversation");
  if (!root) return;
  const conversationId = root.dataset.conversationId;
  const messages = document.getElementById("messages");
  const statusLine = document.getElementById("status");
  const form = document.getElementById("composer");
  const input = document.getElementById("composer-input");
  const cancelButton = document.getElementById("cancel");
  const csrf = document.querySelector("input[name=csrfmiddlewaretoken]").value;
  const runs = new Map(); // run id -> {lastSeq, article, text}
  let activeRun = root.dataset.activeRun ? Number(root.dataset.activeRun) : null;

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function runState(runId) {
    if (!runs.has(runId)) {
      const article = el("article", "message assistant");
      article.dataset.runId = runId;
      article.appendChild(el("header", null, "assistant"));
      messages.appendChild(article);
      runs.set(runId, { lastSeq: 0, article, text: null });
    }
    return runs.get(runId);
  }

  function toolDetails(summary, body) {
    const details = el("details", "tool");
    details.appendChild(el("summary", null, summary));
    details.appendChild(el("pre", null, body));
    return details;
  }

  function apply(event) {
    const state = runState(event.run_id);
    if (event.seq <= state.lastSeq) return; // already shown (live and catch-up overlap)
    state.lastSeq = event.seq;
    const p = event.payload;
    switch (event.type) {
      case "run_started":
        statusLine.textContent = `Run ${event.run_id} started on ${p.provider}/${p.model}.`;
        break;
      case "text_delta":
        if (!state.text) { state.text = el("div", "text"); state.article.appendChild(state.text); }
        state.text.textContent += p.text;
        break;
      case "tool_call":
        state.text = null;
        state.article.appendChild(toolDetails(`tool call ${p.name}`, JSON.stringify(p.input, null, 2)));
        break;
      case "tool_result":
        state.article.appendChild(toolDetails(`tool result ${p.name}`, JSON.stringify(p.output, null, 2)));
        break;
      case "usage":
        statusLine.textContent = `Step ${p.step}: ${p.input_tokens} input, ${p.cache_read_input_tokens} cache read, ${p.output_tokens} output tokens.`;
        break;
      case "approval_requested": {
        // RN-4: the run waits for a person; the decision goes through the API like any client's.
        const box = el("div", "approval");
        box.dataset.approvalId = p.approval_id;
        box.appendChild(toolDetails(`${p.name} needs your approval`, JSON.stringify(p.input, null, 2)));
        const row = el("div", "row");
        for (const [label, decision] of [["Approve", "approve"], ["Deny", "deny"]]) {
          const button = el("button", decision === "deny" ? "secondary" : null, label);
          button.type = "button";
          button.addEventListener("click", () => decide(p.approval_id, decision, box));
          row.appendChild(button);
        }
        box.appendChild(row);
        state.article.appendChild(box);
        statusLine.textContent = `Waiting for your approval of ${p.name}.`;
        break;
      }
      case "approval_decided": {
        const box = state.article.querySelector(`[data-approval-id="${p.approval_id}"]`);
        if (box) { box.querySelector(".row")?.remove(); box.appendChild(el("p", "muted", `${p.decision}.`)); }
        break;
      }
      case "run_finished":
        statusLine.textContent = p.status === "succeeded" ? "Run finished." : `Run ${p.status}. ${p.error || ""}`;
        if (activeRun === event.run_id) { activeRun = null; cancelButton.hidden = true; }
        break;
    }
  }

  async function decide(approvalId, decision, box) {
    const response = await fetch(`/api/approvals/${approvalId}/${decision}/`, {
      method: "POST", credentials: "same-origin", headers: { "X-CSRFToken": csrf },
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      statusLine.textContent = body.detail || `Error ${response.status}`;
      return;
    }
    box.querySelector(".row")?.remove();
  }

  async function catchUp(runId) {
    const state = runState(runId);
    const response = await fetch(`/api/runs/${runId}/events/?after=${state.lastSeq}`, { credentials: "same-origin" });
    if (!response.ok) return;
    for (const event of await response.json()) apply({ ...event, run_id: runId });
  }

  let retryDelay = 500;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/conversations/${conversationId}/`);
    socket.onopen = () => { retryDelay = 500; if (activeRun) catchUp(activeRun); };
    socket.onmessage = (message) => apply(JSON.parse(message.data));
    socket.onclose = () => { setTimeout(connect, retryDelay); retryDelay = Math.min(retryDelay * 2, 8000); };
  }
  connect();

  async function send() {
    const text = input.value;
    if (!text.trim()) { statusLine.textContent = "Write a message first."; return; }
    const response = await fetch(`/api/conversations/${conversationId}/messages/`, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrf },
      body: JSON.stringify({ text }),
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) { statusLine.textContent = body.detail || `Error ${response.status}`; return; }
    const article = el("article", "message user");
    article.appendChild(el("header", null, "user"));
    article.appendChild(el("div", "text", text));
    messages.appendChild(article);
    input.value = "";
    activeRun = body.run.id;
    cancelButton.hidden = false;
    runState(activeRun);
    catchUp(activeRun);
  }

  form.addEventListener("submit", (event) => { event.preventDefault(); send(); });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send(); }
  });
  cancelButton.addEventListener("click", async () => {
    if (!activeRun) return;
    await fetch(`/api/runs/${activeRun}/cancel/`, { method: "POST", credentials: "same-origin", headers: { "X-CSRFToken": csrf } });
  });
  if (activeRun) cancelButton.hidden = false;
})();
