// Storage page: uploads of files and whole folders with a progress bar.
// Files go in batches (Django accepts at most 100 files per request), each
// batch one XHR whose upload progress moves the bar. Without JavaScript the
// form still posts the chosen files (folder structure is then lost).
(function () {
  "use strict";

  var MAX_FILES = 50;
  var MAX_BYTES = 32 * 1024 * 1024;

  function human(bytes) {
    var units = ["bytes", "KB", "MB", "GB", "TB"], i = 0;
    while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
    return (i ? bytes.toFixed(1) : bytes) + " " + units[i];
  }

  // [{file, name}] -> batches that keep each request small; a big file goes alone.
  function batches(items) {
    var out = [], current = [], size = 0;
    items.forEach(function (item) {
      if (current.length && (current.length >= MAX_FILES || size + item.file.size > MAX_BYTES)) {
        out.push(current); current = []; size = 0;
      }
      current.push(item); size += item.file.size;
    });
    if (current.length) out.push(current);
    return out;
  }

  function chosen(form) {
    var items = [];
    Array.prototype.forEach.call(form.querySelector("#upload-files").files, function (file) {
      items.push({ file: file, name: file.name });
    });
    Array.prototype.forEach.call(form.querySelector("#upload-folder").files, function (file) {
      items.push({ file: file, name: file.webkitRelativePath || file.name });
    });
    return items;
  }

  function send(form, batch, onProgress) {
    return new Promise(function (resolve, reject) {
      var data = new FormData();
      data.append("csrfmiddlewaretoken", form.elements.csrfmiddlewaretoken.value);
      data.append("path", form.elements.path.value);
      if (form.elements.overwrite.checked) data.append("overwrite", "1");
      batch.forEach(function (item) { data.append("files", item.file, item.file.name); data.append("names", item.name); });
      var xhr = new XMLHttpRequest();
      xhr.open("POST", form.action);
      xhr.setRequestHeader("Accept", "application/json");
      xhr.upload.addEventListener("progress", function (event) { if (event.lengthComputable) onProgress(event.loaded / event.total); });
      xhr.addEventListener("load", function () {
        var body = {};
        try { body = JSON.parse(xhr.responseText); } catch (e) { body = { error: "the server answered " + xhr.status }; }
        if (xhr.status >= 200 && xhr.status < 300) resolve(body); else reject(new Error(body.error || ("the server answered " + xhr.status)));
      });
      xhr.addEventListener("error", function () { reject(new Error("the connection failed")); });
      xhr.send(data);
    });
  }

  function setup(form) {
    var bar = form.querySelector("#upload-bar");
    var status = form.querySelector("#upload-status");
    var button = form.querySelector("#upload-button");
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var items = chosen(form);
      if (!items.length) { form.querySelector("#upload-progress").hidden = false; status.textContent = "Choose files or a folder first."; return; }
      var total = items.reduce(function (sum, item) { return sum + item.file.size; }, 0) || 1;
      var done = 0, saved = 0;
      form.querySelector("#upload-progress").hidden = false;
      form.classList.remove("failed");
      button.disabled = true;
      var show = function (fraction, batchBytes) {
        var sent = done + fraction * batchBytes;
        bar.value = sent / total;
        status.textContent = human(Math.min(sent, total)) + " of " + human(total);
      };
      batches(items).reduce(function (chain, batch) {
        var bytes = batch.reduce(function (sum, item) { return sum + item.file.size; }, 0);
        return chain.then(function () {
          return send(form, batch, function (fraction) { show(fraction, bytes); }).then(function (body) {
            done += bytes; saved += body.saved.length; show(0, 0);
          });
        });
      }, Promise.resolve()).then(function () {
        bar.value = 1;
        status.textContent = "Uploaded " + saved + " file(s), " + human(total) + ".";
        window.location.reload();
      }, function (error) {
        form.classList.add("failed");
        status.textContent = "Upload stopped: " + error.message + (saved ? " (" + saved + " file(s) were stored before that)" : "");
        button.disabled = false;
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var form = document.getElementById("upload-form");
    if (form) setup(form);
  });
})();
