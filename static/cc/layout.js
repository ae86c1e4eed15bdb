// Sizes the server computes, applied without inline styles (SB-6's CSP allows no style=""):
// data-percent is an element's width (the context bar), data-level a tree row's indent.
// CSSOM writes like these are allowed; an HTML style attribute would be refused.
(() => {
  function applySizes(scope) {
    for (const node of scope.querySelectorAll("[data-percent]")) node.style.width = `${node.dataset.percent}%`;
    for (const node of scope.querySelectorAll("[data-level]")) node.style.setProperty("--level", node.dataset.level);
  }
  window.ccApplySizes = applySizes;
  // Whether a closed socket had lived (open more than 5 s): the page then comes back at once. One
  // closed as soon as it opened (1013 "Try Again Later": the server's Redis is down) waits longer
  // each time, as a refused one does, instead of every half second for the whole outage.
  window.ccSocketLived = (openedAt, close) => close.code !== 1013 && openedAt > 0 && Date.now() - openedAt > 5000;
  document.addEventListener("DOMContentLoaded", () => applySizes(document));
})();
