// Small progressive enhancements shared by every page. Pages work without it.
(function () {
  "use strict";

  // <time datetime="..."> in the reader's own time zone.
  function localTimes(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var when = new Date(el.getAttribute("datetime"));
      if (isNaN(when)) return;
      el.textContent = when.toLocaleString(undefined, { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
      el.title = when.toISOString();
    });
  }

  // <button data-copy="text"> or data-copy-target="#id" copies to the clipboard.
  function copyButtons(root) {
    root.querySelectorAll("[data-copy], [data-copy-target]").forEach(function (button) {
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

  function enhance(root) { localTimes(root); copyButtons(root); }
  window.portalEnhance = enhance;
  document.addEventListener("DOMContentLoaded", function () { enhance(document); });
})();
