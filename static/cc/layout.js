// Sizes the server computes, applied without inline styles (SB-6's CSP allows no style=""):
// data-percent is an element's width (the context bar), data-level a tree row's indent.
// CSSOM writes like these are allowed; an HTML style attribute would be refused.
(() => {
  function applySizes(scope) {
    for (const node of scope.querySelectorAll("[data-percent]")) node.style.width = `${node.dataset.percent}%`;
    for (const node of scope.querySelectorAll("[data-level]")) node.style.setProperty("--level", node.dataset.level);
  }
  window.ccApplySizes = applySizes;
  document.addEventListener("DOMContentLoaded", () => applySizes(document));
})();
