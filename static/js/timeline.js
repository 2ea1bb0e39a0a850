// The live timeline: a poll re-sends only the rows that changed. Bars are drawn
// in ms from the task's first call, so an unchanged row stays right; only the
// axis grows with the task. After each update, every row's bars take the axis
// the update brought (#axis-note's data-axis).
// A static file, not inline script: the site's CSP allows only its own scripts.
"use strict";
document.addEventListener("htmx:afterSettle", () => {
  const note = document.getElementById("axis-note");
  const axis = note && Number(note.dataset.axis);
  if (!axis) return;
  for (const svg of document.querySelectorAll("#timeline svg.bars")) {
    svg.setAttribute("viewBox", `0 0 ${axis} 14`);
  }
});
