// A job's usage graphs (templates/jobs/partials/job_usage.html), drawn with
// the vendored uPlot from the REST API (GET /api/v2/jobs/<user>~<name>/metrics).
// While the job runs it asks again for the samples after the last one it
// has (`since`) and extends the graphs, at the pace the nodes sample.
//
// A small job gets CPU, memory and, for real GPUs, GPU utilisation of each
// task. A bigger one (data-job-wide: more than usage.JOB_WIDE_TASKS tasks)
// gets the job as a whole -- CPU cores and memory summed over its tasks, CPU
// per task and GPU utilisation as a mean with the least and most busy
// shaded around it -- added up by the server per time bucket
// (.../metrics/summary, over the window picked in a menu), and one task's
// graphs picked from a menu, read from that task's own address
// (.../tasks/<role>/<index>/metrics) and polled there while it runs. The
// menu is rendered by the server and refreshed with the task tables (a
// live part, data-part="usagetasks"): it lists the tasks they show. The
// page no longer asks the job's .../metrics, whose every task's samples
// were 4.7 MB for a 1,000-task job, only to name its tasks.
(function () {
  "use strict";

  var ACTIVE = { WAITING: 1, RUNNING: 1, STOPPING: 1 };
  var ACTIVE_TASK = { ASSIGNED: 1, LAUNCHING: 1, RUNNING: 1 };
  var MIB = 1024 * 1024;
  var BLUE = "#2563eb", GREEN = "#16a34a", PURPLE = "#9333ea";
  var GIB = 1024 * MIB;
  var root = document.getElementById("usage-charts");
  if (!root || !window.uPlot) return;
  // The job-wide graphs' windows (seconds), as the menu offers them: those
  // the server allows (data-max-window: as far back as samples are kept,
  // whatever the task count, since whole minutes come from a roll-up), or
  // the longest it allows if none of them fits.
  var WINDOWS = (function () {
    var most = parseInt(root.dataset.maxWindow || "86400", 10);
    var all = [[600, "the last 10 minutes"], [3600, "the last hour"], [21600, "the last 6 hours"], [86400, "the last day"]];
    var fit = all.filter(function (w) { return w[0] <= most; });
    return fit.length ? fit : [[most, "the last " + Math.max(1, Math.floor(most / 60)) + " minutes"]];
  })();
  var url = root.dataset.metricsUrl;
  var taskUrl = root.dataset.taskMetricsUrl || "";
  var period = Math.max(2000, 1000 * parseFloat(root.dataset.sampleSeconds || "5"));
  var STALLED_MS = Math.max(120000, 10 * period);
  var tasks = {};  // each task attempt's samples by key (role-index#attempt) and, while shown, its graphs
  var since = "";
  var finalPolls = 0;
  // A big job's page: its job-wide graphs and their buckets, the task menu
  // (the server's, with the option of the task picked kept in case the
  // tables move on) and the task picked.
  var whole = root.dataset.jobWide === "true" ? { box: null, charts: null, select: document.getElementById("usage-task"),
                                                  menu: root.querySelector("[data-usage-pick]"), picked: null, kept: null,
                                                  url: url + "/summary", window: defaultWindow(), series: null, since: "", asked: 0 } : null;

  // An hour for an attempt younger than that (10 s buckets), 6 hours after;
  // the longest window offered under that if the job is too big for it.
  function defaultWindow() {
    var started = Date.parse(root.dataset.started || "");
    var wanted = started && Date.now() - started > 3600000 ? 21600 : 3600, best = WINDOWS[0][0];
    WINDOWS.forEach(function (w) { if (w[0] <= wanted) best = w[0]; });
    return best;
  }

  function getJson(address) {
    return fetch(address, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.json();
    });
  }

  function notNull(v) { return v !== null; }

  function chartWidth() {
    var room = root.clientWidth;
    // Three abreast on a desktop; the panel's width on a phone.
    return room < 600 ? room : Math.max(260, Math.min(420, Math.floor((room - 48) / 3)));
  }

  // One line, filled below it.
  function single(label, stroke) {
    return [{ label: label, stroke: stroke, fill: stroke + "22" }];
  }

  // A mean with the least and most busy around it, the space between them
  // shaded: the mean alone hides a straggler.
  function spread(stroke) {
    return [{ label: "Mean", stroke: stroke, width: 2 },
            { label: "Least busy", stroke: stroke + "99", width: 1, dash: [4, 3] },
            { label: "Most busy", stroke: stroke + "99", width: 1, dash: [4, 3] }];
  }

  // Times of day, with seconds over a few minutes and the day over days:
  // uPlot's own labels add a date line that overlaps on a narrow graph.
  function timeLabels(u, splits) {
    var span = splits.length > 1 ? splits[splits.length - 1] - splits[0] : 0;
    var parts = span > 86400 ? { month: "short", day: "numeric", hour: "numeric" }
      : span < 600 ? { hour: "numeric", minute: "2-digit", second: "2-digit" } : { hour: "numeric", minute: "2-digit" };
    return splits.map(function (t) { return new Date(t * 1000).toLocaleString([], parts); });
  }

  function chart(box, name, title, unit, lines) {
    var holder = document.createElement("div");
    holder.className = "usage-chart";
    holder.dataset.chart = name;
    holder.dataset.points = "0";
    box.appendChild(holder);
    var format = function (u, v) { return v == null ? "-" : v.toFixed(1) + unit; };
    var opts = {
      width: chartWidth(), height: 150, title: title,
      // From zero, so a small change does not look like a cliff.
      scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.15 : 1]; } } },
      // A key for graphs of more than one line; no values under the
      // pointer, which wrapped into a tall table on a phone.
      legend: { show: lines.length > 1, live: false },
      series: [{}].concat(lines.map(function (line) {
        return { label: line.label, stroke: line.stroke, width: line.width || 1.5, fill: line.fill, dash: line.dash, value: format };
      })),
      axes: [{ values: timeLabels, space: 80 }, { size: 70, values: function (u, vals) { return vals.map(function (v) { return +v.toFixed(1) + unit; }); } }],
    };
    if (lines.length === 3) opts.bands = [{ series: [3, 2], fill: lines[0].stroke + "22" }];
    var plot = new window.uPlot(opts, opts.series.map(function () { return []; }), holder);
    holder.usagePlot = plot;  // what it drew can be read back (the browser tests do)
    return { el: holder, plot: plot };
  }

  function setData(c, times, values) {
    c.plot.setData([times].concat(values));
    c.el.dataset.points = String(times.length);
  }

  function removeEmpty() {
    var empty = root.querySelector("[data-usage-empty]");
    if (empty) empty.remove();
  }

  // ------------------------------------------------------------ samples

  function keyOf(info) {
    return info.taskRole + "-" + info.taskIndex + "#" + info.attempt;
  }

  function record(info) {
    var key = keyOf(info);
    var entry = tasks[key] || (tasks[key] = { name: info.taskRole + "-" + info.taskIndex, times: [], cpu: [], memory: [], gpu: [], gpus: [] });
    entry.info = info;
    info.samples.forEach(function (s) {
      if (entry.last && s.time <= entry.last) return;  // had it already (see nextSince)
      entry.last = s.time;
      entry.times.push(Date.parse(s.time) / 1000);
      entry.cpu.push(s.cpuPercent);
      entry.memory.push(s.memoryBytes / MIB);
      var utils = s.gpus.map(function (g) { return g.utilPercent; });
      // The busiest of the task's GPUs for its own graph, all of them for
      // the job's; none for simulated GPUs (no figures).
      entry.gpu.push(utils.length ? Math.max.apply(null, utils) : null);
      entry.gpus.push(utils.length ? utils : null);
    });
    return entry;
  }

  // ---------------------------------------------------------- one task

  function taskFigure(entry) {
    removeEmpty();
    var info = entry.info;
    var box = document.createElement("figure");
    box.className = "usage-task";
    box.dataset.task = entry.name;
    var caption = document.createElement("figcaption");
    caption.textContent = entry.name + (info.node ? " on " + info.node : "");
    var flag = document.createElement("span");
    flag.className = "badge idle-gpus";
    flag.textContent = "GPUs idle";
    flag.title = "Its GPUs have stayed almost unused for a while: stop the job if it no longer needs them.";
    flag.hidden = true;
    caption.appendChild(document.createTextNode(" "));
    caption.appendChild(flag);
    box.appendChild(caption);
    root.appendChild(box);
    entry.box = box;
    entry.flag = flag;
    entry.charts = { cpu: chart(box, "cpu", "CPU", "%", single("CPU", BLUE)),
                     memory: chart(box, "memory", "Memory", " MiB", single("Memory", GREEN)) };
  }

  function drawTask(entry) {
    entry.flag.hidden = !entry.info.idleGpus;
    if (!entry.times.length) return;
    setData(entry.charts.cpu, entry.times, [entry.cpu]);
    setData(entry.charts.memory, entry.times, [entry.memory]);
    if (!entry.gpu.some(notNull)) return;
    entry.charts.gpu = entry.charts.gpu || chart(entry.box, "gpu", "GPU", "%", single("GPU", PURPLE));
    setData(entry.charts.gpu, entry.times, [entry.gpu]);
  }

  function showTasks(body) {
    body.tasks.forEach(function (info) {
      var entry = record(info);
      if (!entry.box) taskFigure(entry);
      drawTask(entry);
    });
  }

  // ------------------------------------------------------- the whole job

  function emptySeries() {
    return { times: [], cores: [], memory: [], cpuMean: [], cpuMin: [], cpuMax: [], gpuMean: [], gpuMin: [], gpuMax: [], tasks: [] };
  }

  function push(s, time, b) {
    s.times.push(time);
    s.tasks.push(b ? b.tasks : null);
    s.cores.push(b ? b.cpuCores : null);
    s.memory.push(b ? b.memoryBytes / GIB : null);
    s.cpuMean.push(b ? b.cpuPercent.mean : null);
    s.cpuMin.push(b ? b.cpuPercent.min : null);
    s.cpuMax.push(b ? b.cpuPercent.max : null);
    var gpu = b && b.gpuPercent;
    s.gpuMean.push(gpu ? gpu.mean : null);
    s.gpuMin.push(gpu ? gpu.min : null);
    s.gpuMax.push(gpu ? gpu.max : null);
  }

  // The server's buckets onto the series; where buckets are missing (no
  // task was sampled) a gap, not a line across it.
  function addBuckets(body) {
    var s = whole.series, step = body.bucketSeconds;
    body.buckets.forEach(function (b) {
      var t = Date.parse(b.time) / 1000, last = s.times.length ? s.times[s.times.length - 1] : null;
      if (last !== null && t <= last) return;  // had it already
      if (last !== null && t - last > step) push(s, last + step, null);
      push(s, t, b);
    });
    // A page left open keeps the window's worth.
    var from = Date.now() / 1000 - whole.window - step, drop = 0;
    while (drop < s.times.length && s.times[drop] < from) drop++;
    if (drop) Object.keys(s).forEach(function (k) { s[k].splice(0, drop); });
    if (body.buckets.length) whole.since = body.buckets[body.buckets.length - 1].time;
  }

  function jobFigure(total) {
    removeEmpty();
    var box = document.createElement("figure");
    box.className = "usage-task usage-job";
    box.dataset.usage = "job";
    var caption = document.createElement("figcaption");
    caption.textContent = "All " + total + " tasks";
    whole.reporting = document.createElement("span");
    whole.reporting.className = "muted usage-reporting";
    caption.appendChild(whole.reporting);
    box.appendChild(caption);
    root.appendChild(box);
    whole.box = box;
    whole.charts = {
      cores: chart(box, "cores", "CPU cores in use, all tasks", "", single("Cores", BLUE)),
      cpu: chart(box, "cpu", "CPU per task", "%", spread(BLUE)),
      memory: chart(box, "memory", "Memory, all tasks", " GiB", single("Memory", GREEN)),
    };
    showMenu();
  }

  // A <select> with its label, in a `tag` of class `className`.
  function labelled(tag, className, id, text) {
    var wrap = document.createElement(tag);
    wrap.className = className;
    var label = document.createElement("label");
    label.htmlFor = id;
    label.textContent = text;
    var select = document.createElement("select");
    select.id = id;
    wrap.appendChild(label);
    wrap.appendChild(select);
    return { wrap: wrap, select: select };
  }

  function windowMenu() {
    var menu = labelled("span", "usage-window", "usage-window", "Job-wide graphs over");
    var select = menu.select;
    WINDOWS.forEach(function (w) { select.appendChild(new Option(w[1], String(w[0]), false, w[0] === whole.window)); });
    select.addEventListener("change", function () {
      whole.window = parseInt(select.value, 10);
      whole.series = null;
      whole.since = "";
      pollSummary();
    });
    return menu.wrap;
  }

  function drawJob(total) {
    var s = whole.series;
    setData(whole.charts.cores, s.times, [s.cores]);
    setData(whole.charts.cpu, s.times, [s.cpuMean, s.cpuMin, s.cpuMax]);
    setData(whole.charts.memory, s.times, [s.memory]);
    if (s.gpuMean.some(notNull)) {
      whole.charts.gpu = whole.charts.gpu || chart(whole.box, "gpu", "GPU utilisation", "%", spread(PURPLE));
      setData(whole.charts.gpu, s.times, [s.gpuMean, s.gpuMin, s.gpuMax]);
    }
    // The newest bucket's count: tasks whose sampler is away, or that ended.
    var newest = s.tasks.length ? s.tasks[s.tasks.length - 1] : total;
    whole.reporting.dataset.tasks = String(newest);
    whole.reporting.textContent = newest < total ? " (newest samples from " + newest + " of them)" : "";
  }

  // The server's task menu, under the job's graphs, with the window menu.
  function showMenu() {
    if (!whole.menu) return;
    whole.menu.appendChild(windowMenu());
    root.appendChild(whole.menu);
    whole.menu.hidden = false;
  }

  function optionOf(name) {
    return Array.prototype.filter.call(whole.select.options, function (o) { return o.value === name; })[0] || null;
  }

  // What the task's metrics and its figure need, from its option.
  function infoOf(option) {
    var data = option.dataset;
    return { taskRole: data.role, taskIndex: parseInt(data.index, 10), attempt: parseInt(data.attempt, 10),
             node: data.node, idleGpus: data.idleGpus === "true", samples: [] };
  }

  function unpick() {
    var entry = whole.picked;
    if (!entry) return;
    clearTimeout(entry.timer);
    Object.keys(entry.charts).forEach(function (name) { entry.charts[name].plot.destroy(); });
    entry.box.remove();
    delete tasks[keyOf(entry.info)];
    whole.picked = whole.kept = null;
  }

  function pick(name) {
    unpick();
    var option = name && optionOf(name);
    if (!option) return;
    var info = infoOf(option);
    delete tasks[keyOf(info)];
    var entry = record(info);
    entry.finalPolls = 0;
    whole.picked = entry;
    whole.kept = option.cloneNode(true);
    taskFigure(entry);
    drawTask(entry);
    pollTask(entry);
  }

  // The picked task's samples from its own address: first its newest (up to
  // 5,000), then those after the last one it has, at the pace the nodes
  // sample, while it runs and once after.
  function pollTask(entry) {
    var info = entry.info;
    var address = taskUrl.replace(/\/ROLE\/INDEX\/metrics$/, "/" + encodeURIComponent(info.taskRole) + "/" + info.taskIndex + "/metrics");
    address += "?attempt=" + info.attempt + (entry.last ? "&since=" + encodeURIComponent(entry.last) : "");
    var again = function () { pollTask(entry); };
    getJson(address).then(function (body) {
      if (whole.picked !== entry) return;  // another task was picked meanwhile
      info.samples = body.samples;
      record(info);
      info.samples = [];
      drawTask(entry);
      if (ACTIVE_TASK[body.taskState] || entry.finalPolls++ < 1) entry.timer = setTimeout(again, document.hidden ? 15000 : period);
    }).catch(function () {
      if (whole.picked === entry) entry.timer = setTimeout(again, 15000);
    });
  }

  // The live part replaced the menu's options (the tables show other tasks,
  // or a task's flags changed), which drops the choice: the picked task
  // stays picked, and in the menu even if the tables no longer show it. A
  // task now in another job attempt (a retry) is picked again there.
  function menuUpdated() {
    var entry = whole.picked;
    if (!entry) return;
    var option = optionOf(entry.name);
    if (!option) whole.select.appendChild(option = whole.kept.cloneNode(true));
    whole.select.value = entry.name;
    if (parseInt(option.dataset.attempt, 10) !== entry.info.attempt) {
      pick(entry.name);
      return;
    }
    whole.kept = option.cloneNode(true);
    entry.info.idleGpus = option.dataset.idleGpus === "true";
    entry.flag.hidden = !entry.info.idleGpus;
  }

  function ensureJobFigure(total) {
    if (!whole.box && total) jobFigure(total);
    return !!whole.box;
  }

  // The job-wide graphs: buckets after the newest one had, at the pace new
  // ones close (at least the sample period).
  function pollSummary() {
    var asked = whole.window, ask = whole.url + "?window=" + asked + (whole.since ? "&since=" + encodeURIComponent(whole.since) : "");
    var turn = whole.asked = whole.asked + 1;
    clearTimeout(whole.timer);  // a poll of the window before a change
    getJson(ask).then(function (body) {
      if (turn !== whole.asked) return;  // the window changed meanwhile: a newer request is out
      if (!whole.series) whole.series = emptySeries();
      addBuckets(body);
      if (ensureJobFigure(body.taskCount)) drawJob(body.taskCount);
      root.dataset.summaryLoaded = root.dataset.loaded = "true";
      var again = Math.max(period, body.bucketSeconds * 500);
      if (ACTIVE[body.state] || whole.finalPolls++ < 1) whole.timer = setTimeout(pollSummary, document.hidden ? Math.max(again, 15000) : again);
    }).catch(function () {
      if (turn === whole.asked) whole.timer = setTimeout(pollSummary, 15000);
    });
  }

  // ------------------------------------------------------------ polling

  // Nodes sample on their own clocks: ask from the oldest newest sample of
  // the running tasks, so a node that writes its round a little later is
  // not skipped (what comes twice is dropped in record). A task whose
  // samples stopped well before the others' (its node's sampler is away)
  // is left out: an answer gives each task only `samplesPerTask` after
  // `since`, and asking from its old last sample would give the others
  // only samples they have, for as long as it stays running.
  function nextSince(body) {
    var lasts = body.tasks.filter(function (t) { return t.state === "RUNNING"; }).map(function (t) {
      return (tasks[keyOf(t)] || {}).last || "";
    });
    if (lasts.some(function (l) { return !l; })) return "";
    if (!lasts.length) return since;
    lasts.sort();
    var newest = Date.parse(lasts[lasts.length - 1]);
    var current = lasts.filter(function (l) { return newest - Date.parse(l) <= STALLED_MS; });
    return current[0];
  }

  // A small job's every task.
  function poll() {
    getJson(url + (since ? "?since=" + encodeURIComponent(since) : "")).then(function (body) {
      showTasks(body);
      since = nextSince(body);
      root.dataset.loaded = "true";
      if (ACTIVE[body.state] || finalPolls++ < 1) setTimeout(poll, document.hidden ? 15000 : period);
    }).catch(function () { setTimeout(poll, 15000); });
  }
  if (whole) {
    whole.finalPolls = 0;
    if (whole.select) {
      whole.select.addEventListener("change", function () { pick(whole.select.value); });
      document.addEventListener("portal:part-updated", function (event) {
        if (event.detail.name === "usagetasks") menuUpdated();
      });
    }
    pollSummary();
  } else {
    poll();
  }
})();
