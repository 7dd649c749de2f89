// attnviz live: the page of `attnviz serve`. It sends what is typed (or the file chosen) to this server only,
// shows the interactive views of the answer in a frame, the head table and one head's steps. Everything the
// server or the model returns is written as text (textContent), never as markup.
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var state = { model: null, answer: null, text: "", busy: false, sortKey: null, sortDown: true };

  function show(message) { $("lv-status").textContent = message || "\u00a0"; }
  function fail(message) {
    var box = $("lv-error");
    box.textContent = message;
    box.hidden = false;
  }
  function clearError() { $("lv-error").hidden = true; $("lv-error").textContent = ""; }

  function ticket() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return "t" + Math.random().toString(36).slice(2) + Date.now().toString(36);
  }

  // Every request goes to this server, as JSON; an answer that is not JSON is said in one line.
  function post(path, body, asBlob) {
    return fetch(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
                         credentials: "same-origin" })
      .then(function (response) {
        if (response.ok) return asBlob ? response.blob() : response.json();
        return response.json().then(function (data) { throw new Error(data && data.error ? data.error : "HTTP " + response.status); },
                                    function () { throw new Error("the server answered " + response.status); });
      });
  }

  function describe(model) {
    var what = { text: "a text", image: "a picture", sound: "a sound" }[model.kind];
    $("lv-model").textContent = "model " + model.model + " · " + model.layers + " layers × " + model.heads + " heads · " +
      model.device + ", " + model.dtype + " · reads " + what + " · attnviz " + model.version;
    var text = model.kind === "text";
    $("lv-text").hidden = !text;
    $("lv-text-label").hidden = !text;
    $("lv-text").maxLength = model.limits.max_chars;
    $("lv-file").hidden = text;
    $("lv-file-label").hidden = text;
    $("lv-file-label").textContent = (model.kind === "image" ? "Picture (PNG, JPEG or WebP)" : "Sound (WAV or FLAC, at most 30 s)") +
      ": choose it, or drop it here";
    $("lv-file").accept = model.kind === "image" ? "image/png,image/jpeg,image/webp" : "audio/wav,audio/x-wav,audio/flac,.wav,.flac";
    $("lv-words-label").hidden = !text || model.seq2seq;
    $("lv-contrib-label").hidden = !text || model.seq2seq;
    $("lv-steps-go").disabled = !text || model.seq2seq;
    if (!text || model.seq2seq) { $("lv-tab-steps").hidden = true; $("lv-tab-ablate").hidden = true; }
  }

  function readFile(file) {
    return new Promise(function (resolve, reject) {
      if (file.size > state.model.limits.max_file) {
        reject(new Error("the file is " + file.size + " bytes; this server takes at most " + state.model.limits.max_file));
        return;
      }
      var reader = new FileReader();
      reader.onload = function () { resolve(String(reader.result).replace(/^data:[^,]*,/, "")); };
      reader.onerror = function () { reject(new Error("the file cannot be read")); };
      reader.readAsDataURL(file);
    });
  }

  function ask(event) {
    event.preventDefault();
    if (state.busy) return;
    clearError();
    var model = state.model, id = ticket();
    var body = { ticket: id, words: $("lv-words").checked, contributions: $("lv-contrib").checked };
    var ready;
    if (model.kind === "text") {
      body.text = $("lv-text").value;
      ready = Promise.resolve(body);
    } else {
      var file = $("lv-file").files[0];
      if (!file) { fail("choose a file first"); return; }
      ready = readFile(file).then(function (data) { body[model.kind === "image" ? "image" : "audio"] = data; return body; });
    }
    state.busy = true;
    $("lv-go").disabled = true;
    show("sending…");
    var polling = setInterval(function () {
      fetch("/api/queue?ticket=" + encodeURIComponent(id)).then(function (r) { return r.json(); }).then(function (q) {
        if (!state.busy) return;
        if (q.position === 0) show("running the model…");
        else if (q.position > 0) show("in line: " + q.position + " request" + (q.position > 1 ? "s" : "") + " before yours");
      }, function () {});
    }, 250);
    ready.then(function (b) { return post("/api/capture", b); }).then(function (answer) {
      state.answer = answer;
      state.text = body.text || "";
      $("lv-view").src = answer.view;
      show(answer.tokens.length + " tokens · " + answer.layers + " layers × " + answer.heads + " heads · " +
           (answer.transcript ? "heard: " + answer.transcript + " · " : "") + answer.seconds.toFixed(3) + " s");
      fillHeads(answer.head_table);
      fillSteps(answer);
    }, function (error) {
      fail(error.message);
      show("");
    }).then(function () {
      clearInterval(polling);
      state.busy = false;
      $("lv-go").disabled = false;
    });
  }

  var COLUMNS = ["layer", "head", "label", "entropy", "norm_ent", "max", "dist", "prev", "self", "next", "start", "end"];
  function fillHeads(records) {
    var table = $("lv-heads"), head = table.tHead, body = table.tBodies[0];
    head.textContent = "";
    body.textContent = "";
    if (!records.length) return;
    var keys = COLUMNS.filter(function (k) { return k in records[0]; });
    Object.keys(records[0]).forEach(function (k) { if (keys.indexOf(k) < 0 && keys.length < 16) keys.push(k); });
    var row = head.insertRow();
    keys.forEach(function (k) {
      var th = document.createElement("th");
      th.scope = "col";
      th.textContent = k;
      th.tabIndex = 0;
      th.dataset.key = k;
      row.appendChild(th);
    });
    var sorted = records.slice();
    if (state.sortKey) {
      sorted.sort(function (a, b) {
        var x = a[state.sortKey], y = b[state.sortKey];
        var order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return state.sortDown ? -order : order;
      });
    }
    sorted.forEach(function (r) {
      var tr = body.insertRow();
      keys.forEach(function (k) {
        var td = tr.insertCell(), v = r[k];
        td.textContent = v === null || v === undefined ? "–" : typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : String(v);
        if (typeof v !== "number") td.className = "text";
      });
    });
  }
  function sortBy(key) {
    state.sortDown = state.sortKey === key ? !state.sortDown : true;
    state.sortKey = key;
    if (state.answer) fillHeads(state.answer.head_table);
  }

  function options(select, items, chosen) {
    select.textContent = "";
    items.forEach(function (item) {
      var o = document.createElement("option");
      o.value = String(item[0]);
      o.textContent = item[1];
      if (String(item[0]) === String(chosen)) o.selected = true;
      select.appendChild(o);
    });
  }
  function range(n, name) { var out = []; for (var i = 0; i < n; i++) out.push([i, name + " " + i]); return out; }
  function fillSteps(answer) {
    options($("lv-steps-layer"), range(answer.layers, "layer"), $("lv-steps-layer").value || 0);
    options($("lv-steps-head"), range(answer.heads, "head"), $("lv-steps-head").value || 0);
    options($("lv-steps-token"), [["", "every token"]].concat(answer.tokens.map(function (t, i) { return [i, i + " " + t]; })), "");
  }
  function steps() {
    if (!state.answer || !state.text) { $("lv-steps-status").textContent = "show a text first"; return; }
    var token = $("lv-steps-token").value;
    var body = { text: state.text, layer: Number($("lv-steps-layer").value), head: Number($("lv-steps-head").value),
                 token: token === "" ? null : Number(token) };
    $("lv-steps-status").textContent = "computing…";
    post("/api/steps.png", body, true).then(function (blob) {
      var img = $("lv-steps-img"), old = img.src;
      img.src = URL.createObjectURL(blob);
      img.hidden = false;
      if (old && old.indexOf("blob:") === 0) URL.revokeObjectURL(old);
      $("lv-steps-status").textContent = "layer " + body.layer + ", head " + body.head;
    }, function (error) { $("lv-steps-status").textContent = ""; fail(error.message); });
  }

  function ablate() {
    if (!state.answer || !state.text) { $("lv-ablate-status").textContent = "show a text first"; return; }
    var body = { text: state.text, heads: $("lv-ablate-heads").value, mode: $("lv-ablate-mode").value };
    $("lv-ablate-status").textContent = "removing…";
    clearError();
    post("/api/ablate", body).then(function (summary) {
      var said = summary.kind === "causal"
        ? "next-token loss " + summary.loss.before.toFixed(3) + " → " + summary.loss.after.toFixed(3) + " nats"
        : "sentence embedding: cosine before/after " + summary.sentence_cosine.toFixed(4);
      var later = summary.later_layers.length
        ? "; the largest change of α in a later layer: " + Math.max.apply(null, summary.later_layers.map(function (l) { return l.max_abs_delta; })).toFixed(3)
        : "; no layer follows them";
      $("lv-ablate-status").textContent = "removed " + summary.removed.map(function (p) { return p[0] + "." + p[1]; }).join(", ") +
        ": " + said + later;
      if (!summary.later_layers.length) { $("lv-ablate-img").hidden = true; return null; }
      return post("/api/ablate.png", body, true);
    }).then(function (blob) {
      if (!blob) return;
      var img = $("lv-ablate-img"), old = img.src;
      img.src = URL.createObjectURL(blob);
      img.hidden = false;
      if (old && old.indexOf("blob:") === 0) URL.revokeObjectURL(old);
    }, function (error) { $("lv-ablate-status").textContent = ""; fail(error.message); });
  }

  var TABS = ["view", "heads", "steps", "ablate"];
  function showTab(name) {
    TABS.forEach(function (t) {
      var on = t === name;
      $("lv-tab-" + t).setAttribute("aria-selected", on ? "true" : "false");
      $("lv-tab-" + t).tabIndex = on ? 0 : -1;
      $("lv-" + t + "-panel").hidden = !on;
    });
  }

  window.addEventListener("message", function (event) {  // the views' frame says how tall it is
    var frame = $("lv-view");
    if (event.source !== frame.contentWindow || !event.data || typeof event.data.attnvizHeight !== "number") return;
    frame.style.height = Math.max(400, Math.min(6000, event.data.attnvizHeight)) + "px";
  });

  function start() {
    $("lv-ask").addEventListener("submit", ask);
    $("lv-text").addEventListener("keydown", function (e) {
      if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("lv-ask").requestSubmit(); }
    });
    TABS.forEach(function (t) { $("lv-tab-" + t).addEventListener("click", function () { showTab(t); }); });
    var form = $("lv-ask");  // a picture or a sound dropped on the form is sent as if chosen
    form.addEventListener("dragover", function (e) {
      if (state.model && state.model.kind !== "text") { e.preventDefault(); form.classList.add("lv-drop"); }
    });
    form.addEventListener("dragleave", function () { form.classList.remove("lv-drop"); });
    form.addEventListener("drop", function (e) {
      form.classList.remove("lv-drop");
      if (!state.model || state.model.kind === "text" || !e.dataTransfer || !e.dataTransfer.files.length) return;
      e.preventDefault();
      $("lv-file").files = e.dataTransfer.files;
      form.requestSubmit();
    });
    $("lv-steps-go").addEventListener("click", steps);
    $("lv-ablate-go").addEventListener("click", ablate);
    $("lv-heads").tHead.addEventListener("click", function (e) { var th = e.target.closest("th"); if (th) sortBy(th.dataset.key); });
    $("lv-heads").tHead.addEventListener("keydown", function (e) {
      var th = e.target.closest("th");
      if (th && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); sortBy(th.dataset.key); }
    });
    fetch("/api/model").then(function (r) { return r.json(); }).then(function (model) {
      state.model = model;
      describe(model);
      document.documentElement.dataset.attnvizLive = "1";
    }, function () { fail("the server does not answer"); });
  }
  window.attnvizLive = { state: state };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
