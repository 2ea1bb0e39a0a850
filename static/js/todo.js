// The home page's to-do list refreshes itself (every 10 s while anything
// changes). Its summary line ("2 decisions and 1 paused task wait for you")
// is told to a screen reader through #todo-live when it changes, once, not
// at every refresh that changed something else.
// A static file, not inline script: the site's CSP allows only its own scripts.
"use strict";
(() => {
  let said = null;
  const summary = () => {
    const heading = document.getElementById("todo-heading");
    return heading ? heading.textContent.replace(/\s+/g, " ").trim() : "";
  };
  document.addEventListener("DOMContentLoaded", () => { said = summary(); });
  document.addEventListener("htmx:afterSettle", () => {
    const now = summary();
    const live = document.getElementById("todo-live");
    if (!live || now === said) return;
    said = now;
    live.textContent = now;
  });
})();
