// The job list (selection, bulk stop, live rows) and a job's page (live
// summary and task tables, config tabs). Both pages work without it.
(function () {
  "use strict";

  var ACTIVE = { WAITING: 1, RUNNING: 1, STOPPING: 1 };

  // What a fragment says, to tell whether it changed: serialized the
  // browser's way, without the durations that tick on their own.
  function normalized(html, wrapper) {
    var holder = document.createElement(wrapper || "template");
    holder.innerHTML = html;
    var scope = holder.content || holder;
    scope.querySelectorAll(".duration[data-start], .ago[data-since]").forEach(function (el) { el.textContent = ""; });
    return holder.innerHTML;
  }

  function pollDelay(busy) { return document.hidden ? 15000 : busy; }

  // ------------------------------------------------------------- the list

  function jobList() {
    var body = document.getElementById("job-rows");
    if (!body) return;
    var form = document.getElementById("bulk-form");
    var all = document.getElementById("select-all");
    var stopButton = document.getElementById("bulk-stop");
    var counter = form.querySelector("[data-selected-count]");
    var note = document.getElementById("live-note");
    var last = normalized(body.innerHTML, "tbody");

    function boxes() { return Array.prototype.slice.call(body.querySelectorAll("input[name=job]")); }

    function refresh() {
      var list = boxes();
      var checked = list.filter(function (b) { return b.checked; });
      counter.textContent = checked.length ? " (" + checked.length + ")" : "";
      stopButton.disabled = checked.length === 0;
      stopButton.title = checked.length ? "" : "Select jobs that are waiting or running first";
      all.checked = list.length > 0 && checked.length === list.length;
      all.indeterminate = checked.length > 0 && checked.length < list.length;
      all.disabled = list.length === 0;
      list.forEach(function (b) { b.closest("tr").classList.toggle("selected", b.checked); });
    }

    all.addEventListener("change", function () {
      boxes().forEach(function (b) { b.checked = all.checked; });
      refresh();
    });
    body.addEventListener("change", refresh);
    refresh();

    function states() {
      var map = {};
      body.querySelectorAll("tr[data-job-id]").forEach(function (row) { map[row.dataset.jobId] = row.dataset.state; });
      return map;
    }

    function swap(html) {
      var fresh = normalized(html, "tbody");
      if (fresh === last) return;
      last = fresh;
      var before = states();
      var chosen = boxes().filter(function (b) { return b.checked; }).map(function (b) { return b.value; });
      var focused = document.activeElement && body.contains(document.activeElement) ? document.activeElement : null;
      var focusKey = focused ? (focused.name === "job" ? "input[value='" + focused.value + "']" : focused.getAttribute("href") && "a[href='" + focused.getAttribute("href") + "']") : null;
      body.innerHTML = html;
      boxes().forEach(function (b) { b.checked = chosen.indexOf(b.value) >= 0; });
      body.querySelectorAll("tr[data-job-id]").forEach(function (row) {
        var old = before[row.dataset.jobId];
        if (old && old !== row.dataset.state) row.classList.add("changed");
      });
      if (focusKey) { var again = body.querySelector(focusKey); if (again) again.focus(); }
      window.portal.enhance(body);
      refresh();
      note.textContent = "Updated " + new Date().toLocaleTimeString();
    }

    function poll() {
      var shown = states();
      var busy = Object.keys(shown).some(function (id) { return ACTIVE[shown[id]]; });
      setTimeout(function () {
        window.portal.fetchHtml(body.dataset.rowsUrl).then(swap).catch(function (err) {
          note.textContent = "Live updates paused: " + err.message;
        }).then(poll);
      }, pollDelay(busy ? 3000 : 20000));
    }
    poll();
  }

  // -------------------------------------------------------- a job's page

  function jobPage() {
    var live = document.getElementById("job-live");
    if (!live) return;
    var parts = {};
    document.querySelectorAll("[data-part]").forEach(function (el) {
      parts[el.dataset.part] = { el: el, html: normalized(el.innerHTML, el.tagName === "SELECT" ? "select" : "template") };
    });
    var finalPolls = 0;

    function currentState() {
      var line = document.querySelector("[data-job-state]");
      return line ? line.dataset.jobState : "";
    }

    function apply(html) {
      var holder = document.createElement("template");
      holder.innerHTML = html;
      holder.content.querySelectorAll("[data-part]").forEach(function (incoming) {
        var part = parts[incoming.dataset.part];
        if (!part) return;
        var fresh = normalized(incoming.innerHTML, part.el.tagName === "SELECT" ? "select" : "template");
        if (fresh === part.html) return;
        part.html = fresh;
        part.el.innerHTML = incoming.innerHTML;
        window.portal.enhance(part.el);
        document.dispatchEvent(new CustomEvent("portal:part-updated", { detail: { name: incoming.dataset.part } }));
      });
    }

    function poll() {
      var ended = !ACTIVE[currentState()];
      // A job that has ended still gets a few polls: its tasks' last exits
      // are recorded just after the job's.
      if (ended && finalPolls++ >= 3) return;
      setTimeout(function () {
        window.portal.fetchHtml(live.dataset.liveUrl).then(apply).catch(function () { /* try again next time */ }).then(poll);
      }, pollDelay(ended ? 3000 : pulling() ? 500 : 2000));
    }
    // An image pull under way changes by the second: follow it as often as
    // the node writes it (jobs/node/images/, PROGRESS_INTERVAL).
    function pulling() {
      return !!document.querySelector('[data-pull-state="PULLING"]');
    }
    poll();
  }

  // Two-tab views (the config: as submitted / normalized).
  function tabs() {
    document.querySelectorAll(".config [role=tablist]").forEach(function (list) {
      var buttons = Array.prototype.slice.call(list.querySelectorAll("[role=tab]"));
      function show(chosen) {
        buttons.forEach(function (b) {
          var on = b === chosen;
          b.setAttribute("aria-selected", on ? "true" : "false");
          b.tabIndex = on ? 0 : -1;
          document.getElementById(b.getAttribute("aria-controls")).hidden = !on;
        });
      }
      buttons.forEach(function (b) { b.addEventListener("click", function () { show(b); }); });
      window.portal.arrowKeyTabs(buttons, show);
      show(buttons.filter(function (b) { return b.getAttribute("aria-selected") === "true"; })[0] || buttons[0]);
    });
  }

  jobList();
  jobPage();
  tabs();
})();
