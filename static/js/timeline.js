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

// "started 9 s ago" keeps counting between polls that bring nothing new
// (tasks.words.relative_text's words, for the first hour).
function agoWords(seconds) {
  if (seconds < 1) return "just now";
  if (seconds < 60) return `${seconds} s ago`;
  return `${Math.floor(seconds / 60)} min ago`;
}
setInterval(() => {
  for (const t of document.querySelectorAll("time.ago")) {
    const seconds = Math.floor((Date.now() - Date.parse(t.dateTime)) / 1000);
    if (seconds >= 0 && seconds < 3600) t.textContent = agoWords(seconds);
  }
}, 5000);

// After Dad's own action (a choice on a decision card, resume, pause), the
// page says what happened in #messages: focus goes there, so a keyboard or
// screen-reader user hears it and goes on from it instead of from <body>.
document.addEventListener("htmx:afterSettle", (event) => {
  const config = event.detail && event.detail.requestConfig;
  if (!config || String(config.verb).toLowerCase() !== "post") return;
  const messages = document.getElementById("messages");
  if (!messages || !messages.textContent.trim()) return;
  messages.setAttribute("tabindex", "-1");
  if (document.activeElement !== messages) messages.focus();
});

// "Running for 4.1 s" keeps counting between polls, as "started 9 s ago"
// does (the words of the duration filter: "850 ms", "12.3 s", "4 min 5 s").
function durationWords(ms) {
  const seconds = ms / 1000;
  if (seconds < 1) return `${Math.round(ms)} ms`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${Math.floor(seconds % 60)} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}
setInterval(() => {
  for (const el of document.querySelectorAll(".running-for[data-ms]")) {
    if (!el.dataset.since) el.dataset.since = String(Date.now());
    const ms = Number(el.dataset.ms) + (Date.now() - Number(el.dataset.since));
    el.textContent = durationWords(ms);
  }
}, 1000);
