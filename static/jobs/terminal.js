// The browser terminal: xterm.js bridged to the task's shell over a WebSocket
// (jobs/terminal.py). Keystrokes go up as JSON; output comes down as bytes.
(function () {
  "use strict";
  var box = document.getElementById("terminal");
  var status = document.getElementById("terminal-status");
  var reconnect = document.getElementById("terminal-reconnect");
  if (!box || !window.Terminal || !window.FitAddon) return;

  // Another user's task (an admin's visit): connect only once asked.
  var start = box.dataset.waitFor ? document.getElementById(box.dataset.waitFor) : null;
  if (start) {
    status.textContent = "Not connected.";
    start.addEventListener("click", function () { start.disabled = true; open(); }, { once: true });
  } else {
    open();
  }

  function open() {
    var term = new window.Terminal({ cursorBlink: true, fontSize: 14, lineHeight: 1.2, scrollback: 5000,
      fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace' });
    var fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    window.portalTerminal = term;  // lets a test (or the console) read the screen

    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + box.dataset.wsPath);
    socket.binaryType = "arraybuffer";
    var reasons = { 4401: "you signed out", 4403: "not allowed", 4408: "no input for too long", 4409: "the task is not running",
                    4410: "the task has ended", 4429: "too many terminals open",
                    4500: "the shell could not be opened", 1000: "the shell exited" };
    var closedBy = "";

    function setStatus(text) { status.textContent = text; box.dataset.state = text; }
    function send(message) { if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message)); }
    function resize() {
      fit.fit();
      send({ type: "resize", rows: term.rows, cols: term.cols });
    }

    socket.onopen = function () { setStatus("Connected."); resize(); term.focus(); };
    socket.onmessage = function (event) {
      if (typeof event.data === "string") {
        var message = JSON.parse(event.data);
        if (message.type === "error") closedBy = message.message;
        return;
      }
      term.write(new Uint8Array(event.data));
    };
    socket.onclose = function (event) {
      var why = closedBy || reasons[event.code] || "the connection was lost";
      setStatus("Closed: " + why + ".");
      term.write("\r\n\x1b[33m[session closed: " + why + "]\x1b[0m\r\n");
      term.options.disableStdin = true;
      // A dropped connection or an exited shell can be started again; a task
      // that ended or a refusal cannot.
      if ([4401, 4403, 4409, 4410].indexOf(event.code) < 0) reconnect.hidden = false;
    };
    reconnect.addEventListener("click", function () { location.reload(); });
    term.onData(function (data) { send({ type: "input", data: data }); });
    if (window.ResizeObserver) {
      new ResizeObserver(function () { resize(); }).observe(box);
    } else {
      window.addEventListener("resize", resize);
    }
  }
})();
