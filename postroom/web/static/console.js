// postroom console: refreshes the "At a glance" page from /glance.json without reloading it.
// Written for this console (no build step, no library); every value is set as text, never HTML.
"use strict";
(function () {
  var REFRESH_MS = 5000;
  var SVG = "http://www.w3.org/2000/svg";

  function text(el, value) { el.textContent = value === null || value === undefined ? "-" : String(value); }

  function cell(row, value) { var td = document.createElement("td"); text(td, value); row.appendChild(td); }

  function chart(holder, labels, values) {
    var width = 600, height = 120, max = Math.max.apply(null, values.concat([1]));
    var bar = width / Math.max(values.length, 1);
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", "0 0 " + width + " " + (height + 14));
    svg.setAttribute("width", "100%");
    values.forEach(function (value, n) {
      var h = Math.round(value / max * height);
      var rect = document.createElementNS(SVG, "rect");
      rect.setAttribute("x", String(n * bar + 1));
      rect.setAttribute("y", String(height - h));
      rect.setAttribute("width", String(Math.max(bar - 2, 1)));
      rect.setAttribute("height", String(h));
      rect.setAttribute("class", "bar");
      var title = document.createElementNS(SVG, "title");
      title.textContent = labels[n] + ": " + value;
      rect.appendChild(title);
      svg.appendChild(rect);
    });
    var caption = document.createElementNS(SVG, "text");
    caption.setAttribute("x", "0");
    caption.setAttribute("y", String(height + 12));
    caption.setAttribute("class", "axis");
    caption.textContent = (labels[0] || "") + " … " + (labels[labels.length - 1] || "") + " UTC, max " + max;
    svg.appendChild(caption);
    holder.replaceChildren(svg);
    holder.setAttribute("aria-label", holder.getAttribute("aria-label").split(":")[0] + ": " +
      values.reduce(function (a, b) { return a + b; }, 0) + " in the last hour");
  }

  function show(data) {
    text(document.getElementById("glance-at"), "as of " + data.at + (data.lag_error ? " (lag: " + data.lag_error + ")" : ""));
    var body = document.querySelector("#lag tbody");
    var rows = (data.groups || []).map(function (g) {
      var tr = document.createElement("tr");
      [g.group, g.state, g.members, g.lag, g.lag_seconds].forEach(function (v) { cell(tr, v); });
      return tr;
    });
    body.replaceChildren.apply(body, rows);
    text(document.getElementById("outbox-backlog"), "Outbox backlog: " + data.outbox_backlog + " row(s)" +
      (data.outbox_oldest_s === null ? "" : ", oldest " + Math.round(data.outbox_oldest_s) + " s"));
    chart(document.getElementById("chart-enqueued"), data.minutes, data.enqueued);
    chart(document.getElementById("chart-sent"), data.minutes, data.sent);
  }

  // A refresh is not the user's activity (the console does not count it against the session's
  // idle limit): once the session has ended, the page says so and stops asking.
  function refresh(status) {
    var signedOut = false;
    fetch(status.getAttribute("data-source"), {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (response) {
        if (response.status === 401) {
          signedOut = true;
          throw new Error("signed out: reload the page to sign in again");
        }
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(show)
      .catch(function (error) { text(status, (signedOut ? "" : "could not refresh: ") + error.message); })
      .finally(function () {
        if (!signedOut) { window.setTimeout(function () { refresh(status); }, REFRESH_MS); }
      });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var status = document.getElementById("glance-at");
    if (status) { refresh(status); }
  });
}());
