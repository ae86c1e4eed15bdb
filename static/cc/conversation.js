// Live conversation page: send through the API, stream run events over a websocket,
// and catch up from the stored event log after a reconnect (events carry a seq).
// Everything works from the keyboard: Enter sends, "/" opens the command menu,
// an approval prompt takes focus and answers Enter (approve) or Escape (deny).
(() => {
  const root = document.getElementById("conversation");
  if (!root) return;
  const conversationId = root.dataset.conversationId;
  const messages = document.getElementById("messages");
  const statusLine = document.getElementById("status");
  const form = document.getElementById("composer");
  const input = document.getElementById("composer-input");
  const cancelButton = document.getElementById("cancel");
  const runLink = document.getElementById("run-link");
  const menu = document.getElementById("slash-menu");
  const csrf = document.querySelector("input[name=csrfmiddlewaretoken]").value;
  const runs = new Map(); // run id -> {lastSeq, seen, article, text, tools: Map(tool_use_id -> details)}
  const approvals = new Map(); // approval id -> prompt element
  let activeRun = root.dataset.activeRun ? Number(root.dataset.activeRun) : null;

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }
  const pretty = (value) => (typeof value === "string" ? value : JSON.stringify(value, null, 2));
  const errorText = (body, response) =>
    body.detail || (body.error && (body.error.message || body.error)) || `Error ${response.status}`;

  function showRun(runId) {
    runLink.href = `/runs/${runId}/`;
    runLink.textContent = `Run ${runId} details`;
    runLink.hidden = false;
  }

  function runState(runId) {
    if (!runs.has(runId)) {
      const article = el("article", "message assistant");
      article.dataset.runId = runId;
      const header = el("header", null, "assistant · ");
      const link = el("a", null, `run ${runId}`);
      link.href = `/runs/${runId}/`;
      header.appendChild(link);
      article.appendChild(header);
      messages.appendChild(article);
      runs.set(runId, { lastSeq: 0, seen: new Set(), article, text: null, tools: new Map() });
    }
    return runs.get(runId);
  }

  // The server sends tool input and output as compact JSON (cheap to render for long
  // conversations); indent it when a call is opened. `toggle` does not bubble: capture it.
  document.addEventListener("toggle", (event) => {
    if (!event.target.open) return;
    for (const pre of event.target.querySelectorAll("pre.json:not([data-pretty])")) {
      pre.dataset.pretty = "1";
      try { pre.textContent = JSON.stringify(JSON.parse(pre.textContent), null, 2); } catch { /* not JSON: as is */ }
    }
  }, true);

  // --- tool calls: one collapsible per call, its result filled in when it arrives ---
  function toolCall(state, p) {
    const details = el("details", "tool");
    const summary = el("summary");
    summary.append(el("span", "tool-name", p.name), " ", el("span", "tool-state muted", "running…"));
    details.append(summary, el("h3", null, "Arguments"), el("pre", null, pretty(p.input)));
    state.tools.set(p.id, details);
    state.article.appendChild(details);
  }

  function toolResult(state, p) {
    let details = state.tools.get(p.id);
    if (!details) { toolCall(state, { id: p.id, name: p.name, input: {} }); details = state.tools.get(p.id); }
    const failed = p.output && p.output.ok === false;
    const badge = details.querySelector(".tool-state");
    badge.className = "tool-state";
    badge.textContent = failed ? "failed" : "ok";
    details.classList.toggle("failed", Boolean(failed));
    details.append(el("h3", null, "Result"), el("pre", null, pretty(p.output)));
  }

  // --- approvals (RN-4): the prompt takes focus; Enter approves, Escape denies ---
  function approvalRequested(state, p) {
    if (approvals.has(p.approval_id)) return;
    const prompt = el("div", "approval");
    prompt.tabIndex = -1;
    prompt.dataset.approvalId = p.approval_id;
    prompt.setAttribute("role", "group");
    const title = el("p", null);
    title.id = `approval-${p.approval_id}-title`;
    // A subagent's call (TD-14) is decided here too, on its parent run's page.
    const who = p.subagent ? `Subagent ${p.subagent.index} (${p.subagent.profile})` : "The agent";
    if (p.subagent) prompt.dataset.subagent = p.subagent.id;
    title.append(`${who} asks to run `, el("code", null, p.name), ".");
    prompt.setAttribute("aria-labelledby", title.id);
    const args = el("details", "tool");
    args.open = true;
    args.append(el("summary", null, "Arguments"), el("pre", null, pretty(p.input)));
    const row = el("div", "row");
    const approve = el("button", "approve");
    approve.type = "button";
    approve.append("Approve ", el("kbd", null, "Enter"));
    const deny = el("button", "deny secondary");
    deny.type = "button";
    deny.append("Deny ", el("kbd", null, "Esc"));
    const feedback = el("span", "feedback muted");
    feedback.setAttribute("role", "status");
    row.append(approve, deny, feedback);
    prompt.append(title, args, row);
    approve.addEventListener("click", () => decide(p.approval_id, "approve"));
    deny.addEventListener("click", () => decide(p.approval_id, "deny"));
    prompt.addEventListener("keydown", (event) => {
      if (prompt.classList.contains("decided")) return;
      if (event.key === "Escape") { event.preventDefault(); decide(p.approval_id, "deny"); }
      // On a focused button Enter is that button's own click; elsewhere it approves.
      else if (event.key === "Enter" && event.target.tagName !== "BUTTON") { event.preventDefault(); decide(p.approval_id, "approve"); }
    });
    approvals.set(p.approval_id, prompt);
    state.text = null;
    state.article.appendChild(prompt);
    statusLine.textContent = `Waiting for your approval to run ${p.name}.`;
    prompt.focus();
  }

  function approvalDecided(p) {
    const prompt = approvals.get(p.approval_id);
    if (!prompt || prompt.classList.contains("decided")) return;
    const approved = p.decision === "approve" || p.decision === "approved";
    prompt.classList.add("decided");
    prompt.querySelectorAll("button").forEach((button) => { button.disabled = true; });
    prompt.querySelector(".feedback").textContent = approved ? "Approved." : "Denied.";
    prompt.dataset.decision = approved ? "approved" : "denied";
    if (prompt.contains(document.activeElement) || document.activeElement === prompt) input.focus();
  }

  async function decide(approvalId, decision) {
    const prompt = approvals.get(approvalId);
    const feedback = prompt.querySelector(".feedback");
    feedback.textContent = decision === "approve" ? "Approving…" : "Denying…";
    const response = await fetch(`/api/approvals/${approvalId}/${decision}/`, {
      method: "POST", credentials: "same-origin", headers: { "X-CSRFToken": csrf },
    });
    if (response.ok) { approvalDecided({ approval_id: approvalId, decision }); return; }
    const body = await response.json().catch(() => ({}));
    feedback.textContent = `Could not ${decision}: ${errorText(body, response)}`;
    feedback.setAttribute("role", "alert");
    prompt.focus();
  }

  // Everything of the run up to here is shown; a catch-up asks for what comes after it.
  function contiguous(state) {
    let n = 0;
    while (state.seen.has(n + 1)) n += 1;
    return n;
  }

  function apply(event, fromLog = false) {
    const state = runState(event.run_id);
    // Already shown (live and catch-up overlap). A set, not the highest seq: a run's log has
    // more than one writer while its subagents ask for approval (TD-14), so two events may
    // arrive out of order.
    if (state.seen.has(event.seq)) return;
    // A live event after a gap (this tab joined mid-run, or missed some while reconnecting):
    // the log has it and everything before it, so show them from there, in order (OP-1).
    if (!fromLog && event.seq > contiguous(state) + 1) { catchUp(event.run_id); return; }
    state.seen.add(event.seq);
    state.lastSeq = Math.max(state.lastSeq, event.seq);
    const p = event.payload;
    switch (event.type) {
      case "run_started":
        statusLine.textContent = `Run ${event.run_id} started on ${p.provider}/${p.model}${p.mode ? `, mode ${p.mode}` : ""}.`;
        showRun(event.run_id);
        break;
      case "text_delta":
        if (!state.text) { state.text = el("div", "text"); state.article.appendChild(state.text); }
        state.text.textContent += p.text;
        break;
      case "tool_call":
        state.text = null;
        toolCall(state, p);
        break;
      case "tool_result":
        toolResult(state, p);
        break;
      case "approval_requested":
        approvalRequested(state, p);
        break;
      case "approval_decided":
        approvalDecided(p);
        break;
      case "usage":
        statusLine.textContent = `Step ${p.step}: ${p.input_tokens} uncached, ${p.cache_creation_input_tokens} cache write, ${p.cache_read_input_tokens} cache read, ${p.output_tokens} output tokens.`;
        break;
      case "run_finished":
        statusLine.textContent = p.status === "succeeded" ? "Run finished." : `Run ${p.status}. ${p.error || ""}`;
        if (activeRun === event.run_id) { activeRun = null; cancelButton.hidden = true; }
        break;
    }
  }

  async function catchUp(runId) {
    const state = runState(runId);
    // One request at a time; whatever arrived meanwhile is fetched by one more.
    if (state.catchingUp) { state.catchUpAgain = true; return; }
    state.catchingUp = true;
    try {
      const response = await fetch(`/api/runs/${runId}/events/?after=${contiguous(state)}`, { credentials: "same-origin" });
      if (response.ok) for (const event of await response.json()) apply({ ...event, run_id: runId }, true);
    } finally {
      state.catchingUp = false;
      if (state.catchUpAgain) { state.catchUpAgain = false; catchUp(runId); }
    }
  }

  let retryDelay = 500;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/conversations/${conversationId}/`);
    socket.onopen = () => { retryDelay = 500; root.dataset.live = "1"; if (activeRun) catchUp(activeRun); };
    socket.onmessage = (message) => apply(JSON.parse(message.data));
    socket.onclose = () => {
      delete root.dataset.live;
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 8000);
    };
  }
  connect();

  // --- the slash-command menu: a combobox on the composer (CH-10) ---
  const options = [...menu.querySelectorAll("[role=option]")];
  let activeOption = -1;

  function visibleOptions() { return options.filter((option) => !option.hidden); }

  function setActive(index) {
    const visible = visibleOptions();
    options.forEach((option) => option.setAttribute("aria-selected", "false"));
    if (!visible.length) { activeOption = -1; input.removeAttribute("aria-activedescendant"); return; }
    activeOption = (index + visible.length) % visible.length;
    const option = visible[activeOption];
    option.setAttribute("aria-selected", "true");
    input.setAttribute("aria-activedescendant", option.id);
    option.scrollIntoView({ block: "nearest" });
  }

  function closeMenu() {
    menu.hidden = true;
    input.setAttribute("aria-expanded", "false");
    input.removeAttribute("aria-activedescendant");
    activeOption = -1;
  }

  function updateMenu() {
    // Only while the first word is being typed: "/co" filters, "/compact now" does not.
    const match = /^\/(\S*)$/.exec(input.value.slice(0, input.selectionEnd));
    if (!match || input.value.slice(input.selectionEnd).trim()) { closeMenu(); return; }
    const typed = `/${match[1]}`.toLowerCase();
    options.forEach((option) => { option.hidden = !option.dataset.command.startsWith(typed); });
    if (!visibleOptions().length) { closeMenu(); return; }
    menu.hidden = false;
    input.setAttribute("aria-expanded", "true");
    setActive(0);
  }

  function pick(option) {
    input.value = `${option.dataset.command} `;
    input.setSelectionRange(input.value.length, input.value.length);
    closeMenu();
    input.focus();
  }

  options.forEach((option) => option.addEventListener("mousedown", (event) => { event.preventDefault(); pick(option); }));
  input.addEventListener("input", updateMenu);
  input.addEventListener("blur", closeMenu);

  input.addEventListener("keydown", (event) => {
    if (!menu.hidden) {
      if (event.key === "ArrowDown") { event.preventDefault(); setActive(activeOption + 1); return; }
      if (event.key === "ArrowUp") { event.preventDefault(); setActive(activeOption - 1); return; }
      if ((event.key === "Enter" && !event.shiftKey) || event.key === "Tab") {
        const option = visibleOptions()[activeOption];
        if (option) { event.preventDefault(); pick(option); return; }
      }
      if (event.key === "Escape") { event.preventDefault(); closeMenu(); return; }
    }
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send(); }
  });

  // --- slash command results: /tree and /context open their pages, the rest say what they did ---
  function commandNote(command) {
    const note = el("article", "message note command-result");
    note.dataset.command = command.command;
    note.setAttribute("role", "status");
    note.append(el("header", null, `/${command.command}`), el("p", "detail", command.detail));
    const data = command.data || {};
    if (["compact", "shake"].includes(command.command) && Array.isArray(data.steps)) {
      const table = el("table", "data rungs");
      const head = el("tr");
      ["Rung", "Tokens before", "Tokens after", "Freed", "Items"].forEach((h) => head.appendChild(el("th", null, h)));
      table.appendChild(head);
      for (const step of data.steps) {
        const tr = el("tr");
        [step.rung, step.tokens_before, step.tokens_after, step.freed, step.items].forEach((v) => tr.appendChild(el("td", null, v ?? "")));
        table.appendChild(tr);
      }
      note.appendChild(table);
    } else if (command.command === "rewind" && data.digest) {
      const d = data.digest;
      note.appendChild(el("p", "muted", `Explored ${d.messages} message(s), ${d.tool_errors} tool error(s); tried: ${(d.tried || []).join(" · ") || "—"}`));
    }
    return note;
  }

  function commandDone(command) {
    const name = command.command;
    if (name === "tree" || name === "context") { window.location = `/conversations/${conversationId}/${name}/`; return; }
    if (name === "fork") {
      sessionStorage.setItem("cc-command-note", JSON.stringify(command));
      window.location = `/conversations/${command.data.conversation}/`;
      return;
    }
    if (name === "branch" || name === "rewind") {
      // The path changed: reload it from the server, and say what happened after the reload.
      sessionStorage.setItem("cc-command-note", JSON.stringify(command));
      window.location.reload();
      return;
    }
    messages.appendChild(commandNote(command));
    statusLine.textContent = command.detail;
  }

  const pendingNote = sessionStorage.getItem("cc-command-note");
  if (pendingNote) {
    sessionStorage.removeItem("cc-command-note");
    try {
      const command = JSON.parse(pendingNote);
      messages.appendChild(commandNote(command));
      statusLine.textContent = command.detail;
    } catch { /* a stale or foreign note: ignore it */ }
  }

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
    if (!response.ok) { statusLine.textContent = (body.error && body.error.message) || `Error ${response.status}`; return; }
    if (body.command) {
      // A slash command ran its service and started no run (CH-10).
      input.value = "";
      closeMenu();
      commandDone(body.command);
      return;
    }
    const article = el("article", "message user");
    article.appendChild(el("header", null, "user"));
    article.appendChild(el("div", "text", text));
    messages.appendChild(article);
    input.value = "";
    closeMenu();
    if (!body.run) {
      // A slash command answered by the server without starting a run: show what it said.
      const note = el("article", "message note");
      note.append(el("header", null, text.trim().split(/\s+/)[0]));
      note.append(el("pre", null, body.detail || body.message || JSON.stringify(body, null, 2)));
      messages.appendChild(note);
      statusLine.textContent = "Command done.";
      return;
    }
    activeRun = body.run.id;
    cancelButton.hidden = false;
    showRun(activeRun);
    runState(activeRun);
    catchUp(activeRun);
  }

  form.addEventListener("submit", (event) => { event.preventDefault(); send(); });
  // "/" anywhere outside a field starts a command in the composer.
  document.addEventListener("keydown", (event) => {
    const target = event.target;
    if (event.key !== "/" || event.ctrlKey || event.metaKey || event.altKey) return;
    if (target.closest("input, textarea, select, [contenteditable]")) return;
    event.preventDefault();
    input.focus();
    if (!input.value) { input.value = "/"; updateMenu(); }
  });
  cancelButton.addEventListener("click", async () => {
    if (!activeRun) return;
    const response = await fetch(`/api/runs/${activeRun}/cancel/`, { method: "POST", credentials: "same-origin", headers: { "X-CSRFToken": csrf } });
    if (response.ok) statusLine.textContent = "Cancelling…";
    else statusLine.textContent = errorText(await response.json().catch(() => ({})), response);
  });
  if (activeRun) { cancelButton.hidden = false; showRun(activeRun); }

  // Model and mode pickers: each change is saved at once (PATCH); the next run uses it.
  // A refused value puts the picker back and says why; focus stays on the picker.
  const optionsStatus = document.getElementById("run-options-status");
  for (const picker of document.querySelectorAll("#run-options select")) {
    let saved = picker.value;
    picker.addEventListener("change", async () => {
      const value = picker.value;
      const field = picker.name;
      const label = picker.selectedOptions[0].textContent;
      optionsStatus.classList.remove("error");
      optionsStatus.textContent = `Saving ${field}…`;
      const response = await fetch(`/api/conversations/${conversationId}/`, {
        method: "PATCH",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf },
        body: JSON.stringify({ [field]: field === "mode" ? (value ? Number(value) : null) : value }),
      });
      if (response.ok) {
        saved = value;
        optionsStatus.textContent = `The next run uses ${field} ${label}.`;
      } else {
        picker.value = saved;
        optionsStatus.classList.add("error");
        optionsStatus.textContent = errorText(await response.json().catch(() => ({})), response);
      }
    });
  }
})();
