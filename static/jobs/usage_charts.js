// A job's usage graphs (templates/jobs/partials/job_usage.html): CPU, memory
// and, for real GPUs, GPU utilisation of each task, drawn with the vendored
// uPlot from the REST API (GET /api/v2/jobs/<user>~<name>/metrics). While the
// job runs it asks again for the samples after the last one it has (`since`)
// and extends the graphs, at the pace the nodes sample.
(function () {
  "use strict";

  var ACTIVE = { WAITING: 1, RUNNING: 1, STOPPING: 1 };
  var MIB = 1024 * 1024;
  var root = document.getElementById("usage-charts");
  if (!root || !window.uPlot) return;
  var url = root.dataset.metricsUrl;
  var period = Math.max(2000, 1000 * parseFloat(root.dataset.sampleSeconds || "5"));
  var STALLED_MS = Math.max(120000, 10 * period);
  var tasks = {};
  var since = "";
  var finalPolls = 0;

  function getJson(address) {
    return fetch(address, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.json();
    });
  }

  function chart(box, name, label, stroke, unit) {
    var holder = document.createElement("div");
    holder.className = "usage-chart";
    holder.dataset.chart = name;
    holder.dataset.points = "0";
    box.appendChild(holder);
    var width = Math.max(260, Math.min(420, Math.floor((root.clientWidth - 48) / 3)));
    var plot = new window.uPlot({
      width: width, height: 150, title: label,
      // From zero, so a small change does not look like a cliff.
      scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.15 : 1]; } } },
      legend: { show: false },
      series: [{}, { label: label, stroke: stroke, width: 1.5, fill: stroke + "22", value: function (u, v) { return v == null ? "-" : v.toFixed(1) + unit; } }],
      axes: [{}, { size: 70, values: function (u, vals) { return vals.map(function (v) { return +v.toFixed(1) + unit; }); } }],
    }, [[], []], holder);
    holder.usagePlot = plot;  // what it drew can be read back (the browser test does)
    return { el: holder, plot: plot };
  }

  function taskBox(info) {
    var key = info.taskRole + "-" + info.taskIndex + "#" + info.attempt;
    if (tasks[key]) return tasks[key];
    var empty = root.querySelector("[data-usage-empty]");
    if (empty) empty.remove();
    var box = document.createElement("figure");
    box.className = "usage-task";
    box.dataset.task = info.taskRole + "-" + info.taskIndex;
    var caption = document.createElement("figcaption");
    caption.textContent = info.taskRole + "-" + info.taskIndex + (info.node ? " on " + info.node : "");
    var flag = document.createElement("span");
    flag.className = "badge idle-gpus";
    flag.textContent = "GPUs idle";
    flag.title = "Its GPUs have stayed almost unused for a while: stop the job if it no longer needs them.";
    flag.hidden = true;
    caption.appendChild(document.createTextNode(" "));
    caption.appendChild(flag);
    box.appendChild(caption);
    root.appendChild(box);
    tasks[key] = {
      box: box, flag: flag, times: [], cpu: [], memory: [], gpu: [],
      charts: { cpu: chart(box, "cpu", "CPU", "#2563eb", "%"), memory: chart(box, "memory", "Memory", "#16a34a", " MiB") },
    };
    return tasks[key];
  }

  function draw(name, entry, values) {
    var c = entry.charts[name];
    if (!c) {
      if (name !== "gpu") return;
      c = entry.charts.gpu = chart(entry.box, "gpu", "GPU", "#9333ea", "%");
    }
    c.plot.setData([entry.times, values]);
    c.el.dataset.points = String(entry.times.length);
  }

  function add(info) {
    var entry = taskBox(info);
    entry.flag.hidden = !info.idleGpus;
    if (!info.samples.length) return;
    info.samples.forEach(function (s) {
      if (entry.last && s.time <= entry.last) return;  // had it already (see nextSince)
      entry.last = s.time;
      entry.times.push(Date.parse(s.time) / 1000);
      entry.cpu.push(s.cpuPercent);
      entry.memory.push(s.memoryBytes / MIB);
      // The busiest of the task's GPUs; none for simulated GPUs (no figures).
      entry.gpu.push(s.gpus.length ? Math.max.apply(null, s.gpus.map(function (g) { return g.utilPercent; })) : null);
    });
    draw("cpu", entry, entry.cpu);
    draw("memory", entry, entry.memory);
    if (entry.gpu.some(function (v) { return v !== null; })) draw("gpu", entry, entry.gpu);
  }

  // Nodes sample on their own clocks: ask from the oldest newest sample of
  // the running tasks, so a node that writes its round a little later is
  // not skipped (what comes twice is dropped in add). A task whose samples
  // stopped well before the others' (its node's sampler is away) is left
  // out: an answer gives each task only `samplesPerTask` after `since`, and
  // asking from its old last sample would give the others only samples
  // they have, for as long as it stays running.
  function nextSince(body) {
    var lasts = body.tasks.filter(function (t) { return t.state === "RUNNING"; }).map(function (t) {
      return (tasks[t.taskRole + "-" + t.taskIndex + "#" + t.attempt] || {}).last || "";
    });
    if (lasts.some(function (l) { return !l; })) return "";
    if (!lasts.length) return since;
    lasts.sort();
    var newest = Date.parse(lasts[lasts.length - 1]);
    var current = lasts.filter(function (l) { return newest - Date.parse(l) <= STALLED_MS; });
    return current[0];
  }

  function poll() {
    getJson(url + (since ? "?since=" + encodeURIComponent(since) : "")).then(function (body) {
      body.tasks.forEach(add);
      since = nextSince(body);
      root.dataset.loaded = "true";
      if (ACTIVE[body.state] || finalPolls++ < 1) setTimeout(poll, document.hidden ? 15000 : period);
    }).catch(function () { setTimeout(poll, 15000); });
  }
  poll();
})();
