// Copy buttons: <button type="button" data-copy="FIELD-ID" data-copy-status="STATUS-ID" hidden>
// (data-copied: what the status says once copied).
// The button stays hidden where nothing can copy, so it never promises what it cannot do.
// A static file, not inline script: the site's CSP allows only its own scripts.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button[data-copy]")) {
    const field = document.getElementById(button.dataset.copy);
    const status = document.getElementById(button.dataset.copyStatus);
    if (!field) continue;
    button.hidden = false;
    button.addEventListener("click", async () => {
      let copied = false;
      try {
        await navigator.clipboard.writeText(field.value);
        copied = true;
      } catch (error) {
        field.select();
        copied = document.execCommand && document.execCommand("copy");
      }
      field.select();
      if (status) {
        status.textContent = copied
          ? button.dataset.copied || "Copied. Paste it where your agent keeps its secrets."
          : "Could not copy by itself: the text is selected, press Ctrl+C (or ⌘C).";
      }
    });
  }
});
