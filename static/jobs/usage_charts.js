// A job's usage graphs (templates/jobs/partials/job_usage.html), drawn with
// the vendored uPlot from the REST API (GET /api/v2/jobs/<user>~<name>/metrics).
// While the job runs it asks again for the samples after the last one it
// has (`since`) and extends the graphs, at the pace the nodes sample.
//
// A small job gets CPU, memory and, for real GPUs, GPU utilisation of each
// task. A bigger one (data-job-wide: more than usage.JOB_WIDE_TASKS tasks)
// gets the job as a whole -- CPU cores and memory summed over its tasks, CPU
// per task and GPU utilisation as a mean with the least and most busy
// shaded around it -- computed here from the same per-task samples, and one
// task's graphs picked from a menu.
(function () {
  "use strict";

  var ACTIVE = { WAITING: 1, RUNNING: 1, STOPPING: 1 };
  var MIB = 1024 * 1024;
  var BLUE = "#2563eb", GREEN = "#16a34a", PURPLE = "#9333ea";
  // Sample periods a task's sample still counts for in the job-wide sums
  // when the next one is late (see jobSeries).
  var HOLD = 2;
  var root = document.getElementById("usage-charts");
  if (!root || !window.uPlot) return;
  var url = root.dataset.metricsUrl;
  var taskUrl = root.dataset.taskMetricsUrl || "";
  var period = Math.max(2000, 1000 * parseFloat(root.dataset.sampleSeconds || "5"));
  var STALLED_MS = Math.max(120000, 10 * period);
  var tasks = {};  // each task attempt's samples by key (role-index#attempt) and, while shown, its graphs
  var since = "";
  var finalPolls = 0;
  // A big job's page: its job-wide graphs, the task menu and the task picked.
  var whole = root.dataset.jobWide === "true" ? { box: null, charts: null, select: null, options: {}, keys: {}, picked: null, from: -Infinity } : null;

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
    var older = entry.older || { times: [], cpu: [], memory: [], gpu: [] };
    var times = older.times.concat(entry.times);
    if (!times.length) return;
    setData(entry.charts.cpu, times, [older.cpu.concat(entry.cpu)]);
    setData(entry.charts.memory, times, [older.memory.concat(entry.memory)]);
    var gpu = older.gpu.concat(entry.gpu);
    if (!gpu.some(notNull)) return;
    entry.charts.gpu = entry.charts.gpu || chart(entry.box, "gpu", "GPU", "%", single("GPU", PURPLE));
    setData(entry.charts.gpu, times, [gpu]);
  }

  function showTasks(body) {
    body.tasks.forEach(function (info) {
      var entry = record(info);
      if (!entry.box) taskFigure(entry);
      drawTask(entry);
    });
  }

  // ------------------------------------------------------- the whole job

  function bucketOf(buckets, k) {
    return buckets[k] || (buckets[k] = { tasks: 0, cpu: 0, memory: 0, cpuMin: Infinity, cpuMax: -Infinity,
                                         gpu: 0, gpus: 0, gpuMin: Infinity, gpuMax: -Infinity });
  }

  function count(b, entry, i) {
    var cpu = entry.cpu[i];
    b.tasks += 1;
    b.cpu += cpu;
    b.memory += entry.memory[i];
    b.cpuMin = Math.min(b.cpuMin, cpu);
    b.cpuMax = Math.max(b.cpuMax, cpu);
    (entry.gpus[i] || []).forEach(function (u) {
      b.gpu += u;
      b.gpus += 1;
      b.gpuMin = Math.min(b.gpuMin, u);
      b.gpuMax = Math.max(b.gpuMax, u);
    });
  }

  function newestBucket(entries, step) {
    return entries.reduce(function (newest, e) {
      return e.times.length ? Math.max(newest, Math.floor(e.times[e.times.length - 1] / step)) : newest;
    }, -Infinity);
  }

  // The job as a whole at each sample period. Nodes sample on their own
  // clocks, so a task's samples go into buckets one period wide, the last
  // one of a bucket standing for it. A bucket the task has no sample in
  // (its node wrote a little late, or this round is not in yet) takes its
  // previous sample, for up to HOLD periods: without it the sums would dip
  // wherever clocks drift. After that the task counts no more (its sampler
  // is away, or it ended) and `tasks` says how many were counted.
  //
  // It starts where every task's samples do: a task that gave as many as
  // one answer holds (`samplesPerTask`) may have older ones not sent, and
  // sums without them would dip.
  function jobSeries(entries) {
    var step = period / 1000, buckets = {}, newest = newestBucket(entries, step);
    var first = Math.floor(whole.from / step);
    entries.forEach(function (e) {
      for (var i = 0; i < e.times.length; i++) {
        var k = Math.floor(e.times[i] / step);
        var next = i + 1 < e.times.length ? Math.floor(e.times[i + 1] / step) : newest + 1;
        for (var j = Math.max(k, first); j < next && j <= k + HOLD; j++) count(bucketOf(buckets, j), e, i);
      }
    });
    return seriesOf(buckets, step);
  }

  function seriesOf(buckets, step) {
    var s = { times: [], cores: [], memory: [], cpuMean: [], cpuMin: [], cpuMax: [], gpuMean: [], gpuMin: [], gpuMax: [], tasks: [] };
    Object.keys(buckets).map(Number).sort(function (a, b) { return a - b; }).forEach(function (k) {
      var b = buckets[k];
      s.times.push(k * step);
      s.tasks.push(b.tasks);
      s.cores.push(b.cpu / 100);  // 100% is one core
      s.memory.push(b.memory / 1024);
      s.cpuMean.push(b.cpu / b.tasks);
      s.cpuMin.push(b.cpuMin);
      s.cpuMax.push(b.cpuMax);
      s.gpuMean.push(b.gpus ? b.gpu / b.gpus : null);
      s.gpuMin.push(b.gpus ? b.gpuMin : null);
      s.gpuMax.push(b.gpus ? b.gpuMax : null);
    });
    return s;
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
    whole.select = taskMenu();
  }

  function drawJob(total) {
    var s = jobSeries(Object.keys(tasks).map(function (k) { return tasks[k]; }));
    setData(whole.charts.cores, s.times, [s.cores]);
    setData(whole.charts.cpu, s.times, [s.cpuMean, s.cpuMin, s.cpuMax]);
    setData(whole.charts.memory, s.times, [s.memory]);
    if (s.gpuMean.some(notNull)) {
      whole.charts.gpu = whole.charts.gpu || chart(whole.box, "gpu", "GPU utilisation", "%", spread(PURPLE));
      setData(whole.charts.gpu, s.times, [s.gpuMean, s.gpuMin, s.gpuMax]);
    }
    var newest = s.tasks.length ? s.tasks[s.tasks.length - 1] : 0;
    whole.reporting.dataset.tasks = String(newest);
    whole.reporting.textContent = newest < total ? " (newest samples from " + newest + " of them)" : "";
  }

  function taskMenu() {
    var wrap = document.createElement("div");
    wrap.className = "usage-pick";
    var label = document.createElement("label");
    label.htmlFor = "usage-task";
    label.textContent = "Show one task";
    var select = document.createElement("select");
    select.id = "usage-task";
    select.appendChild(new Option("None", ""));
    select.addEventListener("change", function () { pick(select.value); });
    wrap.appendChild(label);
    wrap.appendChild(select);
    root.appendChild(wrap);
    return select;
  }

  // Each task once, in the API's order (role, index), saying which ones
  // have idle GPUs or stopped sending samples: where a researcher looks.
  function syncMenu(body) {
    var lasts = body.tasks.map(function (t) { return tasks[keyOf(t)].last || ""; });
    var newest = Date.parse(lasts.slice().sort().pop() || "") || 0;
    body.tasks.forEach(function (info, i) {
      var entry = tasks[keyOf(info)];
      var stalled = info.state === "RUNNING" && (!lasts[i] || newest - Date.parse(lasts[i]) > STALLED_MS);
      var text = entry.name + (info.idleGpus ? " (GPUs idle)" : "") + (stalled ? " (no recent samples)" : "");
      var option = whole.options[entry.name];
      if (!option) {
        option = whole.options[entry.name] = new Option(text, entry.name);
        whole.select.appendChild(option);
      }
      whole.keys[entry.name] = keyOf(info);
      if (option.textContent !== text) option.textContent = text;
    });
  }

  function unpick() {
    var entry = whole.picked;
    if (!entry) return;
    Object.keys(entry.charts).forEach(function (name) { entry.charts[name].plot.destroy(); });
    entry.box.remove();
    entry.box = entry.flag = entry.charts = null;
    whole.picked = null;
  }

  function pick(name) {
    unpick();
    var entry = tasks[whole.keys[name]];
    if (!entry) return;
    taskFigure(entry);
    whole.picked = entry;
    drawTask(entry);
    backfill(entry);
  }

  // An answer for a big job gives each task only `samplesPerTask` samples
  // (20 of a 1,000-task job): the task's own address gives up to 5,000 of
  // the picked one. They are kept apart from `times`, which the job-wide
  // sums read: those must add the same stretch of time for every task.
  function backfill(entry) {
    if (!taskUrl || entry.older || !entry.times.length) return;
    var info = entry.info;
    var address = taskUrl.replace(/\/ROLE\/INDEX\/metrics$/, "/" + encodeURIComponent(info.taskRole) + "/" + info.taskIndex + "/metrics");
    entry.older = { times: [], cpu: [], memory: [], gpu: [] };
    getJson(address + "?attempt=" + info.attempt).then(function (body) {
      var first = entry.times[0];
      body.samples.forEach(function (s) {
        var at = Date.parse(s.time) / 1000;
        if (at >= first) return;
        entry.older.times.push(at);
        entry.older.cpu.push(s.cpuPercent);
        entry.older.memory.push(s.memoryBytes / MIB);
        entry.older.gpu.push(s.gpus.length ? Math.max.apply(null, s.gpus.map(function (g) { return g.utilPercent; })) : null);
      });
      if (whole.picked === entry) drawTask(entry);
    }).catch(function () { entry.older = null; });  // the next pick tries again
  }

  // Where the first answer is complete for every task (see jobSeries).
  function completeFrom(body) {
    return body.tasks.reduce(function (from, info) {
      var s = info.samples;
      return s.length >= body.samplesPerTask ? Math.max(from, Date.parse(s[0].time) / 1000) : from;
    }, -Infinity);
  }

  function showJob(body) {
    body.tasks.forEach(record);
    if (!body.tasks.length) return;
    if (!whole.box) {
      whole.from = completeFrom(body);
      jobFigure(body.tasks.length);
    }
    drawJob(body.tasks.length);
    syncMenu(body);
    if (whole.picked) drawTask(whole.picked);
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

  function poll() {
    getJson(url + (since ? "?since=" + encodeURIComponent(since) : "")).then(function (body) {
      if (whole) showJob(body);
      else showTasks(body);
      since = nextSince(body);
      root.dataset.loaded = "true";
      if (ACTIVE[body.state] || finalPolls++ < 1) setTimeout(poll, document.hidden ? 15000 : period);
    }).catch(function () { setTimeout(poll, 15000); });
  }
  poll();
})();
