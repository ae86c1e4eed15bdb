// Tree navigator: every change goes through the REST API, then the page reloads from the
// server (the tree is the truth), keeping focus on the node that was acted on. A change made
// elsewhere (another tab, the API, a run ending) reloads it too, through the conversation's
// socket. A long tree comes windowed: folds (li.fold) open on demand, their rows fetched as
// HTML from tree/rows/.
(() => {
  const root = document.getElementById("tree-page");
  if (!root) return;
  const conversationId = root.dataset.conversationId;
  const statusLine = document.getElementById("tree-status");
  const csrf = document.querySelector("input[name=csrfmiddlewaretoken]").value;
  const tree = document.getElementById("tree");
  // Live, not a snapshot: opening a fold adds rows.
  const items = () => [...document.querySelectorAll("#tree [role=treeitem]")];
  const editForm = document.getElementById("edit-form");
  const editText = document.getElementById("edit-text");
  let editing = null;

  // While the page's own action is on its way it ignores the socket: its answer reloads the page
  // with the action's own note (every action that succeeds reloads or leaves the page).
  let acting = false;
  async function api(path, body) {
    acting = true;
    try {
      const response = await fetch(`/api/conversations/${conversationId}/${path}`, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf },
        body: JSON.stringify(body || {}),
      });
      const data = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error((data.error && data.error.message) || `Error ${response.status}`);
      return data;
    } catch (error) {
      acting = false;
      throw error;
    }
  }
  function fail(error) {
    statusLine.textContent = error.message;
    statusLine.setAttribute("role", "alert");
  }
  // A note survives the reload so the person sees what their action did.
  function reloadWith(note, focusId) {
    sessionStorage.setItem("cc-tree-note", note);
    // Replaced, not pushed: an action is no place to come Back to, so Back leaves the tree page.
    history.replaceState(history.state, "", `${location.pathname}${location.search}${focusId ? `#m-${focusId}` : ""}`);
    location.reload();
  }

  function focusNode(node) {
    items().forEach((n) => { n.tabIndex = -1; });
    node.tabIndex = 0;
    node.focus();
  }

  async function expand(fold) {
    const { first, count, keep } = fold.dataset;
    statusLine.textContent = `Opening ${count} message(s)…`;
    const params = new URLSearchParams({ first, count, keep });
    const response = await fetch(`/conversations/${conversationId}/tree/rows/?${params}`, { credentials: "same-origin" });
    const body = await response.text();
    if (!response.ok) { fail(new Error(body || `Error ${response.status}`)); return; }
    const template = document.createElement("template");
    template.innerHTML = body;
    const added = [...template.content.querySelectorAll("[role=treeitem]")];
    window.ccApplySizes(template.content);
    fold.replaceWith(template.content);
    if (!added.length) return;
    // Focus the row nearest to where the person was: the earlier path opens from its end.
    focusNode(keep === "end" ? added[added.length - 1] : added[0]);
    const rows = added.filter((n) => n.dataset.messageId).length;
    statusLine.textContent = `Showing ${rows} more message${rows === 1 ? "" : "s"}.`;
  }

  async function branch(node) {
    const id = Number(node.dataset.messageId);
    if (!node.dataset.branchable) {
      statusLine.textContent = `#${id} stops on a tool call; choose its result or the turn's answer.`;
      return;
    }
    statusLine.textContent = `Moving the tip to #${id}…`;
    try {
      await api("branch/", { message: id });
      reloadWith(`The tip is now #${id}.`, id);
    } catch (error) { fail(error); }
  }

  function startEdit(node) {
    if (!node.dataset.editable) return;
    editing = node;
    editText.value = node.querySelector("template.edit-text").content.textContent;
    node.after(editForm);
    editForm.hidden = false;
    editText.focus();
  }
  function stopEdit() {
    editForm.hidden = true;
    if (editing) focusNode(editing);
    editing = null;
    if (changedElsewhere) redrawForChange();
  }

  // --- live: what another tab, the API or a run at the tip changed ---
  // The note a run at the tip puts here keeps its word: its end (run_finished) draws the page again.
  let changedElsewhere = false;
  function redrawForChange() {
    if (acting) return;
    if (editing) {  // an edit being typed is not thrown away
      changedElsewhere = true;
      statusLine.textContent = "Changed elsewhere: the tree is drawn again once this edit closes.";
      return;
    }
    const focused = document.activeElement && document.activeElement.closest("#tree [role=treeitem]");
    const id = focused && focused.id.startsWith("m-") ? focused.id.slice(2) : "";
    reloadWith("Changed elsewhere: the tree is drawn again.", id);
  }
  let connected = false;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/conversations/${conversationId}/`);
    socket.onopen = async () => {
      root.dataset.live = "1";
      // A change between the server drawing the page and the socket joining (or while it was away)
      // moved the tip, or ended the run the page shows running: the tip tells.
      const response = await fetch(`/api/conversations/${conversationId}/?path=0`, { credentials: "same-origin" }).catch(() => null);
      if (!response || !response.ok) return;
      const { conversation } = await response.json();
      if (String(conversation.tip ?? "") !== root.dataset.tip || (connected && document.getElementById("tree-running"))) redrawForChange();
      connected = true;
    };
    socket.onmessage = (message) => {
      const event = JSON.parse(message.data);
      // A rename or a picked model or mode changes nothing the tree shows.
      if ((event.type === "conversation_changed" && event.reason !== "updated") || event.type === "run_finished") redrawForChange();
    };
    socket.onclose = (close) => {
      delete root.dataset.live;
      if (close.code !== 4401) setTimeout(connect, 2000);  // 4401: signed out, the next action says so
    };
  }
  connect();

  // Delegated, so rows from an opened fold behave like the rest.
  tree?.addEventListener("click", (event) => {
    const node = event.target.closest("[role=treeitem]");
    if (!node) return;
    if (node.classList.contains("fold")) { expand(node); return; }
    if (event.target.closest("button.edit")) { startEdit(node); return; }
    if (event.target.closest("a")) return;
    focusNode(node);
    branch(node);
  });
  tree?.addEventListener("keydown", (event) => {
    const node = event.target.closest("[role=treeitem]");
    if (!node || event.target !== node) return;
    const nodes = items();
    const index = nodes.indexOf(node);
    if (event.key === "ArrowDown" && index < nodes.length - 1) { event.preventDefault(); focusNode(nodes[index + 1]); }
    else if (event.key === "ArrowUp" && index > 0) { event.preventDefault(); focusNode(nodes[index - 1]); }
    else if (event.key === "Home") { event.preventDefault(); focusNode(nodes[0]); }
    else if (event.key === "End") { event.preventDefault(); focusNode(nodes[nodes.length - 1]); }
    else if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      if (node.classList.contains("fold")) expand(node); else branch(node);
    }
    else if (event.key === "e" || event.key === "E") { event.preventDefault(); startEdit(node); }
  });

  editForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!editing) return;
    statusLine.textContent = "Re-running the edited prompt…";
    try {
      await api(`messages/${editing.dataset.messageId}/edit/`, { text: editText.value });
      location.href = `/conversations/${conversationId}/`; // the new run streams there
    } catch (error) { fail(error); }
  });
  document.getElementById("edit-cancel").addEventListener("click", stopEdit);
  editForm.addEventListener("keydown", (event) => { if (event.key === "Escape") { event.preventDefault(); stopEdit(); } });

  document.getElementById("fork").addEventListener("click", async () => {
    statusLine.textContent = "Forking…";
    try {
      const fork = await api("fork/", {});
      location.href = `/conversations/${fork.id}/`;
    } catch (error) { fail(error); }
  });

  document.getElementById("checkpoint-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const label = document.getElementById("checkpoint-label").value.trim();
    try {
      const checkpoint = await api("checkpoints/", { label });
      reloadWith(`Checkpoint ${checkpoint.label} at #${checkpoint.message}.`, checkpoint.message);
    } catch (error) { fail(error); }
  });

  document.querySelectorAll("button.rewind").forEach((button) => {
    button.addEventListener("click", async () => {
      try {
        const record = await api("rewind/", { label: button.dataset.label });
        const digest = record.digest || {};
        reloadWith(`Rewound to ${record.label}; ${digest.messages || 0} explored message(s) kept as a branch and a digest.`, record.target);
      } catch (error) { fail(error); }
    });
  });

  const note = sessionStorage.getItem("cc-tree-note");
  if (note) { statusLine.textContent = note; sessionStorage.removeItem("cc-tree-note"); }
  const target = location.hash && document.getElementById(location.hash.slice(1));
  const start = target || items().find((n) => n.tabIndex === 0) || items()[0];
  if (start) { focusNode(start); start.scrollIntoView({ block: "center" }); }
})();
