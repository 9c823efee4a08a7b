// Sonic's dashboard: the one script. Pages read fine without it; on a job's page it follows the
// job's event stream (the same cookie opens it) and reloads the page's job part as the job moves
// on and when it ends, without reloading the page.
"use strict";
(function () {
  var root = document.getElementById("job");
  if (!root || !window.EventSource) {
    return;
  }
  var id = root.getAttribute("data-job");
  var terminal = function (s) {
    return s === "succeeded" || s === "failed";
  };
  if (terminal(root.getAttribute("data-status"))) {
    return;
  }
  var text = function (elementId, value) {
    var el = document.getElementById(elementId);
    if (el) {
      el.textContent = value;
    }
  };
  var refreshing = false;
  var again = false;
  var refresh = function (done) {
    if (refreshing) {
      again = true;
      return;
    }
    refreshing = true;
    fetch("/jobs/" + encodeURIComponent(id) + "/live", { credentials: "same-origin" })
      .then(function (r) {
        return r.ok ? r.text() : Promise.reject(r.status);
      })
      .then(function (html) {
        root.innerHTML = html;
        if (done) {
          root.setAttribute("data-status", done);
        }
      })
      .catch(function () {})
      .then(function () {
        refreshing = false;
        if (again) {
          again = false;
          refresh(done);
        }
      });
  };
  var lastStage = null;
  var source = new EventSource("/jobs/" + encodeURIComponent(id) + "/events");
  source.onmessage = function (m) {
    var ev;
    try {
      ev = JSON.parse(m.data);
    } catch (e) {
      return;
    }
    var badge = document.querySelector("#job-status .badge");
    if (badge) {
      badge.textContent = ev.status;
      badge.className = "badge s-" + ev.status;
      badge.setAttribute("data-status", ev.status);
    }
    text("live-stage", ev.stage || "-");
    text("live-done", String(ev.done_instances));
    text("live-total", String(ev.total_instances));
    text("live-message", ev.message || "");
    var bar = document.getElementById("live-progress");
    if (bar) {
      bar.max = Math.max(1, ev.total_instances);
      bar.value = ev.done_instances;
    }
    if (terminal(ev.status)) {
      source.close();
      refresh(ev.status);
    } else if (ev.stage !== lastStage) {
      // A new stage: the plan and placement may have been recorded meanwhile.
      lastStage = ev.stage;
      refresh(null);
    }
  };
  source.onerror = function () {
    // The stream broke: the browser reconnects (the first event is the job's state then);
    // meanwhile, a fresh look at the job.
    refresh(null);
  };
})();
