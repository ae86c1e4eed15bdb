// Slice viewer: reads a part of a scratchpad entry through GET /api/scratchpad/entries/<id>/read/
// with the same modes as the scratchpad_read tool (head, tail, lines, grep, range).
(() => {
  const root = document.getElementById("scratchpad-viewer");
  if (!root) return;
  const form = document.getElementById("slice-form");
  const mode = document.getElementById("slice-mode");
  const out = document.getElementById("slice");
  const statusLine = document.getElementById("slice-status");

  function showFields() {
    form.querySelectorAll("label[data-for]").forEach((label) => {
      label.hidden = !label.dataset.for.split(" ").includes(mode.value);
    });
  }
  mode.addEventListener("change", showFields);
  showFields();

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const params = new URLSearchParams({ mode: mode.value });
    form.querySelectorAll("label:not([hidden]) input").forEach((input) => {
      if (input.type === "checkbox") params.set(input.name, input.checked ? "true" : "false");
      else if (input.value !== "") params.set(input.name, input.value);
    });
    statusLine.textContent = "Reading…";
    const response = await fetch(`/api/scratchpad/entries/${root.dataset.entryId}/read/?${params}`, { credentials: "same-origin" });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      statusLine.className = "error";
      statusLine.setAttribute("role", "alert");
      statusLine.textContent = (body.error && body.error.message) || `Error ${response.status}`;
      out.textContent = "";  // the slice shown before answered another question
      return;
    }
    statusLine.className = "muted";
    statusLine.setAttribute("role", "status");
    const text = body.content ?? body.content_base64 ?? JSON.stringify(body, null, 2);
    out.textContent = typeof text === "string" ? text : JSON.stringify(text, null, 2);
    const facts = Object.entries(body).filter(([k, v]) => typeof v !== "object" && !["content", "text", "content_base64", "ok"].includes(k));
    statusLine.textContent = facts.map(([k, v]) => `${k}: ${v}`).join(" · ");
  });
})();
