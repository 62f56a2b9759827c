// The log viewer on a job's page: a live tail that asks the server for the
// lines after its cursor about once a second, stdout/stderr/platform tabs,
// jump to start or end, and a search the server runs over the whole log.
(function () {
  "use strict";

  var root = document.querySelector("[data-log-viewer]");
  if (!root) return;
  var base = root.dataset.base;
  var select = root.querySelector("#log-task");
  var tabs = Array.prototype.slice.call(root.querySelectorAll("[role=tab][data-stream]"));
  var view = root.querySelector("[data-log-lines]");
  var statusLine = root.querySelector("[data-log-status]");
  var follow = root.querySelector("[data-log-follow]");
  var download = root.querySelector("[data-log-download]");
  var results = root.querySelector("[data-log-results]");
  var moreBox = root.querySelector("[data-log-more]");
  var MAX_LINES = 5000; // kept on screen while following; the rest is in the download

  var s = { attempt: "", stream: root.dataset.stream || "stdout", cursor: null, mode: "follow", gen: 0, timer: null,
            final: false, more: false, lines: 0, firstShown: 0, highlight: null };

  function url(kind) { return base + s.attempt + "/" + s.stream + "/" + (kind ? kind + "/" : ""); }
  function taskName() { var o = select.selectedOptions[0]; return o && o.value ? o.textContent.split(" · ")[0] : ""; }
  function nearBottom() { return view.scrollHeight - view.scrollTop - view.clientHeight < 40; }

  function note(text, cls) {
    var p = view.querySelector(":scope > ." + (cls || "log-placeholder"));
    if (!text) { if (p) p.remove(); return; }
    if (!p) { p = document.createElement("p"); p.className = cls || "log-placeholder"; view.appendChild(p); }
    p.textContent = text;
  }

  function gap(hiddenLines) {
    var p = view.querySelector(":scope > .log-gap");
    if (!hiddenLines) { if (p) p.remove(); return; }
    if (!p) {
      p = document.createElement("p"); p.className = "log-gap";
      p.innerHTML = '<span></span> <button type="button" class="link" data-log-start>Jump to start</button>';
      view.insertBefore(p, view.firstChild);
    }
    p.firstChild.textContent = hiddenLines.toLocaleString() + " earlier line" + (hiddenLines === 1 ? " is" : "s are") + " not shown.";
  }

  function updateStatus() {
    var bits = [taskName(), s.stream];
    if (s.lines) bits.push("lines " + (s.firstShown + 1).toLocaleString() + "–" + (s.cursor + 1).toLocaleString());
    if (s.final) bits.push("task ended, log complete");
    else if (follow.checked) bits.push("following");
    statusLine.textContent = bits.filter(Boolean).join(" · ");
  }

  function remember() {
    var params = new URLSearchParams(location.search);
    params.set("log", s.attempt); params.set("stream", s.stream);
    history.replaceState(null, "", location.pathname + "?" + params.toString() + location.hash);
  }

  function open(attempt, stream, opts) {
    opts = opts || {};
    s.gen += 1; clearTimeout(s.timer);
    s.attempt = attempt || ""; s.stream = stream;
    s.cursor = opts.after === undefined ? null : opts.after;
    s.mode = opts.mode || "follow"; s.final = false; s.more = false; s.lines = 0;
    s.highlight = opts.highlight === undefined ? null : opts.highlight;
    view.innerHTML = ""; view.dataset.stream = stream; moreBox.hidden = true;
    tabs.forEach(function (t) {
      var on = t.dataset.stream === stream;
      t.setAttribute("aria-selected", on ? "true" : "false");
      t.tabIndex = on ? 0 : -1;
    });
    if (select.value !== s.attempt) select.value = s.attempt;
    keep();
    if (opts.keepResults !== true) results.hidden = true;
    if (!s.attempt) {
      download.hidden = true;
      note("The log appears here once a task starts.");
      statusLine.textContent = "";
      return;
    }
    download.hidden = false;
    download.href = url("download");
    follow.checked = s.mode === "follow";
    note("Loading…");
    remember();
    fetchChunk(s.gen);
  }

  function fetchChunk(gen) {
    var address = url("") + (s.cursor === null ? "" : "?after=" + s.cursor);
    window.portal.fetchHtml(address).then(function (html) {
      if (gen !== s.gen) return;
      if (apply(html)) schedule(gen);
    }).catch(function (err) {
      if (gen !== s.gen) return;
      statusLine.textContent = "Could not read the log (" + err.message + "); trying again…";
      s.timer = setTimeout(function () { fetchChunk(gen); }, 5000);
    });
  }

  function apply(html) {
    var holder = document.createElement("template");
    holder.innerHTML = html;
    var chunk = holder.content.querySelector(".log-chunk");
    if (!chunk) { statusLine.textContent = "The log could not be read; reload the page."; return false; }
    var firstLoad = s.lines === 0;
    var stick = follow.checked && (firstLoad || nearBottom());
    var rows = chunk.querySelectorAll(".log-line");
    if (rows.length) {
      note("");
      if (firstLoad) {
        s.firstShown = Number(chunk.dataset.first);
        gap(s.firstShown);
      }
      var batch = document.createDocumentFragment();
      rows.forEach(function (row) { batch.appendChild(row); });
      view.appendChild(batch);
      s.lines += rows.length;
    }
    s.cursor = Number(chunk.dataset.next);
    s.more = chunk.dataset.more === "1";
    s.final = chunk.dataset.final === "1";
    if (s.mode === "follow") trim();
    if (!s.lines) note(s.final ? "This stream is empty." : "No output yet. Lines appear here as the task prints them.");
    if (s.highlight !== null) {
      var hit = view.querySelector('.log-line[data-seq="' + s.highlight + '"]');
      if (hit) { hit.classList.add("hit"); view.scrollTop = hit.offsetTop - view.clientHeight / 3; }
      s.highlight = null;
    } else if (stick) {
      view.scrollTop = view.scrollHeight;
    }
    updateStatus();
    return true;
  }

  // While following, the oldest lines leave the screen (the download has them).
  function trim() {
    var extra = s.lines - MAX_LINES;
    if (extra <= 0) return;
    var lines = view.querySelectorAll(".log-line");
    for (var i = 0; i < extra; i++) lines[i].remove();
    s.lines -= extra;
    s.firstShown = Number(view.querySelector(".log-line").dataset.seq);
    gap(s.firstShown);
  }

  function schedule(gen) {
    if (s.more && s.mode === "page") { moreBox.hidden = false; return; }
    var delay = s.more ? 0 : (s.final ? 5000 : 1000);
    if (document.hidden) delay = Math.max(delay, 10000);
    s.timer = setTimeout(function () { fetchChunk(gen); }, delay);
  }

  function jumpToStart() { open(s.attempt, s.stream, { after: -1, mode: "page" }); view.scrollTop = 0; }
  function jumpToEnd() { open(s.attempt, s.stream, { mode: "follow" }); }

  // ---- controls
  select.addEventListener("change", function () { open(select.value, s.stream); });
  tabs.forEach(function (tab) {
    tab.addEventListener("click", function () { open(s.attempt, tab.dataset.stream); });
  });
  window.portal.arrowKeyTabs(tabs, function (tab) { open(s.attempt, tab.dataset.stream); });
  root.addEventListener("click", function (event) {
    if (event.target.closest("[data-log-start]")) { jumpToStart(); return; }
    if (event.target.closest("[data-log-end]")) { jumpToEnd(); return; }
    if (event.target.closest("[data-log-next]")) { moreBox.hidden = true; fetchChunk(s.gen); return; }
    if (event.target.closest("[data-log-results-close]")) { results.hidden = true; return; }
    var hit = event.target.closest(".log-hit");
    if (hit) {
      var seq = Number(hit.dataset.seq);
      open(s.attempt, s.stream, { after: Math.max(-1, seq - 20), mode: "page", highlight: seq, keepResults: true });
    }
  });
  follow.addEventListener("change", function () {
    if (follow.checked) { if (s.mode === "page" && s.more) jumpToEnd(); else view.scrollTop = view.scrollHeight; }
    updateStatus();
  });
  view.addEventListener("scroll", function () {
    var bottom = nearBottom();
    if (follow.checked !== bottom && !(s.mode === "page" && s.more)) { follow.checked = bottom; updateStatus(); }
  }, { passive: true });
  root.querySelector("[data-log-search]").addEventListener("submit", function (event) {
    event.preventDefault();
    var query = event.target.q.value.trim();
    if (!s.attempt) return;
    results.hidden = false;
    results.textContent = "Searching…";
    window.portal.fetchHtml(url("search") + "?q=" + encodeURIComponent(query)).then(function (html) {
      results.innerHTML = html;
    }).catch(function (err) { results.textContent = "The search failed: " + err.message; });
  });

  // stdout / stderr links in the task tables open here instead of a new page.
  document.addEventListener("click", function (event) {
    var link = event.target.closest("a[data-log-attempt]");
    if (!link || event.ctrlKey || event.metaKey || event.shiftKey) return;
    event.preventDefault();
    open(link.dataset.logAttempt, link.dataset.logStream);
    root.scrollIntoView({ behavior: "smooth", block: "start" });
  });

  // The task menu is refreshed with the rest of the page while the job runs.
  // It lists the tasks the tables show; the task open here stays in it when
  // the tables show others (it came from the page's URL).
  var kept = null;
  function keep() {
    var option = s.attempt && select.querySelector('option[value="' + s.attempt + '"]');
    if (!option) return;
    kept = option.parentNode.tagName === "OPTGROUP" ? option.parentNode.cloneNode(false) : null;
    if (kept) kept.appendChild(option.cloneNode(true)); else kept = option.cloneNode(true);
  }
  document.addEventListener("portal:part-updated", function (event) {
    if (event.detail.name !== "logtasks") return;
    var keptHere = kept && (kept.tagName === "OPTION" ? kept.value === s.attempt
                                                      : kept.querySelector('option[value="' + s.attempt + '"]'));
    if (s.attempt && keptHere && !select.querySelector('option[value="' + s.attempt + '"]')) {
      select.appendChild(kept.cloneNode(true));
    }
    if (s.attempt && select.querySelector('option[value="' + s.attempt + '"]')) {
      select.value = s.attempt;
      keep();
      updateStatus();
    } else if (!s.attempt) {
      var first = select.querySelector("option[value]:not([value=''])");
      if (first) open(first.value, s.stream);
    }
  });

  var wanted = root.dataset.attempt;
  var start = (wanted && select.querySelector('option[value="' + wanted + '"]')) || select.querySelector("option[value]:not([value=''])");
  open(start ? start.value : "", s.stream);
})();
