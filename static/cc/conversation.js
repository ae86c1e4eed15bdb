// The conversation page (UX-1..UX-5). The server draws the messages (one template,
// `conversations/_messages.html`, for the first load and for every refresh), so the live view
// and a reload are the same HTML. The page swaps that fragment in whenever the conversation
// changes (a prompt sent from any tab or the API, a run ending, a reconnect); a run still in
// flight is a placeholder article that the page fills from the run's event log (caught up
// from `GET /api/runs/<id>/events/?after=N`, then live over the websocket, de-duplicated by
// seq). An approval never takes focus: only its own buttons decide it.
(() => {
  const root = document.getElementById("conversation");
  if (!root) return;
  const conversationId = root.dataset.conversationId;
  const statusLine = document.getElementById("status");
  // Every write to the status line counts, so a late writer (a replay, a slow read) can tell whether
  // anything newer was said meanwhile.
  let statusSerial = 0;
  function say(text) { statusLine.textContent = text; statusSerial += 1; }
  let outcome = null; // the status line's command outcome, while it shows one (sayOutcome)
  const errors = document.getElementById("errors");
  const form = document.getElementById("composer");
  const input = document.getElementById("composer-input");
  const sendButton = document.getElementById("send");
  const cancelButton = document.getElementById("cancel");
  const runLink = document.getElementById("run-link");
  const jumpButton = document.getElementById("jump-latest");
  const menu = document.getElementById("slash-menu");
  const csrf = document.querySelector("input[name=csrfmiddlewaretoken]").value;
  let runs = new Map(); // run id -> {lastSeq, seen, article, text, tools, working, catching, catchAgain, buffer, ended}
  let approvals = new Map(); // approval id -> prompt element
  let activeRun = null;
  let following = true; // the view sticks to the newest message unless the person scrolled up

  const messagesBox = () => document.getElementById("messages");
  // data-busy while the page's own request or refresh is in flight: "settled" is observable.
  let busy = 0;
  async function busyWhile(promise) {
    busy += 1;
    root.dataset.busy = "1";
    try { return await promise; } finally { busy -= 1; if (!busy) delete root.dataset.busy; }
  }
  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }
  const pretty = (value) => (typeof value === "string" ? value : JSON.stringify(value, null, 2));
  const errorText = (body, response) =>
    body.detail || (body.error && (body.error.message || body.error)) || `Error ${response.status}`;
  // Refused because a run holds the conversation (not for any other conflict): worth sending again later.
  const runHeld = (body) => Boolean(body && body.error && body.error.code === "run_in_progress");

  // --- the session: an expired one goes to the sign-in page instead of showing raw errors ---
  // What the box held is kept for the page signed in again: the expired session lost a message.
  const draftKey = `cc-draft-${conversationId}`;
  function signIn() {
    const box = document.getElementById("composer-input");
    if (box && box.value.trim()) sessionStorage.setItem(draftKey, box.value);
    window.location = `/login/?next=${encodeURIComponent(location.pathname + location.search)}`;
  }
  const api = (url, options = {}) => busyWhile(request(url, options));
  async function request(url, options) {
    let response;
    try {
      response = await fetch(url, {
        credentials: "same-origin",
        ...options,
        headers: { "X-CSRFToken": csrf, ...(options.body ? { "Content-Type": "application/json" } : {}), ...(options.headers || {}) },
      });
    } catch {
      // fetch rejects only when no answer came at all (the server down, the network gone). Every
      // caller is a person's action, and their catch is for the sign-in redirect: say it here, or
      // a Send or an Approve looked ignored.
      showError("The server could not be reached.", "Nothing came back, so it may not have been done: check the connection and try again. A message you were sending is still in the box.");
      throw new Error("unreachable");
    }
    const body = await response.json().catch(() => ({}));
    const code = body.error && body.error.code;
    if (response.status === 401 || code === "not_authenticated" || code === "authentication_failed") {
      signIn();
      throw new Error("signed out");
    }
    return { response, body };
  }

  // --- errors look like errors: a red card with what happened and what to do, dismissible ---
  function showError(message, hint) {
    const card = el("div", "error-card");
    card.setAttribute("role", "alert");
    card.append(el("p", "error-text", message));
    if (hint) card.append(el("p", "what-to-do muted", hint));
    const close = el("button", "link dismiss", "Dismiss");
    close.type = "button";
    close.setAttribute("aria-label", "Dismiss this error");
    close.addEventListener("click", () => { card.remove(); input.focus(); });
    card.append(close);
    errors.replaceChildren(card);
    forgetOutcome();
    afterChange();
  }
  const clearError = () => errors.replaceChildren();

  // --- following the conversation ---
  const atBottom = () => window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 80;
  function scrollToLatest() { window.scrollTo(0, document.documentElement.scrollHeight); following = true; jumpButton.hidden = true; }
  function afterChange() {
    if (following) scrollToLatest();
    else jumpButton.hidden = false;
  }
  window.addEventListener("scroll", () => {
    following = atBottom();
    if (following) jumpButton.hidden = true;
  }, { passive: true });
  jumpButton.addEventListener("click", () => { scrollToLatest(); input.focus(); });

  // What a run holds the conversation against (the server answers 409 run_in_progress): offered
  // disabled while it works, saying why, rather than refused after a click.
  // An open edit's "Save and run" too; the edit itself stays open, to prepare a prompt meanwhile.
  const HELD_BY_A_RUN = "button[data-regenerate], button[data-branch], button[data-sibling], button[data-retry], button[data-answer], .edit-inline button[type=submit]";
  const HELD_TITLE = "A run is answering: wait for it to finish, or stop it.";

  function setActiveRun(runId) {
    activeRun = runId || null;
    cancelButton.hidden = !activeRun;
    root.dataset.activeRun = activeRun || "";
    if (activeRun) {
      runLink.href = `/runs/${activeRun}/`;
      runLink.textContent = `Run ${activeRun} details`;
      runLink.hidden = false;
    }
    for (const button of messagesBox().querySelectorAll(HELD_BY_A_RUN)) {
      if (button.dataset.title === undefined) button.dataset.title = button.title;
      button.disabled = Boolean(activeRun);
      if (activeRun) button.title = HELD_TITLE;
      else if (button.dataset.title) button.title = button.dataset.title;
      else button.removeAttribute("title");
    }
  }

  // --- the messages fragment: the server's drawing is the truth ---
  let refreshing = null;
  let refreshAgain = false;
  let lastFragment = "";
  // `shown`: the ETag of the drawing on the page, to be answered 304 if it is still current.
  function refresh(shown) {
    if (refreshing) { refreshAgain = true; return refreshing; }
    refreshing = busyWhile((async () => {
      // First a pause: a body that ended before its first await (an open edit form) would clear
      // `refreshing` before it is assigned, and every later refresh would wait on it forever.
      await null;
      try {
        do {
          refreshAgain = false;
          // An open edit form is not swapped away under the person's hands; it refreshes once closed.
          // What a run holds is still told: a run started in another tab left Regenerate enabled.
          if (messagesBox().querySelector(".edit-inline")) { deferred = true; await runStateOnly(); return; }
          const headers = shown ? { "If-None-Match": shown } : {};
          let response;
          try {
            response = await fetch(`/conversations/${conversationId}/messages/${location.search}`, { credentials: "same-origin", headers });
          } catch {
            return;  // the network blinked: the drawing stays, and the next event or reconnect redraws it
          }
          if (response.redirected && new URL(response.url).pathname.startsWith("/login")) { signIn(); return; }
          if (response.status === 304) continue;
          if (!response.ok) return;
          install(await response.text());
          shown = undefined;
        } while (refreshAgain);
        // Drawn by a fragment fetched after their events came, or not drawn at all: off the path.
        for (const runId of unknownRuns) if (!runs.has(runId)) offPathRuns.add(runId);
        unknownRuns.clear();
      } finally { refreshing = null; }
    })());
    return refreshing;
  }
  let deferred = false;

  async function runStateOnly() {
    let response;
    try {
      response = await fetch(`/conversations/${conversationId}/messages/${location.search}`, { credentials: "same-origin" });
    } catch {
      return;  // as in refresh(): nothing learnt this time
    }
    if (!response.ok || response.redirected) return;
    const template = document.createElement("template");
    template.innerHTML = (await response.text()).trim();
    const box = template.content.getElementById("messages");
    const next = box && box.dataset.activeRun ? Number(box.dataset.activeRun) : null;
    if (next && next !== activeRun) say("A run is answering: it shows here once you close the edit.");
    setActiveRun(next);
  }

  // The usage bar and context meter alone, after each model request of a run in flight: each
  // request is stored as its reply comes in, and the messages stay as they are drawn live.
  let usageFetch = null;
  let usageAgain = false;
  function refreshUsage() {
    if (usageFetch) { usageAgain = true; return; }
    usageFetch = (async () => {
      try {
        do {
          usageAgain = false;
          const response = await fetch(`/conversations/${conversationId}/usage/`, { credentials: "same-origin" });
          if (!response.ok || response.redirected) return;
          const template = document.createElement("template");
          template.innerHTML = (await response.text()).trim();
          const bar = document.getElementById("conversation-usage");
          if (bar && template.content.firstElementChild) bar.replaceWith(template.content.firstElementChild);
        } while (usageAgain);
      } finally { usageFetch = null; }
    })();
  }

  function install(html) {
    if (html === lastFragment) {
      // Nothing stored changed: keep the live articles and only catch up their logs.
      for (const runId of runs.keys()) catchUp(runId);
      return;
    }
    lastFragment = html;
    const template = document.createElement("template");
    template.innerHTML = html.trim();
    const fresh = template.content.firstElementChild;
    const focused = document.activeElement;
    const hadFocus = messagesBox().contains(focused);
    // A run still in flight keeps its drawn article across the swap: what it shows (the reply so far,
    // its tool cards, an approval prompt someone is about to press) stays on the page, instead of
    // blinking out until its log is replayed into the fresh placeholder.
    const kept = new Map();
    for (const placeholder of fresh.querySelectorAll("article.live[data-run-id]")) {
      const runId = Number(placeholder.dataset.runId);
      const state = runs.get(runId);
      // A run this page already saw end is drawn live only by a fragment older than that end: it
      // gets a fresh article, whose replay of the log ends it again and asks for a newer fragment
      // (kept, its article stayed live and the Stop button shown, with nothing left to replay).
      if (!state || !state.article.isConnected || state.ended) continue;
      state.article.dataset.runStatus = placeholder.dataset.runStatus;
      placeholder.replaceWith(state.article);
      kept.set(runId, state);
    }
    messagesBox().replaceWith(fresh);
    for (const note of notes) placeNote(fresh, note);
    // Focus stays where it was when that is still on the page (a kept approval's button).
    if (hadFocus) (focused.isConnected ? focused : input).focus();
    bindFragment(fresh, kept);
    afterChange();
  }

  function bindFragment(box, kept = new Map()) {
    const previousApprovals = approvals;
    runs = new Map();
    approvals = new Map();
    for (const [approvalId, prompt] of previousApprovals) if (box.contains(prompt)) approvals.set(approvalId, prompt);
    for (const article of box.querySelectorAll("article.live[data-run-id]")) {
      const runId = Number(article.dataset.runId);
      if (kept.has(runId)) {
        runs.set(runId, kept.get(runId));
      } else {
        runs.set(runId, { lastSeq: 0, seen: new Set(), article, text: null, tools: new Map(), working: null, catching: false, buffer: [] });
        working(runs.get(runId), article.dataset.runStatus === "queued" ? "Queued: waiting for a worker" : "Working");
      }
      catchUp(runId);
    }
    const previous = activeRun;
    const next = box.dataset.activeRun ? Number(box.dataset.activeRun) : null;
    setActiveRun(next);
    // A run that ended while this page was away (a reconnect): say how it ended, as its live event would have.
    if (previous && !next) reportEnded(previous);
  }

  async function reportEnded(runId) {
    const serial = statusSerial;
    const response = await fetch(`/api/runs/${runId}/`, { credentials: "same-origin" });
    if (!response.ok) return;
    const run = await response.json();
    // Told only if nothing newer was said while the run was read (a command's outcome, say).
    if (["succeeded", "failed", "cancelled"].includes(run.status) && statusSerial === serial) tellEnded(runId, run);
  }

  // The status line follows a run until its end is told, and then never tells the run again over
  // newer news: the read of a run that ended before the page drew it came back, under load, after the
  // person's next command, and "Run finished." replaced that command's outcome (CI;
  // test_a_late_report_of_a_runs_end_does_not_replace_the_outcome_of_a_later_command). A redraw's
  // catch-up that replays an ended run's log (started, each step, the end) leaves the line alone too,
  // and any catch-up's replay (the log read, then the live events that came meanwhile) writes only
  // while nothing else has written since it began (test_a_catch_up_read_late_does_not_replace_...).
  const toldEnded = new Set();
  let replay = null;  // {serial}: the catch-up being replayed, and the line's serial after its last write
  function sayForRun(runId, text) {
    if (toldEnded.has(runId) || (replay && replay.serial !== statusSerial)) return;
    say(text);
    if (replay) replay.serial = statusSerial;
  }
  function tellEnded(runId, run) {
    sayForRun(runId, run.status === "succeeded" ? "Run finished." : `Run ${run.status}. ${run.error || ""}`);
    toldEnded.add(runId);
  }

  // A "working" line at the end of a live reply: thinking, running a tool, waiting for you. Its
  // texts end without an ellipsis: the stylesheet adds a pulsing one, the sign that it is live.
  function working(state, text) {
    if (!state.working) { state.working = el("p", "working muted"); state.working.setAttribute("aria-hidden", "true"); }
    state.working.textContent = text;
    state.working.hidden = !text;
    state.article.appendChild(state.working);
  }

  // The server sends tool input and output as compact JSON; indent it when a call is opened.
  document.addEventListener("toggle", (event) => {
    if (!event.target.open) return;
    for (const pre of event.target.querySelectorAll("pre.json:not([data-pretty])")) {
      pre.dataset.pretty = "1";
      try { pre.textContent = JSON.stringify(JSON.parse(pre.textContent), null, 2); } catch { /* not JSON: as is */ }
    }
  }, true);

  // --- a live run: its events drawn in arrival order into its placeholder article ---
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

  // --- subagents (TD-14, UX-4): each child's status, calls and answer, live in the parent's card ---
  const SUBAGENT_STATUS = { queued: "queued", running: "working…", waiting: "waiting for approval", succeeded: "done", failed: "failed", cancelled: "cancelled" };
  function subagentBox(state, who) {
    if (!state.subagents) state.subagents = new Map();
    let child = state.subagents.get(who.id);
    if (child) return child;
    if (!state.subagentList) {
      state.subagentList = el("section", "subagents");
      state.subagentList.setAttribute("aria-label", "Subagents");
      state.article.appendChild(state.subagentList);
    }
    const node = el("details", "subagent");
    node.open = true;
    node.dataset.subagentId = who.id;
    const summary = el("summary");
    const status = el("span", "subagent-status muted");
    summary.append(el("strong", null, `Subagent ${who.index}`), ` (${who.profile}) · `, status);
    node.append(summary, el("p", "subagent-task muted small", who.task));
    // Children come in index order, whatever order their events arrive in.
    const after = [...state.subagentList.children].find((other) => Number(other.dataset.index) > who.index);
    node.dataset.index = who.index;
    state.subagentList.insertBefore(node, after || null);
    child = { node, status, calls: new Map() };
    state.subagents.set(who.id, child);
    state.text = null;
    return child;
  }
  function subagentStatus(state, p) {
    const child = subagentBox(state, p.subagent);
    child.node.dataset.status = p.status;
    child.status.textContent = SUBAGENT_STATUS[p.status] || p.status;
    child.status.className = `subagent-status${["failed", "cancelled"].includes(p.status) ? " error-text" : " muted"}`;
    if (p.answer) child.node.append(el("div", "subagent-answer text streaming", p.answer));
    if (p.error && p.status !== "succeeded") child.node.append(el("p", "subagent-error error-text small", p.error));
  }
  function subagentCall(state, p) {
    const child = subagentBox(state, p.subagent);
    const details = el("details", "tool");
    const summary = el("summary");
    summary.append(el("span", "tool-name", p.name), " ", el("span", "tool-state muted", "running…"));
    details.append(summary, el("h3", null, "Arguments"), el("pre", null, pretty(p.input)));
    child.calls.set(p.id, details);
    child.node.appendChild(details);
  }
  function subagentResult(state, p) {
    const child = subagentBox(state, p.subagent);
    if (!child.calls.has(p.id)) subagentCall(state, { ...p, input: {} });
    const details = child.calls.get(p.id);
    const failed = p.output && p.output.ok === false;
    const badge = details.querySelector(".tool-state");
    badge.className = "tool-state";
    badge.textContent = failed ? "failed" : "ok";
    details.classList.toggle("failed", Boolean(failed));
    details.append(el("h3", null, "Result"), el("pre", null, pretty(p.output)));
  }

  // --- approvals (RN-4, UX-3): shown in every tab, decided only by their own buttons ---
  function approvalRequested(state, p) {
    if (approvals.has(p.approval_id)) return;
    const prompt = el("div", "approval");
    prompt.dataset.approvalId = p.approval_id;
    prompt.setAttribute("role", "group");
    const title = el("p", null);
    title.id = `approval-${p.approval_id}-title`;
    // A subagent's call (TD-14) is decided here too, on its parent run's page.
    const who = p.subagent ? `Subagent ${p.subagent.index} (${p.subagent.profile})` : "The agent";
    if (p.subagent) prompt.dataset.subagent = p.subagent.id;
    title.append(`${who} asks to run `, el("code", null, p.name), ".");
    if (p.subagent && p.subagent.task) title.append(el("span", "muted", ` Its task: ${p.subagent.task}`));
    prompt.setAttribute("aria-labelledby", title.id);
    const args = el("details", "tool");
    args.open = true;
    args.append(el("summary", null, "Arguments"), el("pre", null, pretty(p.input)));
    const row = el("div", "row");
    const approve = el("button", "approve", "Approve");
    approve.type = "button";
    const deny = el("button", "deny secondary", "Deny");
    deny.type = "button";
    const feedback = el("span", "feedback muted");
    feedback.setAttribute("role", "status");
    row.append(approve, deny, feedback);
    prompt.append(title, args, row);
    approve.addEventListener("click", () => decide(p.approval_id, "approve"));
    deny.addEventListener("click", () => decide(p.approval_id, "deny"));
    approvals.set(p.approval_id, prompt);
    state.text = null;
    state.article.appendChild(prompt);
    // Focus stays where the person is: Shift+Tab from the composer reaches Deny, then Approve.
    sayForRun(Number(state.article.dataset.runId), `Waiting for your approval to run ${p.name} (Shift+Tab from the message box reaches it).`);
  }

  function approvalDecided(p) {
    const prompt = approvals.get(p.approval_id);
    if (!prompt || prompt.classList.contains("decided")) return;
    const approved = p.decision === "approve" || p.decision === "approved";
    const hadFocus = prompt.contains(document.activeElement);
    prompt.classList.add("decided");
    prompt.querySelectorAll("button").forEach((button) => { button.disabled = true; });
    prompt.querySelector(".feedback").textContent = approved ? "Approved." : "Denied.";
    prompt.dataset.decision = approved ? "approved" : "denied";
    if (hadFocus) input.focus();
  }

  async function decide(approvalId, decision) {
    const prompt = approvals.get(approvalId);
    const feedback = prompt.querySelector(".feedback");
    feedback.textContent = decision === "approve" ? "Approving…" : "Denying…";
    const { response, body } = await api(`/api/approvals/${approvalId}/${decision}/`, { method: "POST" });
    if (response.ok) { approvalDecided({ approval_id: approvalId, decision }); return; }
    feedback.textContent = `Could not ${decision}: ${errorText(body, response)}`;
    feedback.setAttribute("role", "alert");
  }

  function apply(state, event) {
    // A fragment swapped in meanwhile drew this run afresh (its article was not on the page to
    // keep) and replays its log into the new article: a catch-up still in flight for the old one
    // draws nothing, or it would claim the run's approval prompts for an article no longer shown.
    if (!state.article.isConnected) return;
    // Already shown (live and catch-up overlap). A set, not the highest seq: a run's log has
    // more than one writer while its subagents ask for approval (TD-14).
    if (state.seen.has(event.seq)) return;
    state.seen.add(event.seq);
    state.lastSeq = Math.max(state.lastSeq, event.seq);
    const p = event.payload;
    switch (event.type) {
      case "run_started":
        sayForRun(event.run_id, `Run ${event.run_id} started on ${p.provider}/${p.model}${p.mode ? `, mode ${p.mode}` : ""}.`);
        // A run resumed after an approval goes straight to the approved call.
        working(state, state.approved ? `Running ${state.approved}` : "Thinking");
        break;
      case "run_handed_off":
        // Its worker is stopping (OP-4): the next worker resumes after this step.
        working(state, "Waiting for a worker");
        sayForRun(event.run_id, `Step ${p.step} done; its worker is stopping, so the next worker goes on from here.`);
        break;
      case "model_retry":
        // The provider refused or broke off (a 429, a 529, a cut stream): said, so a wait is not silence.
        working(state, `Asking the model again in ${Math.round(p.wait_seconds)} s`);
        sayForRun(event.run_id, `Attempt ${p.attempt} did not get an answer (${p.reason}); asking again in ${Math.round(p.wait_seconds)} s.`);
        break;
      case "text_delta":
        // Plain text while it streams (line breaks kept); the stored reply is drawn as Markdown
        // once the run ends, so a half-open code fence never renders mid-stream.
        if (!state.text) { state.text = el("div", "text streaming"); state.article.appendChild(state.text); }
        state.text.textContent += p.text;
        working(state, "Writing");
        break;
      case "tool_call":
        state.text = null;
        toolCall(state, p);
        working(state, `Running ${p.name}`);
        break;
      case "tool_result":
        toolResult(state, p);
        state.approved = null;
        working(state, "Thinking");
        break;
      case "subagent_status":
        subagentStatus(state, p);
        break;
      case "subagent_tool_call":
        subagentCall(state, p);
        working(state, `Subagent ${p.subagent.index} runs ${p.name}`);
        break;
      case "subagent_tool_result":
        subagentResult(state, p);
        working(state, "Waiting for the subagents");
        break;
      case "approval_requested": {
        // Nothing runs until a person decides: the call's badge says so, the agent's own and a subagent's alike.
        if (p.subagent) subagentStatus(state, { subagent: p.subagent, status: "waiting" });
        const call = p.subagent ? subagentBox(state, p.subagent).calls.get(p.tool_use_id) : state.tools.get(p.tool_use_id);
        if (call) call.querySelector(".tool-state").textContent = "waiting for approval";
        approvalRequested(state, p);
        if (approvals.has(p.approval_id)) approvals.get(p.approval_id).call = call;
        working(state, "Waiting for your approval");
        break;
      }
      case "approval_decided": {
        const prompt = approvals.get(p.approval_id);
        const approved = ["approve", "approved"].includes(p.decision);
        state.approved = approved && prompt && !prompt.dataset.subagent ? prompt.querySelector("code").textContent : null;
        if (prompt && prompt.call) prompt.call.querySelector(".tool-state").textContent = approved ? "running…" : "denied";
        approvalDecided(p);
        working(state, state.approved ? `Running ${state.approved}` : "Working");
        break;
      }
      case "subagent_usage":
        if (!state.catching) refreshUsage();
        break;
      case "usage":
        if (!state.catching) refreshUsage();
        sayForRun(event.run_id, p.cache_reported === false
          ? `Step ${p.step}: ${p.input_tokens} input, ${p.output_tokens} output tokens (the server reports no cache figures).`
          : `Step ${p.step}: ${p.input_tokens} uncached, ${p.cache_creation_input_tokens} cache write, ${p.cache_read_input_tokens} cache read, ${p.output_tokens} output tokens.`);
        break;
      case "run_finished":
        state.ended = true;
        working(state, "");
        tellEnded(event.run_id, p);
        if (activeRun === event.run_id) setActiveRun(null);
        // The stored reply (or the failed run's card with Retry) replaces the live drawing.
        if (!state.catching) refresh();
        else state.finished = true;
        break;
    }
    afterChange();
  }

  // `started`: the status line as it was when this catch-up was first asked for; a read that follows
  // another one keeps it, so neither writes over news the person got after that.
  async function catchUp(runId, started = { serial: statusSerial }) {
    const state = runs.get(runId);
    if (!state) return;
    // A read of the log is on its way: its answer may predate what is asked for now (a reconnect
    // after events the dropped socket never brought), so one more read follows it.
    if (state.catching) { state.catchAgain = true; return; }
    state.catching = true;
    state.catchAgain = false;
    try {
      const response = await fetch(`/api/runs/${runId}/events/?after=${state.lastSeq}`, { credentials: "same-origin" });
      const events = response.ok ? await response.json() : [];
      replay = started;
      for (const event of events) apply(state, { ...event, run_id: runId });
      // Requests stored after the fragment was drawn: its usage bar is behind them.
      if (events.some((event) => event.type === "usage" || event.type === "subagent_usage")) refreshUsage();
    } finally {
      state.catching = false;
      // Live events that came while the log was read go after it, in the order they came.
      const buffered = state.buffer;
      state.buffer = [];
      replay = started;
      try {
        for (const event of buffered) apply(state, event);
      } finally {
        replay = null;
      }
      if (runs.get(runId) === state) {
        if (state.catchAgain) catchUp(runId, started);
        else if (state.finished) refresh();
      }
    }
  }

  // Runs whose events came before the fragment drew them, and runs the fragment does not draw
  // (their prompt is off the current path): the latter refresh once more, when they end.
  const unknownRuns = new Set();
  const offPathRuns = new Set();
  function onEvent(event) {
    if (event.type === "conversation_changed") {
      // A rename or a picked model or mode changes the header, not the messages; this page shows
      // no checkpoints (the tree page lists them).
      if (event.reason === "updated") refreshSettings();
      else if (event.reason !== "checkpoint") refresh();
      return;
    }
    const state = runs.get(event.run_id);
    if (!state && offPathRuns.has(event.run_id)) {
      if (event.type === "run_finished") { offPathRuns.delete(event.run_id); refresh(); }
      return;
    }
    // A run the page has not drawn yet: the fragment places it after its prompt, then its log replays.
    if (!state) { unknownRuns.add(event.run_id); refresh(); return; }
    if (state.catching) { state.buffer.push(event); return; }
    apply(state, event);
  }

  let retryDelay = 500;
  let opened = false;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/conversations/${conversationId}/`);
    let openedAt = 0;
    socket.onopen = () => {
      openedAt = Date.now();
      root.dataset.live = "1";
      // Whatever happened before the socket joined is in the fragment and the logs: while the page
      // was away (a reconnect), or since the server drew it (the first connect, also after Back).
      // The first asks with the drawing's tag: unchanged, the server answers 304 and nothing is redrawn.
      refresh(opened ? undefined : root.dataset.fragmentTag);
      refreshSettings();  // a rename or a pick is not in the fragment
      opened = true;
    };
    socket.onmessage = (message) => onEvent(JSON.parse(message.data));
    socket.onclose = (close) => {
      delete root.dataset.live;
      if (close.code === 4401) { signIn(); return; }
      if (window.ccSocketLived(openedAt, close)) retryDelay = 500;
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 8000);
    };
  }

  // --- the actions on a message: copy, edit in place, regenerate, branch; Retry on a failed run ---
  async function copyText(text, button) {
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      const area = el("textarea");
      area.value = text;
      document.body.appendChild(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    const label = button.textContent;
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = label; }, 1200);
  }

  // `accepted` runs once the server took the action, before the page redraws (an edit form closes then).
  async function act(url, body, done, accepted = () => {}) {
    clearError();
    try {
      const { response, body: answer } = await api(url, { method: "POST", body: body ? JSON.stringify(body) : undefined });
      if (!response.ok) { showError(errorText(answer, response), hintFor(answer)); return; }
      accepted();
      following = true;
      say(done);
      await refresh();
    } catch { /* signed out: on the way to the sign-in page */ }
  }
  const hintFor = (body) => (runHeld(body) ? "Wait for the run to finish, or cancel it, then try again." : "Check the message and try again.");

  function openEdit(article) {
    const text = article.querySelector(".text[data-raw]");
    if (!text || article.querySelector(".edit-inline")) return;
    const editor = el("form", "edit-inline");
    const area = el("textarea");
    area.value = text.dataset.raw;
    area.rows = Math.min(12, Math.max(3, area.value.split("\n").length + 1));
    area.setAttribute("aria-label", "Edit this prompt");
    const save = el("button", null, "Save and run");
    save.type = "submit";
    if (activeRun) { save.disabled = true; save.dataset.title = ""; save.title = HELD_TITLE; }
    const cancel = el("button", "secondary", "Cancel");
    cancel.type = "button";
    const row = el("div", "row");
    row.append(save, cancel, el("span", "muted small", "Ctrl+Enter saves, Esc cancels. The old answer stays on its branch."));
    editor.append(area, row);
    text.hidden = true;
    text.after(editor);
    area.focus();
    const close = () => { editor.remove(); text.hidden = false; if (deferred) { deferred = false; refresh(); } };
    cancel.addEventListener("click", () => { close(); article.querySelector("button.edit").focus(); });
    area.addEventListener("keydown", (event) => {
      if (event.key === "Escape") { event.preventDefault(); cancel.click(); }
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); editor.requestSubmit(); }
    });
    editor.addEventListener("submit", (event) => {
      event.preventDefault();
      if (!area.value.trim()) { showError("The prompt is empty.", "Write something, or cancel the edit."); return; }
      const messageId = article.dataset.messageId;
      // Closed only once the edit is taken: refused (a run works), the edited text stays to send again.
      save.disabled = true;
      act(`/api/conversations/${conversationId}/messages/${messageId}/edit/`, { text: area.value }, "Edited: a new branch runs.", close)
        .finally(() => { save.disabled = Boolean(activeRun); });
    });
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button");
    if (!button || !button.closest("#messages")) return;
    const article = button.closest("article");
    if (button.dataset.copy === "code") copyText(button.closest(".code-block").querySelector("pre").innerText, button);
    else if (button.dataset.copy === "message") {
      const parts = [...article.querySelectorAll(".text")].map((node) => node.dataset.raw ?? node.innerText);
      copyText(parts.join("\n\n"), button);
    } else if (button.dataset.edit) openEdit(article);
    else if (button.dataset.regenerate) act(`/api/conversations/${conversationId}/messages/${button.dataset.regenerate}/regenerate/`, null, "Regenerating: the new answer is a sibling of this one.");
    else if (button.dataset.branch) act(`/api/conversations/${conversationId}/branch/`, { message: Number(button.dataset.branch) }, `The tip is now message ${button.dataset.branch}.`);
    else if (button.dataset.sibling) act(`/api/conversations/${conversationId}/branch/`, { message: Number(button.dataset.sibling) }, "Switched to another answer.");
    else if (button.dataset.retry) act(`/api/runs/${button.dataset.retry}/retry/`, null, "Retrying the run.");
    else if (button.dataset.answer) act(`/api/conversations/${conversationId}/retry/`, null, "Answering the prompt at the tip.");
  });

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
        // A whole command that needs no argument (none, or an optional "[one]"), then Enter: run it, as typed.
        const optional = !option?.dataset.args || option.dataset.args.startsWith("[");
        const whole = option && event.key === "Enter" && optional && input.value.trim() === option.dataset.command;
        if (option && !whole) { event.preventDefault(); pick(option); return; }
        if (whole) closeMenu();
      }
      if (event.key === "Escape") { event.preventDefault(); closeMenu(); return; }
    }
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send(); }
  });

  // --- notes: what a slash command did, or that a prompt was not a command ---
  // Drawn among the messages, after the newest card they followed, and carried into every fresh
  // fragment: a prompt sent later is drawn below them, in the order things happened. A reload
  // drops them (they are not stored).
  const notes = [];
  function addNote(note) {
    const box = messagesBox();
    const last = [...box.querySelectorAll(":scope > article[data-message-id], :scope > article[data-run-id]")].pop();
    const message = [...box.querySelectorAll(":scope > article[data-message-id]")].pop();
    note.anchors = [];
    if (last && last.dataset.runId) note.anchors.push(`[data-run-id="${last.dataset.runId}"]`);
    if (message) note.anchors.push(`[data-message-id="${message.dataset.messageId}"]`);
    notes.push(note);
    placeNote(box, note);
  }
  function placeNote(box, note) {
    // After the run card it followed, else (the card gave way to the run's reply) its message.
    let spot = note.anchors.map((anchor) => box.querySelector(`:scope > article${anchor}`)).find(Boolean);
    if (!spot) { box.appendChild(note); return; }
    while (spot.nextElementSibling && spot.nextElementSibling.classList.contains("note")) spot = spot.nextElementSibling;
    spot.after(note);
  }

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

  // The status line shows the last command's outcome only until the next one's: a refused command
  // left "Checkpoint 'x' at message 183." beside its own error, as if both were news.
  function sayOutcome(detail) { say(detail); outcome = detail; }
  function forgetOutcome() {
    if (outcome !== null && statusLine.textContent === outcome) say("");
    outcome = null;
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
    addNote(commandNote(command));
    sayOutcome(command.detail);
    afterChange();
  }

  const draft = sessionStorage.getItem(draftKey);
  if (draft !== null) {
    sessionStorage.removeItem(draftKey);
    if (!input.value) {
      input.value = draft;
      say("Your session had ended; the message you were writing is back in the box.");
    }
  }
  const pendingNote = sessionStorage.getItem("cc-command-note");
  if (pendingNote) {
    sessionStorage.removeItem("cc-command-note");
    try {
      const command = JSON.parse(pendingNote);
      addNote(commandNote(command));
      sayOutcome(command.detail);
    } catch { /* a stale or foreign note: ignore it */ }
  }

  async function send() {
    const text = input.value;
    if (!text.trim()) { showError("The message is empty.", "Write something to send."); return; }
    clearError();
    forgetOutcome();
    sendButton.disabled = true;
    let answer;
    try {
      // The tip this page shows: if another tab moved it since, the server refuses (409) rather
      // than file the prompt under an answer this page never showed.
      const tip = messagesBox().dataset.tip;
      const after = tip ? Number(tip) : null;
      answer = await api(`/api/conversations/${conversationId}/messages/`, { method: "POST", body: JSON.stringify({ text, after }) });
    } catch { return; } finally { sendButton.disabled = false; }
    const { response, body } = answer;
    if (!response.ok) {
      // Refused, never lost: the text stays in the box with the reason above it.
      showError(errorText(body, response), runHeld(body)
        ? "Your message is still in the box: send it when the run ends, or cancel the run."
        : "Your message is still in the box.");
      if (response.status === 409) refresh();  // draw what the conversation holds now
      return;
    }
    input.value = "";
    closeMenu();
    if (body.command) { commandDone(body.command); return; }
    following = true;
    setActiveRun(body.run.id);
    // A leading "/" that is not a command went out as a prompt: say so, in a note that stays
    // (the status line is the run's from its first event on).
    if (body.note) {
      const note = el("article", "message note prompt-note");
      note.setAttribute("role", "status");
      note.append(el("p", "detail", body.note));
      addNote(note);
      say(body.note);
    }
    await refresh();
  }

  form.addEventListener("submit", (event) => { event.preventDefault(); send(); });
  // "/" anywhere outside a field starts a command in the composer.
  document.addEventListener("keydown", (event) => {
    const target = event.target;
    if (event.key !== "/" || event.ctrlKey || event.metaKey || event.altKey) return;
    if (target.closest("input, textarea, select, button, [contenteditable]")) return;
    event.preventDefault();
    input.focus();
    if (!input.value) { input.value = "/"; updateMenu(); }
  });
  // Stop (UX-2): the cancel endpoint kills the running tool's sandbox (OP-3); the run's
  // run_finished event then redraws the page, in every tab. Focus goes back to the composer.
  cancelButton.addEventListener("click", async () => {
    if (!activeRun) return;
    const runId = activeRun;
    cancelButton.disabled = true;
    say("Stopping…");
    try {
      const { response, body } = await api(`/api/runs/${runId}/cancel/`, { method: "POST" });
      if (!response.ok) showError(errorText(body, response), "The run may have ended already; the page shows its outcome.");
    } catch { return; } finally { cancelButton.disabled = false; }
    input.focus();
  });

  // --- rename, delete (with confirmation), export: the conversation's own actions (UX-2) ---
  const renameForm = document.getElementById("rename-form");
  const renameInput = document.getElementById("rename-input");
  const title = document.getElementById("conversation-title");
  document.getElementById("rename").addEventListener("click", () => {
    renameForm.hidden = false;
    renameInput.value = title.textContent;
    renameInput.select();
  });
  document.getElementById("rename-cancel").addEventListener("click", () => { renameForm.hidden = true; });
  renameForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const { response, body } = await api(`/api/conversations/${conversationId}/`, { method: "PATCH", body: JSON.stringify({ title: renameInput.value }) });
    if (!response.ok) { showError(errorText(body, response), "Write a title of at most 200 characters."); return; }
    title.textContent = body.title;
    document.title = `${body.title} · Control Center`;
    renameForm.hidden = true;
    say("Renamed.");
  });
  const deleteDialog = document.getElementById("delete-dialog");
  document.getElementById("delete").addEventListener("click", () => deleteDialog.showModal());
  deleteDialog.addEventListener("close", async () => {
    if (deleteDialog.returnValue !== "delete") return;
    const { response, body } = await api(`/api/conversations/${conversationId}/`, { method: "DELETE" });
    if (response.ok) { window.location = "/"; return; }
    showError(errorText(body, response), response.status === 409 ? "Cancel the run first, then delete." : "");
  });

  bindFragment(messagesBox());
  lastFragment = "";
  if (!location.hash) scrollToLatest();
  connect();

  // Model and mode pickers: each change is saved at once (PATCH); the next run uses it.
  // A refused value puts the picker back and says why; focus stays on the picker.
  // Saves go one after another: two quick keys sent two PATCHes at once, and when the earlier
  // one was answered last the server kept the earlier choice while the picker showed the later.
  const optionsStatus = document.getElementById("run-options-status");
  let saving = Promise.resolve();
  const adopters = new Map(); // picker name -> takes the server's value (refreshSettings)
  for (const picker of document.querySelectorAll("#run-options select")) {
    let saved = picker.value;
    let pending = 0; // this person's choices not yet answered
    let stale = false; // the server's value came while they were on the picker
    adopters.set(picker.name, (value) => {
      if (value === saved && picker.value === saved) return;
      // Their own choice goes on undisturbed; the server's value is asked again once they are done.
      if (pending || document.activeElement === picker) { stale = true; return; }
      if (![...picker.options].some((option) => option.value === value)) {
        optionsStatus.textContent = `The ${picker.name} was changed elsewhere to one this page does not list; reload to see it.`;
        return;
      }
      saved = value;
      picker.value = value;
      optionsStatus.classList.remove("error");
      optionsStatus.textContent = `Changed elsewhere: the next run uses ${picker.name} ${picker.selectedOptions[0].textContent}.`;
    });
    const caughtUp = () => { if (stale && !pending && document.activeElement !== picker) { stale = false; refreshSettings(); } };
    picker.addEventListener("blur", caughtUp);
    const save = async (value, label) => {
      const field = picker.name;
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
        if (picker.value === value) picker.value = saved; // a later choice waiting to be saved stays
        optionsStatus.classList.add("error");
        optionsStatus.textContent = errorText(await response.json().catch(() => ({})), response);
      }
    };
    picker.addEventListener("change", () => {
      const value = picker.value;
      const label = picker.selectedOptions[0].textContent;
      pending += 1;
      saving = saving.then(() => save(value, label)).catch(() => {
        optionsStatus.classList.add("error");
        optionsStatus.textContent = "Could not save: the server did not answer.";
      }).finally(() => { pending -= 1; caughtUp(); });
    });
  }

  // A rename or a pick made in another tab or through the API (`conversation_changed` "updated"):
  // the title and the pickers follow the server, or this tab's next prompt would run believing the
  // old model and mode. The rename field keeps what is typed in it; a picker in use follows once left.
  let settingsFetch = null;
  let settingsAgain = false;
  function refreshSettings() {
    if (settingsFetch) { settingsAgain = true; return; }
    settingsFetch = busyWhile((async () => {
      try {
        do {
          settingsAgain = false;
          let response;
          try {
            // Without the path: a long conversation's path is megabytes, and only the settings are wanted.
            response = await fetch(`/api/conversations/${conversationId}/?path=0`, { credentials: "same-origin" });
          } catch {
            return;  // the network blinked: the socket's reconnect asks again
          }
          if (!response.ok) return;
          const { conversation } = await response.json();
          title.textContent = conversation.title;
          document.title = `${conversation.title} · Control Center`;
          document.getElementById("delete-title").textContent = `Delete “${conversation.title}”?`;
          adopters.get("model")(conversation.model);
          adopters.get("mode")(String(conversation.mode ?? ""));
        } while (settingsAgain);
      } finally { settingsFetch = null; }
    })());
  }
})();
