// The conversations list: rename in place, delete after a confirmation, export links (UX-2).
(() => {
  const list = document.getElementById("conversations");
  if (!list) return;
  const csrf = document.querySelector("input[name=csrfmiddlewaretoken]").value;
  const errors = document.getElementById("errors");
  const dialog = document.getElementById("delete-dialog");
  let target = null;

  async function api(url, method, body) {
    let response;
    try {
      response = await fetch(url, {
        method, credentials: "same-origin",
        headers: { "X-CSRFToken": csrf, ...(body ? { "Content-Type": "application/json" } : {}) },
        body: body ? JSON.stringify(body) : undefined,
      });
    } catch {
      // No answer at all (the server down, the network gone): a rename or delete must not look ignored.
      showError("The server could not be reached: nothing came back, so it may not have been done. Check the connection and try again.");
      throw new Error("unreachable");
    }
    const answer = await response.json().catch(() => ({}));
    const code = answer.error && answer.error.code;
    if (code === "not_authenticated" || response.status === 401) {
      window.location = `/login/?next=${encodeURIComponent(location.pathname + location.search)}`;
      throw new Error("signed out");
    }
    return { response, answer };
  }
  function showError(message) {
    const card = document.createElement("div");
    card.className = "error-card";
    card.setAttribute("role", "alert");
    const text = document.createElement("p");
    text.className = "error-text";
    text.textContent = message;
    const close = document.createElement("button");
    close.type = "button";
    close.className = "link dismiss";
    close.textContent = "Dismiss";
    close.addEventListener("click", () => card.remove());
    card.append(text, close);
    errors.replaceChildren(card);
  }

  list.addEventListener("click", (event) => {
    const button = event.target.closest("button");
    if (!button) return;
    const item = button.closest("li[data-conversation-id]");
    const id = item.dataset.conversationId;
    const link = item.querySelector("a.title");
    if (button.classList.contains("delete")) {
      target = item;
      document.getElementById("delete-name").textContent = link.textContent;
      dialog.showModal();
    } else if (button.classList.contains("rename")) {
      if (item.querySelector("form.rename-inline")) return;
      const form = document.createElement("form");
      form.className = "rename-inline row";
      const input = document.createElement("input");
      input.value = link.textContent;
      input.maxLength = 200;
      input.setAttribute("aria-label", "New title");
      const save = document.createElement("button");
      save.textContent = "Save";
      form.append(input, save);
      link.hidden = true;
      link.after(form);
      input.select();
      const close = () => { form.remove(); link.hidden = false; button.focus(); };
      input.addEventListener("keydown", (e) => { if (e.key === "Escape") close(); });
      form.addEventListener("submit", async (e) => {
        e.preventDefault();
        const { response, answer } = await api(`/api/conversations/${id}/`, "PATCH", { title: input.value });
        if (!response.ok) { showError((answer.error && answer.error.message) || `Error ${response.status}`); return; }
        link.textContent = answer.title;
        close();
      });
    }
  });
  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "delete" || !target) return;
    const { response, answer } = await api(`/api/conversations/${target.dataset.conversationId}/`, "DELETE");
    if (response.ok) target.remove();
    else showError(`${(answer.error && answer.error.message) || `Error ${response.status}`} Cancel the run first, then delete.`);
    target = null;
  });
})();
