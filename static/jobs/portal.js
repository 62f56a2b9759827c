// Small progressive enhancements shared by every page. Pages work without it.
(function () {
  "use strict";

  var root = document.documentElement;
  root.classList.add("js");

  // Each carries its zone's short name ("EST", "GMT+2"): a bare "05:47 AM" could be any zone's.
  var LONG = { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short" };
  var SHORT = { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", timeZoneName: "short" };
  var SHORT_SECONDS = { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short" };

  // <time datetime="..."> in the reader's own time zone; the server's text
  // (UTC) stays as the tooltip.
  function localTimes(scope) {
    scope.querySelectorAll("time[datetime]").forEach(function (el) {
      if (el.dataset.localized) return;
      var when = new Date(el.getAttribute("datetime"));
      if (isNaN(when)) return;
      var sameYear = when.getFullYear() === new Date().getFullYear();
      // Tables are dense: the year goes when it is this one (and the seconds in the job list).
      var format = !sameYear || !el.closest("table") ? LONG : el.closest(".jobs-table") ? SHORT : SHORT_SECONDS;
      el.title = el.textContent.trim();
      el.textContent = when.toLocaleString(undefined, format);
      el.dataset.localized = "1";
    });
  }

  // "1h 02m 03s", the same words as the server's duration_text filter.
  function durationText(ms) {
    var s = Math.max(0, Math.floor(ms / 1000));
    var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), sec = s % 60;
    var two = function (n) { return (n < 10 ? "0" : "") + n; };
    if (d) return d + "d " + h + "h " + two(m) + "m";
    if (h) return h + "h " + two(m) + "m " + two(sec) + "s";
    if (m) return m + "m " + two(sec) + "s";
    return sec + "s";
  }

  // Running durations and "… ago" keep ticking without asking the server.
  function tick() {
    var now = Date.now();
    document.querySelectorAll(".duration[data-start]").forEach(function (el) {
      el.textContent = durationText(now - new Date(el.dataset.start));
    });
    document.querySelectorAll(".ago[data-since]").forEach(function (el) {
      el.textContent = durationText(now - new Date(el.dataset.since)) + " ago";
    });
  }

  // <button data-copy="text"> or data-copy-target="#id" copies to the clipboard.
  function copyButtons(scope) {
    scope.querySelectorAll("[data-copy], [data-copy-target]").forEach(function (button) {
      if (button.dataset.copyBound) return;
      button.dataset.copyBound = "1";
      button.addEventListener("click", function () {
        var text = button.dataset.copy;
        if (text === undefined) {
          var target = document.querySelector(button.dataset.copyTarget);
          text = target ? (target.value !== undefined ? target.value : target.textContent) : "";
        }
        var done = function () { var old = button.textContent; button.textContent = "Copied"; setTimeout(function () { button.textContent = old; }, 1200); };
        if (navigator.clipboard && window.isSecureContext) {
          navigator.clipboard.writeText(text).then(done);
        } else {
          var area = document.createElement("textarea");
          area.value = text; document.body.appendChild(area); area.select();
          document.execCommand("copy"); area.remove(); done();
        }
      });
    });
  }

  // The left pane folds into a "Menu" button on narrow screens.
  function navToggle() {
    var sidebar = document.getElementById("sidebar");
    var button = sidebar && sidebar.querySelector(".nav-toggle");
    if (!button) return;
    sidebar.classList.add("collapsible");
    button.hidden = false;
    button.addEventListener("click", function () {
      var open = sidebar.classList.toggle("open");
      button.setAttribute("aria-expanded", open ? "true" : "false");
    });
  }

  // A link or button with data-dialog="id" opens that <dialog> instead of
  // going to its (no-JavaScript) confirmation page; [data-close] closes it.
  document.addEventListener("click", function (event) {
    var opener = event.target.closest("[data-dialog]");
    if (opener) {
      var dialog = document.getElementById(opener.dataset.dialog);
      if (dialog && dialog.showModal && !opener.disabled) {
        event.preventDefault();
        dialog.showModal();
        var cancel = dialog.querySelector("[data-close]");
        if (cancel) cancel.focus();
      }
      return;
    }
    var closer = event.target.closest("dialog [data-close]");
    if (closer) closer.closest("dialog").close();
  });

  // Filter forms with data-autosubmit apply a menu choice made with the
  // mouse at once; keyboard users move through options freely and press Apply.
  function autoSubmit(scope) {
    scope.querySelectorAll("form[data-autosubmit] select").forEach(function (select) {
      var byPointer = false;
      select.addEventListener("pointerdown", function () { byPointer = true; });
      select.addEventListener("keydown", function () { byPointer = false; });
      select.addEventListener("change", function () { if (byPointer) select.form.requestSubmit(); });
    });
  }

  // Fetch an HTML fragment of our own; a login page instead means the
  // session ended.
  function fetchHtml(url) {
    return fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } }).then(function (response) {
      if (!response.ok) throw new Error("the server answered " + response.status);
      if (response.redirected && /\/login\//.test(response.url)) throw new Error("signed out: reload the page to sign in again");
      return response.text();
    });
  }

  // Left and right arrow keys move between the tabs of a tablist (the
  // WAI-ARIA tabs pattern); `choose(tab)` shows the tab reached.
  function arrowKeyTabs(tabs, choose) {
    tabs.forEach(function (tab, i) {
      tab.addEventListener("keydown", function (event) {
        var step = event.key === "ArrowRight" ? 1 : event.key === "ArrowLeft" ? -1 : 0;
        if (!step) return;
        var next = tabs[(i + step + tabs.length) % tabs.length];
        choose(next); next.focus();
      });
    });
  }

  function enhance(scope) { localTimes(scope); copyButtons(scope); }
  window.portal = { enhance: enhance, fetchHtml: fetchHtml, arrowKeyTabs: arrowKeyTabs };
  document.addEventListener("DOMContentLoaded", function () {
    enhance(document);
    navToggle();
    autoSubmit(document);
    tick();
    setInterval(tick, 1000);
  });
})();
