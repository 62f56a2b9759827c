// Submit Job. The form is a view onto one config object; the config box shows
// and edits the same config as text: v1 JSON or v2 YAML. All checking is the
// server's (the spec parser in jobs/spec/): as the user types, the page posts
// the config text to the validate endpoint and shows each problem next to its
// field, or at its line in the config box. A v2 config shows in the form when
// the form can say all of it (the server's view of it, in v1's field names);
// form edits of it go to the server as the form's fields, and the YAML comes
// back. Without this script the page is a plain textarea that still submits.
(function () {
  "use strict";

  var page = document.getElementById("submit-page");
  if (!page) return;

  var $ = function (id) { return document.getElementById(id); };
  var form = $("submit-form");
  var hidden = $("id_config");
  var modeInput = $("id_mode");
  var formMode = $("form-mode");
  var fields = $("form-fields");
  var rolesBox = $("roles");
  var envRows = $("env-rows");
  var dialog = $("json-dialog");
  var jsonBox = $("json-box");
  var gutter = $("json-gutter");
  var jsonProblems = $("json-problems");
  var statusLine = $("form-status");
  var submitButton = $("submit-button");
  var csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  var initial = JSON.parse($("submit-initial").textContent);

  var MAX_BYTES = 256 * 1024;
  var BOOLEAN_ENVS = ["isDebug", "paiAzRDMA"];
  var FORM_KEYS = ["jobName", "image", "virtualCluster", "gpuType", "taskRoles", "codeDir", "dataDir",
                   "outputDir", "jobEnvs", "retryCount", "authFile"];
  var JSON_NUMBER = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?$/;

  var state = {
    config: {},          // the whole config: what the form edits and shows
    raw: initial.text,   // the text as pasted, imported or stored, until the form edits it
    protocol: initial.protocol || 1,  // 2: the text is OpenPAI v2 (YAML); form edits come back as YAML
    lastText: initial.text,  // for a v2 draft edited in the form: the YAML of the last check
    formNote: initial.formNote || "",  // why the form cannot show this config
    otherText: initial.otherText, otherNote: initial.otherNote || "",  // the config in the other protocol
    broken: false,       // the text is not a config the form can show
    problems: initial.problems || [],
    warnings: initial.warnings || [],
    showAll: false,      // show every problem, not only those of fields the user touched
    touched: {},
    seq: 0,
    timer: null,
    jsonTimer: null,
    submitting: false
  };

  // ------------------------------------------------------------ helpers

  function isObject(value) { return value !== null && typeof value === "object" && !Array.isArray(value); }

  function currentText() {
    if (state.raw !== null) return state.raw;
    return state.protocol === 2 ? state.lastText : JSON.stringify(state.config, null, 2);
  }

  // The text as it is now; for a v2 draft the form has edited, once the
  // server has written the fields as YAML.
  function textNow() {
    if (state.raw !== null || state.protocol !== 2) return Promise.resolve(currentText());
    return validateForm().then(function (result) { return result && result.text ? result.text : currentText(); });
  }

  function parsePath(path) {
    var parts = [];
    path.replace(/\[(\d+)\]|([^.[\]]+)/g, function (_, index, key) {
      parts.push(index !== undefined ? Number(index) : key);
    });
    return parts;
  }

  function getAt(obj, path) {
    var parts = parsePath(path);
    for (var i = 0; i < parts.length; i++) {
      if (obj === null || typeof obj !== "object") return undefined;
      obj = obj[parts[i]];
    }
    return obj;
  }

  function setAt(obj, path, value, remove) {
    var parts = parsePath(path);
    var last = parts.pop();
    for (var i = 0; i < parts.length; i++) {
      obj = obj[parts[i]];
      if (obj === null || typeof obj !== "object") return;
    }
    if (remove) delete obj[last]; else obj[last] = value;
  }

  function template(id) { return $(id).content.firstElementChild.cloneNode(true); }

  function idFor(path) { return "f-" + path.replace(/[^A-Za-z0-9]+/g, "-"); }

  function setStatus(text, kind) {
    statusLine.textContent = text;
    statusLine.className = "form-status" + (kind ? " " + kind : "");
  }

  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }

  // ------------------------------------------------------ form <-> config

  // Give every field in `scope` (but not in nested scopes) its path, id and
  // label, and show its value from the config.
  function wire(scope, prefix) {
    scope.querySelectorAll("[data-rel]").forEach(function (input) {
      if (input.closest("[data-scope]") !== scope) return;
      var path = prefix + input.dataset.rel;
      var id = idFor(path);
      var field = input.closest(".field");
      var help = field.querySelector(".help");
      var error = field.querySelector(".field-error");
      input.id = id;
      input.dataset.path = path;
      field.querySelector("label").htmlFor = id;
      error.id = id + "-err";
      if (help) help.id = id + "-help";
      input.setAttribute("aria-describedby", (help ? help.id + " " : "") + error.id);
      display(input, getAt(state.config, path));
    });
  }

  function display(input, value) {
    if (value === undefined && input.dataset.absent !== undefined) value = input.dataset.absent;
    if (value === undefined && input.dataset.rel === "virtualCluster") value = page.dataset.defaultVc;
    var text = value === undefined || value === null ? "" : typeof value === "object" ? JSON.stringify(value) : String(value);
    if (input.tagName === "SELECT") input.querySelectorAll("option[data-extra]").forEach(function (o) { o.remove(); });
    if (input.tagName === "SELECT" && !Array.prototype.some.call(input.options, function (o) { return o.value === text; })) {
      // Keep a value the list does not offer (a pasted config's), so it is not lost.
      var option = new Option(text + " (not available here)", text);
      option.dataset.extra = "1";
      input.add(option);
    }
    input.value = text;
  }

  // What a field's text means in the config: {value} or {remove: true}.
  function readInput(input) {
    var text = input.value;
    if (input.dataset.type === "int") {
      var trimmed = text.trim();
      if (trimmed === "") return input.dataset.empty === "null" ? { value: null } : { remove: true };
      if (/^-?\d+$/.test(trimmed) && Number.isSafeInteger(Number(trimmed))) return { value: Number(trimmed) };
      return { value: trimmed };  // kept as typed; the server says what is wrong with it
    }
    if (text === "" && input.dataset.optional) return { remove: true };
    return { value: text };
  }

  function renderAll() {
    fields.disabled = state.broken;
    $("broken-banner").hidden = !state.broken;
    $("broken-banner").textContent = state.formNote ? sentence(state.formNote)
      : "This config is not valid JSON or YAML, so the form cannot show it. Fix it with the JSON / YAML button; nothing you typed is lost.";
    formMode.classList.toggle("v2", state.protocol === 2);
    $("v2-note").hidden = state.protocol !== 2 || state.broken;
    renderExports();
    wire(formMode, "");
    renderRoles();
    renderEnvs();
    renderOtherKeys();
    var advanced = $("job-advanced");
    if (state.config.retryCount || state.config.authFile) advanced.open = true;
  }

  // Empty states and "this part of the config is not what the form can show".
  function note(element, text) {
    element.textContent = text || "";
    element.hidden = !text;
  }

  function renderRoles() {
    var roles = state.config.taskRoles;
    var notList = roles !== undefined && !Array.isArray(roles);
    rolesBox.textContent = "";
    $("add-role").disabled = notList;
    note($("roles-empty"), notList ? "taskRoles in this config is not a list, so the form cannot show it. Fix it with the JSON button."
      : roles && roles.length ? "" : "No task roles yet. Every job needs at least one: add one below.");
    if (Array.isArray(roles)) roles.forEach(function (role, index) { rolesBox.appendChild(roleCard(role, index, roles.length)); });
  }

  function roleCard(role, index, count) {
    var card = template("tpl-role");
    var path = "taskRoles[" + index + "]";
    card.dataset.index = index;
    card.dataset.path = path;
    card.querySelector("[data-role-box]").dataset.box = path;
    card.querySelector("[data-ports-box]").dataset.box = path + ".portList";
    card.querySelector(".role-number").textContent = "Task role " + (index + 1);
    card.querySelector('[data-action="remove-role"]').disabled = count === 1;
    card.setAttribute("aria-label", "Task role " + (index + 1));
    // Named for their role, as a port's Remove is: a list of buttons reads "Duplicate task role 2", not "Duplicate".
    card.querySelector('[data-action="duplicate-role"]').setAttribute("aria-label", "Duplicate task role " + (index + 1));
    card.querySelector('[data-action="remove-role"]').setAttribute("aria-label", "Remove task role " + (index + 1));
    if (!isObject(role)) {
      card.querySelector(".role-body").hidden = true;
      note(card.querySelector("[data-role-note]"), "This task role is not an object in the config; fix it with the JSON button or remove it.");
      return card;
    }
    wire(card, path + ".");
    renderPorts(card, role, index);
    if (role.shmMB !== undefined || "minFailedTaskCount" in role || "minSucceededTaskCount" in role) {
      card.querySelector("[data-fold]").open = true;
    }
    updateRoleTitle(card);
    return card;
  }

  function updateRoleTitle(card) {
    var name = card.querySelector('[data-rel="name"]').value;
    card.querySelector(".role-title-name").textContent = name ? "· " + name : "";
  }

  function renderPorts(card, role, index) {
    var rows = card.querySelector("[data-port-rows]");
    var list = role.portList;
    var notList = list !== undefined && list !== null && !Array.isArray(list);
    rows.textContent = "";
    card.querySelector('[data-action="add-port"]').disabled = notList;
    (Array.isArray(list) ? list : []).forEach(function (port, number) {
      var row = template("tpl-port");
      var path = "taskRoles[" + index + "].portList[" + number + "]";
      row.dataset.path = path;
      row.querySelector('[data-action="remove-port"]').setAttribute("aria-label", "Remove port " + (number + 1) + " of task role " + (index + 1));
      if (isObject(port)) wire(row, path + ".");
      rows.appendChild(row);
    });
    note(card.querySelector("[data-ports-empty]"), notList ? "portList in this config is not a list; fix it with the JSON button."
      : Array.isArray(list) && list.length ? "" : "No ports.");
  }

  function renderEnvs() {
    var envs = state.config.jobEnvs;
    var notObject = envs !== undefined && envs !== null && !isObject(envs);
    envRows.textContent = "";
    form.querySelector('[data-action="add-env"]').disabled = notObject;
    if (isObject(envs)) Object.keys(envs).forEach(function (name) { envRows.appendChild(envRow(name, envs[name])); });
    updateEnvsEmpty();
    if (notObject) note($("envs-empty"), "jobEnvs in this config is not an object of name: value pairs; fix it with the JSON button.");
  }

  function envRow(name, value) {
    var row = template("tpl-env");
    var number = envRows.children.length + Math.floor(Math.random() * 1e9);
    row.dataset.kind = value === null ? "null" : typeof value;
    row.querySelectorAll(".field").forEach(function (field, i) {
      var input = field.querySelector("input");
      input.id = "env-" + number + "-" + i;
      field.querySelector("label").htmlFor = input.id;
    });
    var nameInput = row.querySelector("[data-env-name]");
    var error = row.querySelector(".field-error");
    error.id = nameInput.id + "-err";
    nameInput.setAttribute("aria-describedby", error.id);
    nameInput.value = name;
    row.querySelector("[data-env-value]").value = value === null || value === undefined ? "" : typeof value === "object" ? JSON.stringify(value) : String(value);
    return row;
  }

  function updateEnvsEmpty() {
    note($("envs-empty"), envRows.children.length ? "" : "No variables yet. Add one if your command reads settings from the environment.");
  }

  // jobEnvs from the rows, each value keeping the JSON type it came with
  // (a number stays a number while it still reads as one).
  function readEnvs() {
    var envs = {};
    envRows.querySelectorAll("[data-env]").forEach(function (row) {
      var name = row.querySelector("[data-env-name]").value.trim();
      if (name) envs[name] = envValue(row.querySelector("[data-env-value]").value, row.dataset.kind, name);
    });
    if (Object.keys(envs).length || "jobEnvs" in state.config) state.config.jobEnvs = envs;
  }

  function envValue(text, kind, name) {
    if (kind === "number" && JSON_NUMBER.test(text.trim())) return Number(text.trim());
    if (kind === "boolean" || BOOLEAN_ENVS.indexOf(name) >= 0) {
      if (text.trim() === "true") return true;
      if (text.trim() === "false") return false;
    }
    if (kind === "null" && text === "") return null;
    return text;
  }

  function renderOtherKeys() {
    var others = Object.keys(state.config).filter(function (key) { return FORM_KEYS.indexOf(key) < 0; });
    var note = $("other-keys");
    note.hidden = !others.length;
    note.textContent = others.length ? "Also in this config, kept as they are (see them with the JSON button): " + others.join(", ") + "." : "";
  }

  // ------------------------------------------------------------- editing

  function changed() {
    state.raw = null;
    hidden.value = currentText();
    renderOtherKeys();
    scheduleValidate();
  }

  formMode.addEventListener("input", function (event) {
    var target = event.target;
    if (state.broken) return;
    if (target.dataset.path) {
      var read = readInput(target);
      setAt(state.config, target.dataset.path, read.value, read.remove);
      state.touched[target.dataset.path] = true;
      if (target.dataset.rel === "name" && target.closest("[data-role]")) updateRoleTitle(target.closest("[data-role]"));
    } else if (target.matches("[data-env-name], [data-env-value]")) {
      readEnvs();
      var name = target.closest("[data-env]").querySelector("[data-env-name]").value.trim();
      state.touched["jobEnvs." + name] = true;
    } else {
      return;
    }
    changed();
  });

  function uniqueName(base, taken) {
    if (taken.indexOf(base) < 0) return base;
    var stem = base.replace(/\d+$/, "") || base;
    for (var n = 2; ; n++) if (taken.indexOf(stem + n) < 0) return stem + n;
  }

  function roleNames() {
    return (state.config.taskRoles || []).map(function (role) { return isObject(role) ? role.name : null; });
  }

  function forgetTouched(prefix) {
    Object.keys(state.touched).forEach(function (path) { if (path.indexOf(prefix) === 0) delete state.touched[path]; });
  }

  function focusIn(element, selector) {
    var target = element && element.querySelector(selector);
    if (target) target.focus();
  }

  var actions = {
    "add-role": function () {
      if (!Array.isArray(state.config.taskRoles)) state.config.taskRoles = [];
      state.config.taskRoles.push({
        name: uniqueName("worker", roleNames()), taskNumber: 1, cpuNumber: 1, memoryMB: 1024, gpuNumber: 0, command: ""
      });
      renderRoles();
      focusIn(rolesBox.lastElementChild, '[data-rel="name"]');
    },
    "duplicate-role": function (button) {
      var index = Number(button.closest("[data-role]").dataset.index);
      var copy = JSON.parse(JSON.stringify(state.config.taskRoles[index]));
      if (isObject(copy)) copy.name = uniqueName(String(copy.name || "worker"), roleNames());
      state.config.taskRoles.splice(index + 1, 0, copy);
      forgetTouched("taskRoles[");
      renderRoles();
      focusIn(rolesBox.children[index + 1], '[data-rel="name"]');
    },
    "remove-role": function (button) {
      var index = Number(button.closest("[data-role]").dataset.index);
      state.config.taskRoles.splice(index, 1);
      forgetTouched("taskRoles[");
      renderRoles();
      var next = rolesBox.children[Math.min(index, rolesBox.children.length - 1)];
      if (next) focusIn(next, '[data-rel="name"]'); else $("add-role").focus();
    },
    "add-port": function (button) {
      var card = button.closest("[data-role]");
      var role = state.config.taskRoles[Number(card.dataset.index)];
      if (!Array.isArray(role.portList)) role.portList = [];
      role.portList.push({ label: "", beginAt: 0, portNumber: 1 });
      renderPorts(card, role, Number(card.dataset.index));
      focusIn(card.querySelector("[data-port-rows]").lastElementChild, '[data-rel="label"]');
    },
    "remove-port": function (button) {
      var card = button.closest("[data-role]");
      var index = Number(card.dataset.index);
      var role = state.config.taskRoles[index];
      var rows = Array.prototype.slice.call(card.querySelectorAll("[data-port]"));
      role.portList.splice(rows.indexOf(button.closest("[data-port]")), 1);
      forgetTouched("taskRoles[" + index + "].portList[");
      renderPorts(card, role, index);
      card.querySelector('[data-action="add-port"]').focus();
    },
    "add-env": function () {
      var row = envRow("", "");
      row.dataset.kind = "string";
      envRows.appendChild(row);
      updateEnvsEmpty();
      focusIn(row, "[data-env-name]");
      return false;  // nothing in the config changes until a name is typed
    },
    "remove-env": function (button) {
      button.closest("[data-env]").remove();
      readEnvs();
      updateEnvsEmpty();
      form.querySelector('[data-action="add-env"]').focus();
    }
  };

  formMode.addEventListener("click", function (event) {
    var button = event.target.closest("[data-action]");
    if (!button || !actions[button.dataset.action] || state.broken) return;
    if (actions[button.dataset.action](button) !== false) changed();
  });

  // ------------------------------------------------------------ problems

  function fieldOf(problem) { return problem.field || problem.path; }

  function visible(problem) { return state.showAll || state.touched[fieldOf(problem)]; }

  // The input or box a problem belongs to, nearest first.
  function targetFor(path, inputs) {
    if (inputs[path]) return { input: inputs[path] };
    var env = /^jobEnvs\.(.+)$/.exec(path);
    if (env) {
      var rows = envRows.querySelectorAll("[data-env-name]");
      for (var i = 0; i < rows.length; i++) if (rows[i].value.trim() === env[1]) return { input: rows[i] };
    }
    for (var probe = path; probe; probe = probe.replace(/(\.[^.[\]]+|\[\d+\]|^[^.[\]]+)$/, "")) {
      var box = form.querySelector('[data-box="' + CSS.escape(probe) + '"]');
      if (box) return { box: box };
    }
    return null;
  }

  function labelOf(input) {
    if (input.matches("[data-env-name]")) return "Environment variable " + input.value.trim();
    var label = input.closest(".field").querySelector("label");
    var text = label.firstChild ? label.firstChild.textContent.trim() : input.dataset.path;
    var card = input.closest("[data-role]");
    if (card) text = card.querySelector(".role-number").textContent + " " + card.querySelector(".role-title-name").textContent + " › " + text;
    var port = input.closest("[data-port]");
    if (port) text = text.replace(" › ", " › port " + (Array.prototype.indexOf.call(port.parentNode.children, port) + 1) + " › ");
    return text;
  }

  function clearProblems() {
    form.querySelectorAll(".field-error").forEach(function (el) { el.textContent = ""; el.hidden = true; });
    form.querySelectorAll("[aria-invalid]").forEach(function (el) { el.removeAttribute("aria-invalid"); });
    form.querySelectorAll(".box-error").forEach(function (el) { note(el, ""); });
  }

  function renderProblems() {
    var inputs = {};
    formMode.querySelectorAll("[data-path]").forEach(function (el) { if (el.id) inputs[el.dataset.path] = el; });
    clearProblems();
    var listed = [];
    state.problems.forEach(function (problem) {
      if (!visible(problem)) return;
      var target = state.broken ? null : targetFor(fieldOf(problem), inputs);
      var item = { problem: problem, input: target && target.input };
      if (target && target.input) {
        var error = target.input.closest(".field").querySelector(".field-error");
        error.textContent = (error.textContent ? error.textContent + " " : "") + sentence(problem.message);
        error.hidden = false;
        target.input.setAttribute("aria-invalid", "true");
        if (state.showAll) openFolds(target.input);
      } else if (target && target.box) {
        note(target.box, (target.box.textContent ? target.box.textContent + " " : "") + sentence(problem.message));
      }
      listed.push(item);
    });
    markDuplicateEnvs();
    renderSummary(listed);
    renderWarnings();
  }

  // A JSON object cannot hold one name twice: say so on the later row,
  // whose value is the one kept.
  function markDuplicateEnvs() {
    var seen = {};
    envRows.querySelectorAll("[data-env-name]").forEach(function (input) {
      var name = input.value.trim();
      if (name && seen[name]) {
        var error = input.closest(".field").querySelector(".field-error");
        error.textContent = "Another variable above has this name; only this value is kept.";
        error.hidden = false;
        input.setAttribute("aria-invalid", "true");
      }
      seen[name] = true;
    });
  }

  function openFolds(element) {
    for (var fold = element.closest("details"); fold; fold = fold.parentElement.closest("details")) fold.open = true;
  }

  function sentence(message) { return message.charAt(0).toUpperCase() + message.slice(1) + (/[.?!]$/.test(message) ? "" : "."); }

  function renderSummary(items) {
    var summary = $("problem-summary");
    var list = summary.querySelector(".summary-list");
    list.textContent = "";
    summary.hidden = !state.showAll || !items.length;
    summary.querySelector(".summary-title").textContent = plural(items.length, "problem") + " to fix before this job can run";
    items.forEach(function (item) {
      var li = document.createElement("li");
      var problem = item.problem;
      if (item.input) {
        var link = document.createElement("a");
        link.href = "#" + item.input.id;
        link.textContent = labelOf(item.input);
        link.addEventListener("click", function (event) { event.preventDefault(); openFolds(item.input); item.input.focus(); });
        li.appendChild(link);
        li.appendChild(document.createTextNode(": " + problem.message));
      } else {
        var prefix = problem.line ? "Line " + problem.line + ", column " + problem.column + ": " : "";
        li.textContent = prefix + (problem.path ? problem.path + ": " : "") + problem.message;
      }
      list.appendChild(li);
    });
  }

  function renderWarnings() {
    var box = $("warning-summary");
    var list = box.querySelector(".summary-list");
    list.textContent = "";
    box.hidden = !state.warnings.length;
    state.warnings.forEach(function (warning) {
      var li = document.createElement("li");
      li.textContent = (warning.path ? warning.path + ": " : "") + warning.message;
      list.appendChild(li);
    });
  }

  function showStatus() {
    var count = state.problems.length;
    if (!count) setStatus("Ready to submit.", "ok");
    else if (state.showAll) setStatus(plural(count, "problem") + " to fix: see the highlighted fields.", "bad");
    else setStatus(plural(count, "thing") + " still to fill in or fix.", "muted");
  }

  // --------------------------------------------------------------- server

  // Check `text`; with no text, a v2 draft's form fields (the server
  // answers with their YAML as result.text).
  function check(text) {
    var body = new URLSearchParams();
    if (text === null) {
      body.set("config", "");
      body.set("form", JSON.stringify(state.config));
    } else {
      body.set("config", text);
    }
    return fetch(page.dataset.validateUrl, {
      method: "POST", body: body, credentials: "same-origin",
      headers: { "X-CSRFToken": csrf, "Accept": "application/json" }
    }).then(function (response) {
      if (response.status === 429) {
        var busy = new Error("too many checks");
        busy.retryAfter = parseInt(response.headers.get("Retry-After"), 10) || 5;
        throw busy;
      }
      if (!response.ok) throw new Error("the server answered " + response.status);
      return response.json();
    });
  }

  function applyResult(result) {
    state.problems = result.problems;
    state.warnings = result.warnings;
    if (result.text) { state.lastText = result.text; hidden.value = result.text; }
    if ("otherText" in result) { state.otherText = result.otherText; state.otherNote = result.otherNote; }
    renderExports();
    if (result.panel) {
      $("vc-panel").innerHTML = result.panel;
    }
    renderProblems();
    showStatus();
  }

  function scheduleValidate() {
    clearTimeout(state.timer);
    setStatus("Checking…", "muted");
    state.timer = setTimeout(validateForm, 350);
  }

  function formDraft() { return state.raw === null && state.protocol === 2 ? null : currentText(); }

  function validateForm() {
    clearTimeout(state.timer);
    var seq = ++state.seq;
    return check(formDraft()).then(function (result) {
      if (seq === state.seq) applyResult(result);
      return result;
    }, function (error) {
      if (seq !== state.seq) return null;
      if (error.retryAfter) {  // checked too often: check again when allowed
        setStatus("Checking again in " + error.retryAfter + " s…", "muted");
        state.timer = setTimeout(validateForm, error.retryAfter * 1000);
      } else {
        setStatus("Could not check the config just now; you can still submit.", "muted");
      }
      return null;
    });
  }

  // --------------------------------------------------------------- submit

  function submitText(text, mode) {
    hidden.value = text;
    modeInput.value = mode;
    state.submitting = true;
    submitButton.disabled = true;
    submitButton.textContent = "Submitting…";
    form.submit();
  }

  // Check first, so problems show without losing the page; the server checks again.
  form.addEventListener("submit", function (event) {
    if (state.submitting) return;
    event.preventDefault();
    var text = formDraft();
    submitButton.disabled = true;
    clearTimeout(state.timer);
    state.seq++;
    check(text).then(function (result) {
      submitButton.disabled = false;
      if (result.text) text = result.text;
      if (result.problems.length && !state.broken) {
        state.showAll = true;
        applyResult(result);
        $("problem-summary").focus();
        return;
      }
      if (result.problems.length) { openJson(text, result.problems); return; }
      submitText(text, "form");
    }, function () { submitText(currentText(), "form"); });
  });

  // ------------------------------------------------------------ JSON box

  function openJson(text, problems, warnings) {
    jsonBox.value = text;
    renderJsonProblems(problems || [], warnings);
    modeInput.value = "json";
    if (!dialog.open) dialog.showModal();
    jsonBox.focus();
    jsonBox.setSelectionRange(0, 0);
    jsonBox.scrollTop = 0;
  }

  function closeJson() {
    clearTimeout(state.jsonTimer);
    dialog.close();
  }

  dialog.addEventListener("close", function () { modeInput.value = "form"; });

  // Line numbers beside the JSON box; lines with a problem are marked.
  function renderGutter(marks) {
    var lines = jsonBox.value.split("\n").length;
    var fragment = document.createDocumentFragment();
    for (var n = 1; n <= lines; n++) {
      var div = document.createElement("div");
      div.dataset.line = n;
      div.textContent = n;
      if (marks[n]) { div.className = marks[n].bad ? "bad" : "warn"; div.title = marks[n].text; }
      fragment.appendChild(div);
    }
    gutter.textContent = "";
    gutter.appendChild(fragment);
    gutter.scrollTop = jsonBox.scrollTop;
  }

  // Problems (and warnings, marked as such) under the box and in its gutter.
  function renderJsonProblems(problems, warnings) {
    var marks = {};
    jsonProblems.textContent = "";
    problems.concat(warnings || []).forEach(function (problem, index) {
      var li = document.createElement("li");
      var warning = index >= problems.length;
      var text = (warning ? "Warning: " : "") + (problem.path ? problem.path + ": " : "") + problem.message;
      if (warning) li.className = "warn";
      if (problem.line) {
        var mark = marks[problem.line] || { text: "", bad: false };
        marks[problem.line] = { text: (mark.text ? mark.text + "\n" : "") + text, bad: mark.bad || !warning };
        var jump = document.createElement("button");
        jump.type = "button";
        jump.className = "link where";
        jump.textContent = "Line " + problem.line + ", column " + problem.column;
        jump.addEventListener("click", function () { moveCaret(problem.line, problem.column); });
        li.appendChild(jump);
        li.appendChild(document.createTextNode(" " + text));
      } else {
        li.textContent = text;
      }
      jsonProblems.appendChild(li);
    });
    renderGutter(marks);
  }

  function moveCaret(line, column) {
    var lines = jsonBox.value.split("\n");
    var offset = 0;
    for (var i = 0; i < line - 1 && i < lines.length; i++) offset += lines[i].length + 1;
    offset += Math.max(0, column - 1);
    jsonBox.focus();
    jsonBox.setSelectionRange(offset, offset);
    var lineHeight = parseFloat(getComputedStyle(jsonBox).lineHeight) || 20;
    jsonBox.scrollTop = Math.max(0, (line - 4) * lineHeight);
  }

  function jsonBusy(busy) {
    dialog.querySelectorAll(".json-actions button").forEach(function (b) { b.disabled = busy; });
  }

  // Put `text` into the form. A config with problems still loads (they
  // show next to the fields); text that is not a config stays here. A v2
  // config the form cannot show is kept as it is, and the form says why.
  function loadText(text, announce) {
    jsonBusy(true);
    return check(text).then(function (result) {
      jsonBusy(false);
      var keptAsText = result.syntaxOk && result.protocol === 2 && result.formNote;
      if (!keptAsText && (!result.syntaxOk || !isObject(result.value))) {
        var problems = result.problems.length ? result.problems : [{ path: "", message: "a job config is a JSON object: { \"jobName\": ..., \"taskRoles\": [...] }, or v2 YAML (protocolVersion: 2)" }];
        renderJsonProblems(problems, result.warnings);
        if (problems[0].line) moveCaret(problems[0].line, problems[0].column);
        return false;
      }
      state.config = keptAsText ? {} : result.value;
      state.raw = text;
      state.lastText = text;
      state.protocol = result.protocol;
      state.formNote = result.formNote || "";
      state.broken = !!keptAsText;
      state.touched = {};
      state.showAll = true;
      hidden.value = text;
      renderAll();
      applyResult(result);
      closeJson();
      setStatus(announce + (result.problems.length ? " " + plural(result.problems.length, "problem") + " to fix." : " Ready to submit."),
                result.problems.length ? "bad" : "ok");
      return true;
    }, function (error) {
      jsonBusy(false);
      renderJsonProblems([{ path: "", message: "could not check the config: " + error.message }]);
      return false;
    });
  }

  $("json-button").addEventListener("click", function () {
    // The last check was of this very text, so its lines and columns fit.
    var fresh = state.raw === null && state.protocol === 2 && state.timer;
    (fresh ? textNow() : Promise.resolve(currentText())).then(function (text) {
      openJson(text, state.problems.filter(function (p) { return p.line; }), state.warnings);
    });
  });

  // The box's submit button names what the box holds.
  function nameBox(protocol) {
    dialog.querySelector('[data-action="submit-json"]').textContent = protocol === 2 ? "Submit this YAML" : "Submit this JSON";
  }

  jsonBox.addEventListener("scroll", function () { gutter.scrollTop = jsonBox.scrollTop; });
  jsonBox.addEventListener("input", function () {
    renderGutter({});
    clearTimeout(state.jsonTimer);
    state.jsonTimer = setTimeout(function () {
      var text = jsonBox.value;
      check(text).then(function (result) {
        if (dialog.open && jsonBox.value === text) { renderJsonProblems(result.problems, result.warnings); nameBox(result.protocol); }
      }, function () {});
    }, 600);
  });

  dialog.addEventListener("click", function (event) {
    var button = event.target.closest("[data-action]");
    if (!button) return;
    var action = button.dataset.action;
    if (action === "close-json") closeJson();
    if (action === "apply-json") loadText(jsonBox.value, "Loaded into the form.");
    if (action === "submit-json") {
      var text = jsonBox.value;
      jsonBusy(true);
      check(text).then(function (result) {
        jsonBusy(false);
        if (result.problems.length) {
          renderJsonProblems(result.problems, result.warnings);
          if (result.problems[0].line) moveCaret(result.problems[0].line, result.problems[0].column);
          return;
        }
        state.raw = text;  // submitted as typed: comments stay in the stored config
        nameBox(result.protocol);
        submitText(text, "json");
      }, function () { submitText(text, "json"); });
    }
  });

  // ------------------------------------------------------ import / export

  $("import-button").addEventListener("click", function () { $("import-file").click(); });

  $("import-file").addEventListener("change", function () {
    var input = this;
    var file = input.files && input.files[0];
    input.value = "";  // choosing the same file again still loads it
    if (!file) return;
    if (file.size > MAX_BYTES) {
      openJson("", [{ path: "", message: file.name + " is " + Math.round(file.size / 1024) + " KB; a job config may be at most 256 KB" }]);
      return;
    }
    var reader = new FileReader();
    reader.onload = function () {
      // Read as bytes and decoded strictly: readAsText would turn what is
      // not UTF-8 into U+FFFD without a word (the API refuses such a file).
      var text;
      try {
        text = new TextDecoder("utf-8", { fatal: true }).decode(reader.result).replace(/^\ufeff/, "");
      } catch (error) {
        openJson("", [{ path: "", message: file.name + " is not UTF-8 text; save it as UTF-8 and import it again" }]);
        return;
      }
      openJson(text, []);
      loadText(text, "Imported " + file.name + ".");
    };
    reader.onerror = function () { openJson("", [{ path: "", message: "could not read " + file.name }]); };
    reader.readAsArrayBuffer(file);
  });

  function download(text, protocol) {
    var name = typeof state.config.jobName === "string" && state.config.jobName ? state.config.jobName : "job";
    var yaml = protocol === 2;
    var blob = new Blob([text], { type: yaml ? "text/yaml" : "application/json" });
    var link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = name.replace(/[^A-Za-z0-9\-._~]/g, "_") + (yaml ? ".yaml" : ".json");
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(function () { URL.revokeObjectURL(link.href); }, 2000);
    setStatus("Downloaded " + link.download + ".", "ok");
  }

  // Export: the config in its own protocol, as it is; and in the other one
  // when it can be said there (the server wrote it at the last check).
  function renderExports() {
    var mine = $("export-button"), other = $("export-other-button");
    mine.title = "Download this config as a " + (state.protocol === 2 ? ".yaml (v2)" : ".json (v1)") + " file";
    other.textContent = state.protocol === 2 ? "Export as v1 JSON" : "Export as v2 YAML";
    other.disabled = !state.otherText;
    other.title = state.otherText ? "Download the same job in the other format" : "Not possible: " + (state.otherNote || "check the config first");
  }

  $("export-button").addEventListener("click", function () {
    textNow().then(function (text) { download(text, state.protocol); });
  });

  $("export-other-button").addEventListener("click", function () {
    if (state.otherText) download(state.otherText, state.protocol === 2 ? 1 : 2);
  });

  // ---------------------------------------------------------------- start

  function start() {
    state.broken = !initial.syntaxOk || !isObject(initial.value);
    nameBox(state.protocol);
    state.config = state.broken ? {} : initial.value;
    hidden.value = state.raw;
    // Problems the server found (a rejected submit, a clone) show at once.
    state.showAll = state.problems.length > 0;
    renderAll();
    renderProblems();
    if (state.problems.length) showStatus();
    if (initial.mode === "json" || state.broken) openJson(initial.text, initial.problems, initial.warnings);
  }

  start();
})();
