// The admin dashboard's graphs (templates/jobs/dashboard.html), drawn with
// the vendored uPlot from the figures the page carries (#dashboard-series).
(function () {
  "use strict";

  var COLOURS = ["#2563eb", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#db2777", "#65a30d", "#7c3aed", "#b45309"];
  var root = document.getElementById("dashboard-charts");
  var source = document.getElementById("dashboard-series");
  if (!root || !source || !window.uPlot) return;
  var data = JSON.parse(source.textContent);

  function chart(name, title, lines) {
    var holder = document.createElement("div");
    holder.className = "dashboard-chart";
    holder.dataset.chart = name;
    root.appendChild(holder);
    var keys = Object.keys(lines);
    var series = [{}].concat(keys.map(function (key, i) {
      return { label: key, stroke: COLOURS[i % COLOURS.length], width: 1.5 };
    }));
    var values = [data.times].concat(keys.map(function (key) { return lines[key]; }));
    holder.dashboardPlot = new window.uPlot({
      width: Math.max(320, Math.min(560, Math.floor((root.clientWidth - 16) / 2))), height: 200, title: title,
      scales: { x: { time: true } }, series: series,
    }, values, holder);
    holder.dataset.series = String(keys.length);
    if (!keys.length) {
      var note = document.createElement("p");
      note.className = "muted small";
      note.textContent = "Nothing in this window.";
      holder.appendChild(note);
    }
  }

  var gpus = {};
  Object.keys(data.gpusByVc).forEach(function (vc) { gpus[vc] = data.gpusByVc[vc]; });
  gpus["GPUs in the cluster"] = data.times.map(function () { return data.gpusTotal; });
  chart("gpus-vc", "GPUs in use by virtual cluster", gpus);
  chart("gpus-free", "GPUs free by virtual cluster (of its share today)", data.gpusFreeByVc);
  var users = Object.keys(data.gpusByUser).length;
  chart("gpus-user", "GPUs in use by user" + (users ? " (the busiest " + users + ")" : ""), data.gpusByUser);
  chart("running", "Jobs running by virtual cluster", data.runningByVc);
  chart("waiting", "Jobs waiting by virtual cluster", data.waitingByVc);
  chart("tasks", "Task containers running", { tasks: data.tasksRunning });
  chart("cpu", "CPU cores in use (samples)", { cores: data.cpuCores });
  chart("memory", "Memory in use, GiB (samples)", { GiB: data.memoryGiB });
})();
