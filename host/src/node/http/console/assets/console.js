// Leasehold console: keeps the page's #live section current without a reload. Every second
// (while the tab is visible) it fetches the page again, parses it (a parsed document runs no
// script) and swaps in its #live section; the element that had the focus keeps it, and an
// opened <details> stays open, by id.
(function () {
  "use strict";
  if (!document.getElementById("live")) {
    return;
  }
  var busy = false;
  function refresh() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        return r.ok ? r.text() : null;
      })
      .then(function (text) {
        if (text === null) {
          return;
        }
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        var current = document.getElementById("live");
        if (!fresh || !current) {
          return;
        }
        // A list the reader opened (a run's tasks) stays open, by id.
        current.querySelectorAll("details[open][id]").forEach(function (d) {
          var same = fresh.querySelector("details[id='" + CSS.escape(d.id) + "']");
          if (same) {
            same.open = true;
          }
        });
        if (fresh.innerHTML === current.innerHTML) {
          return;
        }
        var focused = document.activeElement && current.contains(document.activeElement)
          ? document.activeElement.id : "";
        current.replaceWith(document.adoptNode(fresh));
        if (focused) {
          var again = document.getElementById(focused);
          if (again) {
            again.focus();
          }
        }
        document.body.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () {})
      .then(function () {
        busy = false;
      });
  }
  window.setInterval(refresh, 1000);
})();
