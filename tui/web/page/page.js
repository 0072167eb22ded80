// The card's buttons (Start, Restart): the page again without ?delay, which opens the websocket.
// textual-serve's page has this inline, with onClick attributes; the view's policy runs no inline script.
function startUrl() {
  const params = new URLSearchParams(window.location.search);
  params.delete("delay");
  return window.location.pathname + "?" + params.toString();
}

document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button.restart")) {
    button.addEventListener("click", () => { window.location.href = startUrl(); });
  }
});
