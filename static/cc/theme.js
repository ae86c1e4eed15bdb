// Dark mode (UX-5): the system's preference, unless the person picked one with the toggle,
// which is remembered. Loaded in <head> so the page never flashes the other theme.
(() => {
  const stored = localStorage.getItem("cc-theme");
  const system = () => (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
  const apply = (theme) => { document.documentElement.dataset.theme = theme; };
  apply(stored || system());
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
    if (!localStorage.getItem("cc-theme")) apply(system());
  });
  document.addEventListener("DOMContentLoaded", () => {
    const toggle = document.getElementById("theme-toggle");
    if (!toggle) return;
    const label = () => {
      const dark = document.documentElement.dataset.theme === "dark";
      toggle.textContent = dark ? "Light mode" : "Dark mode";
      toggle.setAttribute("aria-pressed", String(dark));
    };
    label();
    toggle.addEventListener("click", () => {
      const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
      localStorage.setItem("cc-theme", next);
      apply(next);
      label();
    });
  });
})();
