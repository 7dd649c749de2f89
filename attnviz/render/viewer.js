// attnviz interactive viewer: head view, model view, matrix view. Everything it shows comes from the JSON in
// #attnviz-data; nothing is fetched. Strings from the data are only ever set as textContent.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("attnviz-data").textContent);
  // Paul Tol's "muted" scheme: distinguishable with the common colour-vision deficiencies. Heads past the
  // ninth reuse a colour with a dashed line.
  var PALETTE = ["#CC6677", "#332288", "#DDCC77", "#117733", "#88CCEE", "#882255", "#44AA99", "#999933", "#AA4499"];
  // viridis, 9 stops (matplotlib), interpolated
  var VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141], [39, 173, 129],
    [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  var ROW = 20;
  var $ = function (id) { return document.getElementById(id); };

  function viridis(t) {
    t = Math.max(0, Math.min(1, t)) * (VIRIDIS.length - 1);
    var k = Math.min(Math.floor(t), VIRIDIS.length - 2), f = t - k, a = VIRIDIS[k], b = VIRIDIS[k + 1];
    return [a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f];
  }
  function headColour(h) { return PALETTE[h % PALETTE.length]; }
  function dashed(h) { return h >= PALETTE.length; }

  // --- data ---------------------------------------------------------------------------------------
  var littleEndian = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
  function decode(payload, bits) {  // base64 of little-endian unsigned integers -> a typed array
    var bin = atob(payload), bytes = new Uint8Array(bin.length);
    for (var n = 0; n < bin.length; n++) bytes[n] = bin.charCodeAt(n);
    if (bits !== 16) return bytes;
    if (littleEndian) return new Uint16Array(bytes.buffer);
    var view = new DataView(bytes.buffer), q = new Uint16Array(bytes.length / 2);
    for (var m = 0; m < q.length; m++) q[m] = view.getUint16(2 * m, true);
    return q;
  }
  data.sections.forEach(function (s) {
    s.q = decode(s.alpha, s.bits);
    s.top = s.bits === 16 ? 65535 : 255;
    s.R = s.rows.length; s.C = s.cols.length; s.L = s.layers.length;
    delete s.alpha;
  });

  var state = { section: 0, layer: 0, heads: null, focus: null, picked: { side: null, indices: [] }, view: "head",
    matrixHead: "mean", cursor: [0, 0],
    drawn: 0 };
  function sec() { return data.sections[state.section]; }
  function weight(s, li, h, i, j) { return s.q[((li * s.heads + h) * s.R + i) * s.C + j] / s.top * s.scale[li][h]; }
  function shown(s, i, j, li) {  // false for cells the layer masks: the future, and beyond a sliding window
    if (s.causal && j > i) return false;
    var layer = li === undefined ? state.layer : li;
    if (s.blockWindows && s.blockWindows[layer]) {  // pooled: a block of keys wholly out of the window
      var bw = s.blockWindows[layer], first = s.edges[i], last = s.edges[j + 1] - 1;
      return s.causal ? first - last < bw : Math.max(first - last, s.edges[j] - (s.edges[i + 1] - 1)) <= bw;
    }
    var w = s.windows ? s.windows[layer] : 0;
    return !w || (s.causal ? i - j < w : Math.abs(i - j) <= w);
  }
  function meanWeight(s, li, i, j) {
    var sum = 0;
    for (var h = 0; h < s.heads; h++) sum += weight(s, li, h, i, j);
    return sum / s.heads;
  }
  function fmt(x) { return x.toFixed(data.bits === 16 ? 4 : 3); }
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  // --- header -------------------------------------------------------------------------------------
  function header() {
    $("av-text").textContent = data.text;
    var s0 = data.sections[0];
    var size = data.sections.map(function (s) {
      var over = s.frames ? s.frames + " frames of sound" + (s.C > s.frames ? " and the silence" : "") : null;
      if (over) {  // a speech model's part over the sound: the frames are its keys (and the encoder's queries)
        return (data.sections.length > 1 ? s.title + ": " : "") + s.L + " layers × " + s.heads + " heads, " +
          (s.R === s.C ? over : s.R + " tokens × " + over);
      }
      return (data.sections.length > 1 ? s.title + ": " : "") + s.L + " layers × " + s.heads + " heads, " + s.R +
        (s.R === s.C ? " tokens" : " × " + s.C + " tokens");
    }).join(" · ");
    var precision = data.bits === 16 ? "16 bits per weight (each matrix scaled to its largest weight; error ≤ 8e-6 of it)"
      : "8 bits per weight (each matrix scaled to its largest weight; error ≤ 0.2% of it)";
    $("av-meta").textContent = "model " + data.model + " · " + size + (s0.causal ? " · causal" : "") +
      (data.dtype ? " · " + data.dtype : "") + " · α stored with " + precision;
    $("av-made").textContent = "made by attnviz " + data.version + ": " + data.command;
  }

  // --- controls -----------------------------------------------------------------------------------
  function fillSelect(select, options, chosen) {
    select.textContent = "";
    options.forEach(function (o) {
      var opt = el("option", o[1]);
      opt.value = String(o[0]);
      if (String(o[0]) === String(chosen)) opt.selected = true;
      select.appendChild(opt);
    });
  }
  function controls() {
    var s = sec();
    if (data.sections.length > 1) {
      $("av-part-label").hidden = false;
      fillSelect($("av-part"), data.sections.map(function (x, n) { return [n, x.title]; }), state.section);
    }
    fillSelect($("av-layer"), s.layers.map(function (l, n) { return [n, "layer " + l]; }), state.layer);
    var heads = [["mean", "mean of the heads"]];
    for (var h = 0; h < s.heads; h++) heads.push([h, "head " + h]);
    fillSelect($("av-matrix-head"), heads, state.matrixHead);
    var toggles = $("av-head-toggles");
    toggles.textContent = "";
    for (var k = 0; k < s.heads; k++) {
      var b = el("button", "", "av-toggle");
      b.type = "button";
      b.dataset.head = k;
      b.setAttribute("aria-pressed", state.heads.has(k) ? "true" : "false");
      var sw = el("span", "", "sw");
      sw.style.background = dashed(k) ? "repeating-linear-gradient(90deg," + headColour(k) + " 0 5px,#fff 5px 8px)"
        : headColour(k);
      b.appendChild(sw);
      b.appendChild(el("span", String(k)));
      b.setAttribute("aria-label", "head " + k);
      toggles.appendChild(b);
    }
    var notes = s.notes.slice();
    if (s.causal) notes.push("causal: a token attends only to itself and earlier tokens (future cells are blank)");
    if (s.rowSplit !== null && s.rowSplit !== undefined) notes.push("generated tokens begin at " + s.rows[s.rowSplit] +
      " (a line marks where)");
    $("av-notes").textContent = notes.join(" · ");
  }

  // --- head view ----------------------------------------------------------------------------------
  function tokenList(list, labels, special, side, split) {
    list.textContent = "";
    labels.forEach(function (t, n) {
      var li = el("li", t);
      li.tabIndex = 0;
      li.dataset.side = side;
      li.dataset.index = n;
      li.title = t;
      li.setAttribute("aria-label", (side === "left" ? "query " : "key ") + n + ": " + t);
      if (special[n]) li.classList.add("special");
      if (split !== null && split !== undefined && n === split && n > 0) li.classList.add("split");
      list.appendChild(li);
    });
  }
  function headView() {
    var s = sec();
    tokenList($("av-left"), s.rows, s.rowSpecial, "left", s.rowSplit);
    tokenList($("av-right"), s.cols, s.colSpecial, "right", s.colSplit);
    drawLines();
  }
  function sizedCanvas(canvas, width, height) {
    // a canvas of width × height CSS pixels, sharp on high-density screens; its 2D context, cleared
    var ratio = window.devicePixelRatio || 1;
    canvas.style.width = width + "px";
    canvas.style.height = height + "px";
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    return ctx;
  }
  var pending = null;  // the lines still to draw (a large head view is drawn over several frames)
  function drawLines() {
    var s = sec(), width = 320, height = Math.max(s.R, s.C) * ROW, canvas = $("av-lines");
    var ctx = sizedCanvas(canvas, width, height);
    ctx.lineWidth = 2;
    var f = state.focus, li = state.layer, lines = [];
    var rows = [], cols = [], i, j;
    var picked = state.picked;
    if (picked.indices.length) f = null;  // a selection holds the lines while it lasts
    for (i = 0; i < s.R; i++) {
      if (picked.indices.length ? picked.side !== "left" || picked.indices.indexOf(i) >= 0 :
          !f || f.side !== "left" || f.index === i) rows.push(i);
    }
    for (j = 0; j < s.C; j++) {
      if (picked.indices.length ? picked.side !== "right" || picked.indices.indexOf(j) >= 0 :
          !f || f.side !== "right" || f.index === j) cols.push(j);
    }
    state.heads.forEach(function (h) {
      rows.forEach(function (qi) {
        cols.forEach(function (kj) {
          if (!shown(s, qi, kj)) return;
          var w = weight(s, li, h, qi, kj);
          if (w >= 0.01) lines.push([h, qi, kj, Math.min(1, w)]);
        });
      });
    });
    state.drawn = lines.length;
    canvas.dataset.lines = String(lines.length);
    if (pending !== null) cancelAnimationFrame(pending);
    pending = null;
    var next = 0, CHUNK = 1500, head = -1;  // ~1500 lines a frame keeps the page responsive meanwhile
    function chunk() {
      var stop = Math.min(lines.length, next + CHUNK);
      for (; next < stop; next++) {
        var l = lines[next];
        if (l[0] !== head) {  // lines come grouped by head
          head = l[0];
          ctx.strokeStyle = headColour(head);
          ctx.setLineDash(dashed(head) ? [5, 3] : []);
        }
        ctx.globalAlpha = l[3];
        ctx.beginPath();
        ctx.moveTo(0, l[1] * ROW + ROW / 2);
        ctx.lineTo(width, l[2] * ROW + ROW / 2);
        ctx.stroke();
      }
      ctx.globalAlpha = 1;
      pending = next < lines.length ? requestAnimationFrame(chunk) : null;
      if (pending === null && window.attnvizViewer && window.attnvizViewer.drawnAt === undefined) {
        window.attnvizViewer.drawnAt = performance.now();
      }
    }
    chunk();
    document.querySelectorAll(".av-tokens li.active").forEach(function (e) { e.classList.remove("active"); });
    if (f) {
      var list = $(f.side === "left" ? "av-left" : "av-right");
      if (list.children[f.index]) list.children[f.index].classList.add("active");
    }
    document.querySelectorAll(".av-tokens li.picked").forEach(function (e) { e.classList.remove("picked"); });
    picked.indices.forEach(function (n) {
      var item = $(picked.side === "left" ? "av-left" : "av-right").children[n];
      if (item) item.classList.add("picked");
    });
    selectionReadout();
  }
  function summed() {
    // the selection's attention summed over its tokens, each the mean over the heads shown: per other token
    var s = sec(), picked = state.picked, heads = Array.from(state.heads), li = state.layer, out = [];
    var others = picked.side === "left" ? s.C : s.R;
    for (var o = 0; o < others; o++) {
      var total = 0;
      picked.indices.forEach(function (n) {
        var i = picked.side === "left" ? n : o, j = picked.side === "left" ? o : n;
        if (!shown(s, i, j)) return;
        heads.forEach(function (h) { total += weight(s, li, h, i, j) / heads.length; });
      });
      out.push(total);
    }
    return out;
  }
  function selectionReadout() {
    var picked = state.picked, s = sec(), line = $("av-selection");
    if (!picked.indices.length || !state.heads.size) { line.textContent = "\u00a0"; return; }
    var labels = picked.side === "left" ? s.rows : s.cols, others = picked.side === "left" ? s.cols : s.rows;
    var sums = summed(), order = sums.map(function (v, n) { return n; });
    order.sort(function (a, b) { return sums[b] - sums[a]; });
    var named = picked.indices.map(function (n) { return "'" + labels[n] + "'"; }).join(" + ");
    line.textContent = (picked.side === "left" ? "what " + named + " attend to" : "who attends to " + named) +
      " (summed over " + picked.indices.length + " token" + (picked.indices.length > 1 ? "s" : "") +
      ", each the mean of the " + state.heads.size + " head" + (state.heads.size > 1 ? "s" : "") + " shown): " +
      order.slice(0, 5).map(function (n) { return "'" + others[n] + "' " + fmt(sums[n]); }).join(" · ");
    line.dataset.sums = JSON.stringify(sums);
  }
  function pick(target, add) {
    var item = target && target.closest ? target.closest("li") : null;
    if (!add || !item) { state.picked = { side: null, indices: [] }; drawLines(); return; }
    var side = item.dataset.side, n = Number(item.dataset.index), picked = state.picked;
    if (picked.side !== side) picked = state.picked = { side: side, indices: [] };
    var at = picked.indices.indexOf(n);
    if (at >= 0) picked.indices.splice(at, 1); else picked.indices.push(n);
    picked.indices.sort(function (a, b) { return a - b; });
    drawLines();
  }
  function setFocus(target) {
    var next = target && target.dataset && target.dataset.side ?
      { side: target.dataset.side, index: Number(target.dataset.index) } : null;
    var same = (next === null && state.focus === null) || (next && state.focus && next.side === state.focus.side &&
      next.index === state.focus.index);
    if (same) return;
    state.focus = next;
    drawLines();
  }

  // --- model view ---------------------------------------------------------------------------------
  function thumbnail(s, li, h) {
    var w = Math.min(s.C, 72), hgt = Math.min(s.R, 72);
    var canvas = el("canvas");
    canvas.width = w;
    canvas.height = hgt;
    var ctx = canvas.getContext("2d"), img = ctx.createImageData(w, hgt);
    for (var y = 0; y < hgt; y++) {
      var i = Math.floor(y * s.R / hgt);
      for (var x = 0; x < w; x++) {
        var j = Math.floor(x * s.C / w), p = 4 * (y * w + x);
        if (!shown(s, i, j, li)) { img.data[p] = img.data[p + 1] = img.data[p + 2] = 255; img.data[p + 3] = 255; continue; }
        var c = viridis(s.q[((li * s.heads + h) * s.R + i) * s.C + j] / s.top);
        img.data[p] = c[0]; img.data[p + 1] = c[1]; img.data[p + 2] = c[2]; img.data[p + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    return canvas;
  }
  function modelView() {
    var s = sec(), grid = $("av-thumbs");
    grid.textContent = "";
    grid.style.gridTemplateColumns = "auto repeat(" + s.heads + ", auto)";
    grid.appendChild(el("span", "", "lab"));
    for (var h = 0; h < s.heads; h++) grid.appendChild(el("span", "head " + h, "lab"));
    for (var li = 0; li < s.L; li++) {
      grid.appendChild(el("span", "layer " + s.layers[li], "lab"));
      for (var k = 0; k < s.heads; k++) {
        var b = el("button");
        b.type = "button";
        b.dataset.layer = li;
        b.dataset.head = k;
        b.setAttribute("aria-label", "layer " + s.layers[li] + " head " + k + ": open in the head view");
        b.title = "layer " + s.layers[li] + ", head " + k;
        if (li === state.layer && state.heads.size === 1 && state.heads.has(k)) b.classList.add("current");
        b.appendChild(thumbnail(s, li, k));
        grid.appendChild(b);
      }
    }
  }
  function openHead(li, h) {
    state.layer = li;
    state.heads = new Set([h]);
    state.focus = null;
    controls();
    showView("head");
  }

  // --- matrix view --------------------------------------------------------------------------------
  var matrixGeometry = null;
  function matrixValue(s, i, j) {
    return state.matrixHead === "mean" ? meanWeight(s, state.layer, i, j) : weight(s, state.layer, Number(state.matrixHead), i, j);
  }
  function axisLabels(ctx, rows, cols, margin, cell, size, cut) {
    // row labels to the left of a matrix drawn at (margin, margin), column labels above it, turned upright
    ctx.fillStyle = "#222";
    ctx.font = size + "px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (var i = 0; i < rows.length; i++) ctx.fillText(rows[i].slice(0, cut), margin - 4, margin + i * cell + cell / 2);
    for (var j = 0; j < cols.length; j++) {
      ctx.save();
      ctx.translate(margin + j * cell + cell / 2, margin - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(cols[j].slice(0, cut), 0, 0);
      ctx.restore();
    }
  }
  function matrixView() {
    var s = sec();
    var cell = Math.max(2, Math.min(24, Math.floor(720 / Math.max(s.R, s.C))));
    var labels = cell >= 10, margin = labels ? 130 : 4;
    var width = margin + s.C * cell + 4, height = margin + s.R * cell + 4;
    var ctx = sizedCanvas($("av-matrix"), width, height);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, width, height);
    var top = 0, i, j, values = new Float64Array(s.R * s.C);
    for (i = 0; i < s.R; i++) for (j = 0; j < s.C; j++) {
      var v = shown(s, i, j) ? matrixValue(s, i, j) : NaN;
      values[i * s.C + j] = v;
      if (v > top) top = v;
    }
    for (i = 0; i < s.R; i++) for (j = 0; j < s.C; j++) {
      var value = values[i * s.C + j];
      if (isNaN(value)) { ctx.fillStyle = "#eeeeee"; }
      else { var c = viridis(top > 0 ? value / top : 0);
        ctx.fillStyle = "rgb(" + Math.round(c[0]) + "," + Math.round(c[1]) + "," + Math.round(c[2]) + ")"; }
      ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
    }
    if (labels) axisLabels(ctx, s.rows, s.cols, margin, cell, Math.min(12, cell - 1), 18);
    if (s.rowSplit !== null && s.rowSplit !== undefined && s.rowSplit > 0) {  // where generated tokens begin
      ctx.strokeStyle = "#e8175d";
      ctx.lineWidth = 2;
      ctx.beginPath();
      ctx.moveTo(margin - (labels ? 120 : 0), margin + s.rowSplit * cell);
      ctx.lineTo(margin + s.C * cell, margin + s.rowSplit * cell);
      if (s.colSplit !== null && s.colSplit !== undefined && s.colSplit > 0) {  // and where they begin as keys
        ctx.moveTo(margin + s.colSplit * cell, margin - (labels ? 120 : 0));
        ctx.lineTo(margin + s.colSplit * cell, margin + s.R * cell);
      }
      ctx.stroke();
    }
    matrixGeometry = { margin: margin, cell: cell, top: top, split: s.rowSplit };
    $("av-matrix-scale").textContent = "colours: linear, from 0 (dark purple) to " + fmt(top) +
      " (yellow), the largest weight shown" + (s.causal ? "; grey cells are future tokens" : "");
    drawCursor();
  }
  function drawCursor() {
    var g = matrixGeometry, ctx = $("av-matrix").getContext("2d");
    if (!g || document.activeElement !== $("av-matrix")) return;
    ctx.strokeStyle = "#d55e00";
    ctx.lineWidth = 2;
    ctx.strokeRect(g.margin + state.cursor[1] * g.cell, g.margin + state.cursor[0] * g.cell, g.cell, g.cell);
    readout(state.cursor[0], state.cursor[1]);
  }
  function readout(i, j) {
    var s = sec();
    var head = state.matrixHead === "mean" ? "mean of the heads" : "head " + state.matrixHead;
    var text = s.rowAxis + " " + i + " “" + s.rows[i] + "” → " + s.colAxis + " " + j + " “" + s.cols[j] + "”: ";
    text += shown(s, i, j) ? "α = " + fmt(matrixValue(s, i, j)) :
      (s.causal && j > i ? "(a future token: not attended to)" : "(outside this layer's sliding window: masked)");
    $("av-readout").textContent = text + "  (layer " + s.layers[state.layer] + ", " + head + ")";
  }

  // --- contributions: the contribution graph, the strongest paths into a token, both rollouts -------------
  var C = data.contributions;
  if (C) {
    C.q = decode(C.scores, 16);
    C.r = decode(C.rollouts, 16);
    delete C.scores; delete C.rollouts;
    C.T = C.tokens; C.L = C.layers;
    state.cToken = C.token;
    state.cThreshold = C.threshold;
    state.cEdges = 0;
    state.cPaths = [];
  }
  function contribution(l, i, j) { return C.q[(l * C.T + i) * C.T + j] / 65535 * C.scale[l]; }
  function rolled(k, i, j) { return C.r[(k * C.T + i) * C.T + j] / 65535 * C.rolloutScale[k]; }  // k 0: contribution, 1: α
  function strongestPaths(token, top) {
    // every level keeps each token's `top` strongest paths from the input (a product only grows with its prefix,
    // so the strongest paths extend the strongest prefixes): metrics.strongest_paths, written out here
    var best = [], l, i, j;
    for (j = 0; j < C.T; j++) best.push([[1, [j]]]);
    for (l = 0; l < C.L; l++) {
      var grown = [];
      for (i = 0; i < C.T; i++) {
        var candidates = [];
        for (j = 0; j < C.T; j++) {
          var w = contribution(l, i, j);
          if (w <= 0) continue;
          for (var k = 0; k < best[j].length; k++) candidates.push([best[j][k][0] * w, best[j][k][1]]);
        }
        candidates.sort(function (a, b) { return b[0] - a[0]; });
        grown.push(candidates.slice(0, top).map(function (c) { return [c[0], c[1].concat([i])]; }));
      }
      best = grown;
    }
    return best[token];
  }
  var PATH_COLOURS = ["#CC6677", "#332288", "#117733", "#DDCC77", "#AA4499"];
  function contribView() {
    var tokens = sec().rows, T = C.T, L = C.L;
    $("av-c-hint").textContent = "The contribution graph (" + C.method + "): tokens across, layers up, the input at " +
      "the bottom. An edge joins a token to one in the layer above where its contribution there reaches the " +
      "threshold; darker and wider is more. Choose a token to draw its strongest paths from the input in colour.";
    $("av-c-threshold").value = String(state.cThreshold);
    $("av-c-threshold-value").textContent = state.cThreshold.toFixed(2);
    var list = $("av-c-tokens");
    if (list.children.length !== T) {
      list.textContent = "";
      tokens.forEach(function (t, n) {
        var b = el("button", t);
        b.type = "button";
        b.dataset.token = n;
        b.title = "token " + n + ": " + t;
        b.setAttribute("aria-label", "token " + n + ": " + t);
        list.appendChild(b);
      });
    }
    for (var n = 0; n < list.children.length; n++) {
      list.children[n].setAttribute("aria-pressed", n === state.cToken ? "true" : "false");
    }
    state.cPaths = strongestPaths(state.cToken, 5);
    drawGraph(tokens);
    var paths = $("av-c-paths");
    paths.textContent = "";
    $("av-c-paths-title").textContent = "The strongest paths into “" + tokens[state.cToken] + "” (token " +
      state.cToken + "), input first; weight: the product of the contributions along the path";
    state.cPaths.forEach(function (p, k) {
      var li = el("li", p[0].toFixed(3) + "  " + p[1].map(function (j) { return tokens[j]; }).join(" → "));
      li.style.color = PATH_COLOURS[k % PATH_COLOURS.length];
      paths.appendChild(li);
    });
    $("av-c-rollout-title").textContent = "What reaches “" + tokens[state.cToken] + "” through all the layers";
    var body = $("av-c-rollout").tBodies[0];
    body.textContent = "";
    var top = 1e-9;
    for (var j = 0; j < T; j++) top = Math.max(top, rolled(0, state.cToken, j), rolled(1, state.cToken, j));
    for (j = 0; j < T; j++) {
      var tr = el("tr");
      tr.appendChild(el("td", tokens[j]));
      [0, 1].forEach(function (k) {
        var v = rolled(k, state.cToken, j), td = el("td"), bar = el("span", "", "av-c-bar " + (k ? "a" : "c"));
        bar.style.width = Math.round(120 * v / top) + "px";
        td.appendChild(bar);
        td.appendChild(el("span", v.toFixed(3)));
        tr.appendChild(td);
      });
      body.appendChild(tr);
    }
    faithTable();
  }
  function faithTable() {  // how faithful α, its rollout and the contributions are on this text (--faithfulness)
    var F = C.faithfulness, table = $("av-c-faith");
    if (!F || !table) return;
    $("av-c-faith-title").hidden = false;
    table.hidden = false;
    $("av-c-faith-title").textContent = "Which to trust on this text: each erased in its own order, f = " +
      F.quantity + " (attnviz faithfulness; best first)";
    var body = table.tBodies[0];
    body.textContent = "";
    F.rows.forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("td", r.method));
      [r.comprehensiveness_aopc, r.sufficiency_aopc, r.kendall_tau_loo].forEach(function (v) {
        tr.appendChild(el("td", v === null || v === undefined ? "–" : Number(v).toFixed(3)));
      });
      tr.appendChild(el("td", r.beats_random || "–"));
      body.appendChild(tr);
    });
  }
  function drawGraph(tokens) {
    var T = C.T, L = C.L, col = Math.max(14, Math.min(48, Math.floor(900 / T))), row = Math.max(14, Math.min(44,
      Math.floor(520 / (L + 1)))), left = 70, bottom = 90, top = 12;
    var width = left + T * col + 10, height = top + (L + 1) * row + bottom;
    var ctx = sizedCanvas($("av-c-graph"), width, height);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, width, height);
    function x(j) { return left + j * col + col / 2; }
    function y(level) { return top + (L - level) * row + row / 2; }
    var edges = 0, l, i, j;
    ctx.strokeStyle = "#333";
    for (l = 0; l < L; l++) for (i = 0; i < T; i++) for (j = 0; j < T; j++) {
      var w = contribution(l, i, j);
      if (w < state.cThreshold) continue;
      edges++;
      ctx.globalAlpha = Math.min(1, 0.15 + w);
      ctx.lineWidth = 0.4 + 3 * w;
      ctx.beginPath();
      ctx.moveTo(x(j), y(l));
      ctx.lineTo(x(i), y(l + 1));
      ctx.stroke();
    }
    ctx.globalAlpha = 1;
    state.cEdges = edges;
    $("av-c-edges").textContent = edges + " edges of " + (L * T * T) + " reach " + state.cThreshold.toFixed(2);
    state.cPaths.forEach(function (p, k) {
      ctx.strokeStyle = PATH_COLOURS[k % PATH_COLOURS.length];
      ctx.lineWidth = 2.4;
      ctx.beginPath();
      p[1].forEach(function (jj, level) { if (level) ctx.lineTo(x(jj), y(level)); else ctx.moveTo(x(jj), y(level)); });
      ctx.stroke();
    });
    ctx.fillStyle = "#555";
    for (l = 0; l <= L; l++) for (j = 0; j < T; j++) { ctx.beginPath(); ctx.arc(x(j), y(l), 2, 0, 2 * Math.PI); ctx.fill(); }
    ctx.fillStyle = "#222";
    ctx.font = "11px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    var every = Math.ceil(12 / row);
    for (l = 0; l <= L; l += every) ctx.fillText(l ? "layer " + (l - 1) : "input", left - 6, y(l));
    var step = Math.ceil(12 / col);
    for (j = 0; j < T; j += step) {
      ctx.save();
      ctx.translate(x(j), top + (L + 1) * row + 4);
      ctx.rotate(-Math.PI / 2);
      ctx.fillStyle = j === state.cToken ? "#d55e00" : "#222";
      ctx.fillText(tokens[j].slice(0, 16), 0, 0);
      ctx.restore();
    }
  }

  // --- picture: a vision capture's patches over the picture itself -------------------------------------
  var photo = null;  // the decoded picture (an <img> of the capture's PNG), once loaded
  state.pictureQuery = null;  // a patch made the query by hovering (null: the pinned one)
  state.picturePinned = null;  // a patch kept as the query by a click (null: [CLS], or the patches' mean)
  state.pictureHead = "mean";
  function pictureQuery() {
    var s = sec(), P = s.picture;
    var patch = state.pictureQuery || state.picturePinned;
    if (patch) return { index: P.start + patch[0] * P.grid[1] + patch[1], name: "p(" + patch[0] + "," + patch[1] + ")" };
    return P.start > 0 ? { index: 0, name: s.rows[0] } : { index: null, name: "the patches (mean of their rows)" };
  }
  function pictureRow() {  // the query's weight on each patch, row by row (rows × cols)
    var s = sec(), P = s.picture, q = pictureQuery(), n = P.grid[0] * P.grid[1], row = new Float64Array(n);
    var heads = state.pictureHead === "mean" ? null : Number(state.pictureHead);
    function value(i, j) { return heads === null ? meanWeight(s, state.layer, i, j) : weight(s, state.layer, heads, i, j); }
    for (var k = 0; k < n; k++) {
      var j = P.start + k;
      if (q.index !== null) row[k] = value(q.index, j);
      else { var sum = 0; for (var i = P.start; i < s.R; i++) sum += value(i, j); row[k] = sum / n; }
    }
    return row;
  }
  function pictureView() {
    var s = sec(), P = s.picture;
    var heads = [["mean", "mean of the heads"]];
    for (var h = 0; h < s.heads; h++) heads.push([h, "head " + h]);
    fillSelect($("av-picture-head"), heads, state.pictureHead);
    if (!photo) {
      photo = new Image();
      photo.onload = function () { if (state.view === "picture") drawPicture(); };
      photo.setAttribute("src", "data:image/png;base64," + P.png);  // the capture's own picture: nothing is fetched
    }
    drawPicture();
  }
  var pictureGeometry = null;
  function drawPicture() {
    var s = sec(), P = s.picture, rows = P.grid[0], cols = P.grid[1];
    var cell = Math.max(8, Math.min(40, Math.floor(560 / Math.max(rows, cols))));
    var width = cols * cell, height = rows * cell, ctx = sizedCanvas($("av-picture"), width, height);
    if (photo && photo.complete && photo.naturalWidth) ctx.drawImage(photo, 0, 0, width, height);
    var row = pictureRow(), top = 0, k;
    for (k = 0; k < row.length; k++) top = Math.max(top, row[k]);
    for (k = 0; k < row.length; k++) {
      var c = viridis(top > 0 ? row[k] / top : 0);
      ctx.fillStyle = "rgba(" + Math.round(c[0]) + "," + Math.round(c[1]) + "," + Math.round(c[2]) + ",0.6)";
      ctx.fillRect((k % cols) * cell, Math.floor(k / cols) * cell, cell, cell);
    }
    var patch = state.pictureQuery || state.picturePinned;
    if (patch) {
      ctx.strokeStyle = "#00e5ff";
      ctx.lineWidth = 2;
      ctx.strokeRect(patch[1] * cell + 1, patch[0] * cell + 1, cell - 2, cell - 2);
    }
    pictureGeometry = { cell: cell, rows: rows, cols: cols, top: top, row: row };
    var q = pictureQuery(), head = state.pictureHead === "mean" ? "mean of the heads" : "head " + state.pictureHead;
    $("av-picture-readout").textContent = "where " + q.name + " looks (layer " + s.layers[state.layer] + ", " + head +
      "); colours from 0 to " + fmt(top) + ", its largest weight on a patch";
  }
  function picturePatchAt(e) {
    var g = pictureGeometry, r = $("av-picture").getBoundingClientRect();
    if (!g) return null;
    var col = Math.floor((e.clientX - r.left) / g.cell), row = Math.floor((e.clientY - r.top) / g.cell);
    return row >= 0 && row < g.rows && col >= 0 && col < g.cols ? [row, col] : null;
  }

  // --- sound: a speech model's capture, its spectrogram, and the frames of the token chosen ---------------
  var S = data.sound;
  var melImage = null;
  state.soundToken = null;  // the row of the cross-attention chosen (the step that wrote a token)
  state.soundHead = "mean";
  function soundRow(r) {  // the weight of cross-attention row r on each frame with sound, this layer
    var s = data.sections[S.cross], row = new Float64Array(S.frames);
    var layer = Math.min(state.layer, s.layers.length - 1), heads = state.soundHead === "mean" ? null : Number(state.soundHead);
    for (var j = 0; j < S.frames; j++) row[j] = heads === null ? meanWeight(s, layer, r, j) : weight(s, layer, heads, r, j);
    return row;
  }
  function soundView() {
    var s = data.sections[S.cross];
    var heads = [["mean", "mean of the heads"]];
    for (var h = 0; h < s.heads; h++) heads.push([h, "head " + h]);
    fillSelect($("av-sound-head"), heads, state.soundHead);
    var box = $("av-sound-tokens");
    if (!box.childElementCount) {
      for (var r = S.first; r < s.R; r++) {
        var b = document.createElement("button");
        b.type = "button";
        b.dataset.row = String(r);
        b.textContent = r + 1 < s.R ? s.rows[r + 1] : S.last;
        b.setAttribute("aria-pressed", "false");
        box.appendChild(b);
      }
    }
    if (state.soundToken === null) state.soundToken = S.first;
    Array.prototype.forEach.call(box.children, function (b) {
      b.setAttribute("aria-pressed", Number(b.dataset.row) === state.soundToken ? "true" : "false");
    });
    if (!melImage) {
      melImage = new Image();
      melImage.onload = function () { if (state.view === "sound") drawSound(); };
      melImage.setAttribute("src", "data:image/png;base64," + S.mel);  // the capture's own spectrogram
      $("av-audio").setAttribute("src", "data:audio/wav;base64," + S.wav);  // its own sound: nothing is fetched
    }
    drawSound();
  }
  var soundGeometry = null;
  function drawSound() {
    var width = Math.max(320, Math.min(960, S.frames * 6)), height = 200;
    var ctx = sizedCanvas($("av-sound"), width, height), column = width / S.frames;
    if (melImage && melImage.complete && melImage.naturalWidth) ctx.drawImage(melImage, 0, 0, width, height);
    var row = soundRow(state.soundToken), top = 0, j, first = -1, last = -1;
    for (j = 0; j < row.length; j++) top = Math.max(top, row[j]);
    for (j = 0; j < row.length; j++) {
      var share = top > 0 ? row[j] / top : 0, x0 = Math.round(j * column), x1 = Math.round((j + 1) * column);
      ctx.fillStyle = "rgba(0,0,0," + (0.7 * (1 - share)).toFixed(3) + ")";  // what the step does not look at is dimmed
      ctx.fillRect(x0, 0, x1 - x0, height);
      if (share >= 0.5) { if (first < 0) first = j; last = j; }
    }
    ctx.fillStyle = "#ffffff";  // the time axis, every half second
    ctx.font = "11px sans-serif";
    for (var t = 0.5; t < S.frames * S.frameSeconds; t += 0.5) {
      var tx = Math.round(t / S.frameSeconds * column);
      ctx.fillRect(tx, height - 6, 1, 6);
      ctx.fillText(t.toFixed(1) + " s", tx + 2, height - 8);
    }
    var audio = $("av-audio");
    if (audio && audio.currentTime > 0) {
      ctx.strokeStyle = "#00e5ff";
      ctx.lineWidth = 2;
      var x = audio.currentTime / (S.frames * S.frameSeconds) * width;
      ctx.beginPath(); ctx.moveTo(x, 0); ctx.lineTo(x, height); ctx.stroke();
    }
    soundGeometry = { column: column, first: first, last: last };
    var s = data.sections[S.cross], r = state.soundToken, word = r + 1 < s.R ? s.rows[r + 1] : S.last;
    var sum = 0;
    for (j = 0; j < row.length; j++) sum += row[j];
    $("av-sound-readout").textContent = "writing " + word + " (layer " + s.layers[Math.min(state.layer, s.layers.length - 1)] +
      "): most weight at " + (first * S.frameSeconds).toFixed(2) + "–" + ((last + 1) * S.frameSeconds).toFixed(2) +
      " s; " + (100 * sum).toFixed(0) + "% of its weight on the sound, the rest on the silence after it";
  }
  function playFrom(start, stop) {
    var audio = $("av-audio");
    audio.currentTime = start;
    state.soundStop = stop;
    var played = audio.play();
    if (played && played.catch) played.catch(function () { /* no sound device: the highlight stays */ });
  }

  // --- patching: each head and position patched, and the chosen head's α on both prompts -----------------
  var P = data.patching;
  if (P) {
    state.pHead = P.top.length ? [P.top[0].layer, P.top[0].head] : [0, 0];
    state.pWhere = "residual";
    state.pCursor = null;
  }
  function pValue(name, l, c) { return P[name][l * (name === "heads" ? P.H : P.A) + c]; }
  function diverging(v) {  // RdBu reversed, centred on 0: blue below, white at 0, red above (edge: ±P.edge)
    var t = Math.max(-1, Math.min(1, v / P.edge)), a = t < 0 ? [33, 102, 172] : [178, 24, 43];
    var f = Math.abs(t);
    return "rgb(" + Math.round(255 + (a[0] - 255) * f) + "," + Math.round(255 + (a[1] - 255) * f) + "," +
      Math.round(255 + (a[2] - 255) * f) + ")";
  }
  var pGeometry = {};
  function drawDiverging(id, rows, cols, value, colLabels, mark, rowNames) {
    // rows × cols cells coloured by value(r, c); layer numbers down the left, colLabels (or head numbers) on top
    var cell = Math.max(8, Math.min(28, Math.floor(560 / Math.max(cols, 1)), Math.floor(560 / Math.max(rows, 1))));
    var left = 34, top = colLabels ? 110 : 22, width = left + cols * cell + 4, height = top + rows * cell + 4;
    var ctx = sizedCanvas($(id), width, height);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, width, height);
    for (var r = 0; r < rows; r++) for (var c = 0; c < cols; c++) {
      ctx.fillStyle = diverging(value(r, c));
      ctx.fillRect(left + c * cell, top + r * cell, cell, cell);
    }
    ctx.fillStyle = "#222";
    ctx.font = "10px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    var every = Math.ceil(12 / cell);
    for (r = 0; r < rows; r += every) ctx.fillText(rowNames ? rowNames[r] : String(r), left - 4, top + r * cell + cell / 2);
    for (c = 0; c < cols; c++) {
      ctx.save();
      ctx.translate(left + c * cell + cell / 2, top - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(colLabels ? colLabels[c].slice(0, 16) : String(c), 0, 0);
      ctx.restore();
    }
    if (mark) {
      ctx.strokeStyle = "#111";
      ctx.lineWidth = 2;
      ctx.strokeRect(left + mark[1] * cell, top + mark[0] * cell, cell, cell);
    }
    pGeometry[id] = { left: left, top: top, cell: cell, rows: rows, cols: cols };
  }
  function pCellAt(id, e) {
    var g = pGeometry[id], r = $(id).getBoundingClientRect();
    if (!g) return null;
    var c = Math.floor((e.clientX - r.left - g.left) / g.cell), row = Math.floor((e.clientY - r.top - g.top) / g.cell);
    return row >= 0 && row < g.rows && c >= 0 && c < g.cols ? [row, c] : null;
  }
  function pWhereName() {
    return state.pWhere === "head" ? "head " + state.pHead[0] + "." + state.pHead[1] + " at one position at a time" :
      state.pWhere === "attention" ? "each layer's attention output at one position (layers down)" :
      "the residual stream entering each layer at one position (layers down)";
  }
  function patchView() {
    var restored = "restored: 0 is the corrupted run, 1 the clean one (" + P.direction + ")";
    $("av-p-hint").textContent = P.metric + ": clean " + P.cleanDiff.toFixed(3) + ", corrupted " +
      P.corruptDiff.toFixed(3) + "; " + restored + ". Colours from " + (-P.edge).toFixed(2) + " (blue) through 0 " +
      "(white) to " + P.edge.toFixed(2) + " (red). Choose a head (click, or the arrow keys and Enter) to see its " +
      "attention on both prompts.";
    drawDiverging("av-p-heads", P.L, P.H, function (l, h) { return pValue("heads", l, h); }, null, state.pHead);
    var options = [["residual", "residual stream"], ["attention", "attention output"]];
    if (P.headPositions) options.push(["head", "the chosen head"]);
    fillSelect($("av-p-where"), options, state.pWhere);
    $("av-p-where-title").textContent = pWhereName();
    if (state.pWhere === "head") {
      var h = state.pHead;
      drawDiverging("av-p-positions", 1, P.A, function (r, c) {
        return P.headPositions[(h[0] * P.H + h[1]) * P.A + c]; }, P.labels, null, [h[0] + "." + h[1]]);
    } else {
      drawDiverging("av-p-positions", P.L, P.A, function (l, c) { return pValue(state.pWhere, l, c); }, P.labels);
    }
    var body = $("av-p-top").tBodies[0];
    body.textContent = "";
    P.top.forEach(function (t, n) {
      var tr = el("tr"), b = el("button", t.layer + "." + t.head);
      b.type = "button";
      b.dataset.layer = t.layer;
      b.dataset.head = t.head;
      b.setAttribute("aria-pressed", t.layer === state.pHead[0] && t.head === state.pHead[1] ? "true" : "false");
      tr.appendChild(el("td", String(n + 1)));
      var td = el("td");
      td.appendChild(b);
      tr.appendChild(td);
      tr.appendChild(el("td", (t.score >= 0 ? "+" : "") + t.score.toFixed(3)));
      body.appendChild(tr);
    });
    drawPatterns();
  }
  function drawPatterns() {
    var l = state.pHead[0], h = state.pHead[1];
    $("av-p-pattern-title").textContent = "Head " + l + "." + h + " (restored " +
      pValue("heads", l, h).toFixed(3) + "): its attention on the clean prompt and on the corrupted one";
    [["av-p-clean", 0], ["av-p-corrupt", 1]].forEach(function (pair) {
      var s = data.sections[pair[1]], li = s.layers.indexOf(l);
      var cell = Math.max(6, Math.min(22, Math.floor(360 / s.R))), margin = cell >= 10 ? 110 : 4;
      var ctx = sizedCanvas($(pair[0]), margin + s.C * cell + 4, margin + s.R * cell + 4);
      ctx.fillStyle = "#fff";
      ctx.fillRect(0, 0, margin + s.C * cell + 4, margin + s.R * cell + 4);
      for (var i = 0; i < s.R; i++) for (var j = 0; j < s.C; j++) {
        if (li < 0 || !shown(s, i, j, li)) { ctx.fillStyle = "#eeeeee"; }
        else { var c = viridis(weight(s, li, h, i, j));
          ctx.fillStyle = "rgb(" + Math.round(c[0]) + "," + Math.round(c[1]) + "," + Math.round(c[2]) + ")"; }
        ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
      }
      if (margin > 4) axisLabels(ctx, s.rows, s.cols, margin, cell, Math.min(11, cell - 1), 14);
    });
  }
  function choosePatchHead(l, h) {
    state.pHead = [l, h];
    patchView();
  }
  function patchReadout(text) { $("av-p-readout").textContent = text; }

  // --- views and events ---------------------------------------------------------------------------
  var hasPicture = data.sections.length === 1 && !!data.sections[0].picture;
  var TABS = ["head", "model", "matrix"].concat(C ? ["contrib"] : [], P ? ["patch"] : [], hasPicture ? ["picture"] : [],
    S ? ["sound"] : []);
  function showView(name) {
    state.view = name;
    TABS.forEach(function (t) {
      var tab = $("av-tab-" + t), on = t === name;
      tab.setAttribute("aria-selected", on ? "true" : "false");
      tab.tabIndex = on ? 0 : -1;
      $("av-" + t + "-view").hidden = !on;
    });
    $("av-layer").parentElement.hidden = name === "contrib" || name === "patch";  // these show every layer at once
    if (data.sections.length > 1) $("av-part-label").hidden = name === "patch";  // and both prompts
    render();
  }
  function render() {
    if (state.view === "head") headView();
    else if (state.view === "model") modelView();
    else if (state.view === "contrib") contribView();
    else if (state.view === "patch") patchView();
    else if (state.view === "picture") pictureView();
    else if (state.view === "sound") soundView();
    else matrixView();
    tellHeight();
  }
  // In a notebook the page is a sandboxed frame: it tells the notebook how tall it is, so that the frame fits
  // it (the notebook's few lines beside the frame listen; nothing else is sent, and nothing is received).
  function tellHeight() {
    if (window.parent === window) return;
    var height = Math.ceil(document.getElementById("attnviz-viewer").getBoundingClientRect().height);
    if (height > 0) window.parent.postMessage({ attnvizHeight: height + 24 }, "*");
  }
  if (window.parent !== window && typeof ResizeObserver === "function") {  // and again whenever it changes size
    new ResizeObserver(tellHeight).observe(document.getElementById("attnviz-viewer"));
  }
  function wire() {
    TABS.forEach(function (t, n) {
      var tab = $("av-tab-" + t);
      tab.addEventListener("click", function () { showView(t); });
      tab.addEventListener("keydown", function (e) {
        if (e.key !== "ArrowRight" && e.key !== "ArrowLeft") return;
        var next = TABS[(n + (e.key === "ArrowRight" ? 1 : TABS.length - 1)) % TABS.length];
        showView(next);
        $("av-tab-" + next).focus();
        e.preventDefault();
      });
    });
    $("av-part").addEventListener("change", function (e) {
      state.section = Number(e.target.value);
      state.layer = 0;
      state.heads = firstHeads();
      state.focus = null;
      state.picked = { side: null, indices: [] };
      state.matrixHead = "mean";
      controls();
      render();
    });
    $("av-layer").addEventListener("change", function (e) { state.layer = Number(e.target.value); render(); });
    $("av-matrix-head").addEventListener("change", function (e) { state.matrixHead = e.target.value; render(); });
    $("av-head-toggles").addEventListener("click", function (e) {
      var b = e.target.closest("button");
      if (!b) return;
      var h = Number(b.dataset.head);
      if (state.heads.has(h)) state.heads.delete(h); else state.heads.add(h);
      b.setAttribute("aria-pressed", state.heads.has(h) ? "true" : "false");
      drawLines();
    });
    $("av-all-heads").addEventListener("click", function () { state.heads = allHeads(); controls(); drawLines(); });
    $("av-no-heads").addEventListener("click", function () { state.heads = new Set(); controls(); drawLines(); });
    ["av-left", "av-right"].forEach(function (id) {
      var list = $(id);
      list.addEventListener("mouseover", function (e) { setFocus(e.target.closest("li")); });
      list.addEventListener("focusin", function (e) { setFocus(e.target.closest("li")); });
      list.addEventListener("mouseleave", function () { if (!list.contains(document.activeElement)) setFocus(null); });
      list.addEventListener("focusout", function (e) { if (!list.contains(e.relatedTarget)) setFocus(null); });
      list.addEventListener("click", function (e) { pick(e.target, e.shiftKey); });
      list.addEventListener("keydown", function (e) {
        var li = e.target.closest("li");
        if (li && e.key === "Enter") { pick(li, e.shiftKey); e.preventDefault(); return; }
        if (e.key === "Escape") { pick(null, false); e.preventDefault(); return; }
        if (!li || (e.key !== "ArrowDown" && e.key !== "ArrowUp")) return;
        var next = e.key === "ArrowDown" ? li.nextElementSibling : li.previousElementSibling;
        if (next) next.focus();
        e.preventDefault();
      });
    });
    $("av-thumbs").addEventListener("click", function (e) {
      var b = e.target.closest("button");
      if (b) openHead(Number(b.dataset.layer), Number(b.dataset.head));
    });
    if (hasPicture) {
      $("av-tab-picture").hidden = false;
      var canvas = $("av-picture");
      canvas.addEventListener("mousemove", function (e) {
        var at = picturePatchAt(e);
        if (at && (!state.pictureQuery || at[0] !== state.pictureQuery[0] || at[1] !== state.pictureQuery[1])) {
          state.pictureQuery = at;
          drawPicture();
        }
      });
      canvas.addEventListener("mouseleave", function () { state.pictureQuery = null; drawPicture(); });
      canvas.addEventListener("click", function (e) { state.picturePinned = picturePatchAt(e); drawPicture(); });
      canvas.addEventListener("keydown", function (e) {
        var g = pictureGeometry, moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
        if (!g) return;
        if (e.key === "Escape") { state.pictureQuery = null; state.picturePinned = null; drawPicture(); e.preventDefault(); return; }
        if (e.key === "Enter") { state.picturePinned = state.pictureQuery || state.picturePinned; drawPicture(); e.preventDefault(); return; }
        var m = moves[e.key];
        if (!m) return;
        var at = state.pictureQuery || state.picturePinned || [0, 0];
        state.pictureQuery = [Math.max(0, Math.min(g.rows - 1, at[0] + m[0])), Math.max(0, Math.min(g.cols - 1, at[1] + m[1]))];
        drawPicture();
        e.preventDefault();
      });
      $("av-picture-head").addEventListener("change", function (e) { state.pictureHead = e.target.value; drawPicture(); });
    }
    if (S) {
      $("av-tab-sound").hidden = false;
      $("av-sound-tokens").addEventListener("click", function (e) {
        var b = e.target.closest("button");
        if (!b) return;
        state.soundToken = Number(b.dataset.row);
        soundView();
        var g = soundGeometry;
        if (g && g.first >= 0) playFrom(g.first * S.frameSeconds, (g.last + 1) * S.frameSeconds);
        b.focus();
      });
      $("av-sound-head").addEventListener("change", function (e) { state.soundHead = e.target.value; drawSound(); });
      $("av-sound").addEventListener("click", function (e) {
        var r = $("av-sound").getBoundingClientRect(), g = soundGeometry;
        if (g) playFrom(Math.max(0, (e.clientX - r.left) / g.column) * S.frameSeconds, null);
      });
      $("av-audio").addEventListener("timeupdate", function () {
        var audio = $("av-audio");
        if (state.soundStop !== null && state.soundStop !== undefined && audio.currentTime >= state.soundStop) {
          audio.pause();
          state.soundStop = null;
        }
        if (state.view === "sound") drawSound();
      });
    }
    if (C) {
      $("av-tab-contrib").hidden = false;
      $("av-c-tokens").addEventListener("click", function (e) {
        var b = e.target.closest("button");
        if (!b) return;
        state.cToken = Number(b.dataset.token);
        contribView();
        b.focus();
      });
      $("av-c-threshold").addEventListener("input", function (e) {
        state.cThreshold = Number(e.target.value);
        $("av-c-threshold-value").textContent = state.cThreshold.toFixed(2);
        drawGraph(sec().rows);
      });
    }
    if (P) {
      $("av-tab-patch").hidden = false;
      var heads = $("av-p-heads"), where = $("av-p-positions");
      heads.addEventListener("mousemove", function (e) {
        var at = pCellAt("av-p-heads", e);
        if (at) patchReadout("head " + at[0] + "." + at[1] + ": restored " + pValue("heads", at[0], at[1]).toFixed(4));
      });
      heads.addEventListener("click", function (e) {
        var at = pCellAt("av-p-heads", e);
        if (at) choosePatchHead(at[0], at[1]);
      });
      heads.addEventListener("keydown", function (e) {
        var moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
        var at = state.pCursor || state.pHead.slice();
        if (e.key === "Enter") { choosePatchHead(at[0], at[1]); heads.focus(); e.preventDefault(); return; }
        var m = moves[e.key];
        if (!m) return;
        state.pCursor = [Math.max(0, Math.min(P.L - 1, at[0] + m[0])), Math.max(0, Math.min(P.H - 1, at[1] + m[1]))];
        patchReadout("head " + state.pCursor[0] + "." + state.pCursor[1] + ": restored " +
          pValue("heads", state.pCursor[0], state.pCursor[1]).toFixed(4) + " (Enter chooses it)");
        drawDiverging("av-p-heads", P.L, P.H, function (l, h) { return pValue("heads", l, h); }, null, state.pCursor);
        e.preventDefault();
      });
      where.addEventListener("mousemove", function (e) {
        var at = pCellAt("av-p-positions", e);
        if (!at) return;
        var pair = P.pairs[at[1]], v = state.pWhere === "head" ?
          P.headPositions[(state.pHead[0] * P.H + state.pHead[1]) * P.A + at[1]] : pValue(state.pWhere, at[0], at[1]);
        patchReadout((state.pWhere === "head" ? "head " + state.pHead[0] + "." + state.pHead[1] : "layer " + at[0]) +
          ", position " + pair[0] + (pair[0] === pair[1] ? "" : " (corrupted " + pair[1] + ")") + " “" +
          P.labels[at[1]] + "”: restored " + v.toFixed(4));
      });
      $("av-p-where").addEventListener("change", function (e) { state.pWhere = e.target.value; patchView(); });
      $("av-p-top").addEventListener("click", function (e) {
        var b = e.target.closest("button");
        if (b) choosePatchHead(Number(b.dataset.layer), Number(b.dataset.head));
      });
    }
    var matrix = $("av-matrix");
    matrix.addEventListener("mousemove", function (e) {
      var g = matrixGeometry, s = sec();
      if (!g) return;
      var r = matrix.getBoundingClientRect();
      var j = Math.floor((e.clientX - r.left - g.margin) / g.cell), i = Math.floor((e.clientY - r.top - g.margin) / g.cell);
      if (i >= 0 && i < s.R && j >= 0 && j < s.C) readout(i, j);
    });
    matrix.addEventListener("focus", function () { matrixView(); });
    matrix.addEventListener("blur", function () { matrixView(); });
    matrix.addEventListener("keydown", function (e) {
      var s = sec(), moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
      var m = moves[e.key];
      if (!m) return;
      state.cursor = [Math.max(0, Math.min(s.R - 1, state.cursor[0] + m[0])),
        Math.max(0, Math.min(s.C - 1, state.cursor[1] + m[1]))];
      matrixView();
      e.preventDefault();
    });
  }
  function allHeads() {
    var set = new Set();
    for (var h = 0; h < sec().heads; h++) set.add(h);
    return set;
  }
  function firstHeads() {  // one head to start, the layer's sharpest (lowest entropy over its rows): every head
    var s = sec(), best = 0, lowest = Infinity;  // at once is a tangle of lines; "all" turns them on
    for (var h = 0; h < s.heads; h++) {
      var entropy = 0;
      for (var i = 0; i < s.R; i++) for (var j = 0; j < s.C; j++) {
        var w = shown(s, i, j) ? weight(s, state.layer, h, i, j) : 0;
        if (w > 0) entropy -= w * Math.log(w);
      }
      if (entropy < lowest) { lowest = entropy; best = h; }
    }
    return new Set([best]);
  }

  header();
  state.heads = firstHeads();
  controls();
  wire();
  showView("head");
  window.attnvizViewer = {
    state: state,
    drawnLines: function () { return state.drawn; },
    matrix: function () { return matrixGeometry; },
    openHead: openHead,
    showView: showView,
    contribution: function (l, i, j) { return contribution(l, i, j); },
    strongestPaths: function (token, top) { return strongestPaths(token, top); },
    patchValue: function (name, l, c) { return pValue(name, l, c); },
    choosePatchHead: function (l, h) { choosePatchHead(l, h); },
    pictureRow: function () { return Array.from(pictureRow()); },
    soundRow: function () { return Array.from(soundRow(state.soundToken)); },
    weight: function (section, li, h, i, j) { return weight(data.sections[section], li, h, i, j); },
    readyAt: performance.now()
  };
  document.documentElement.dataset.attnvizReady = "1";
  // the first frame with the head view on screen: the next animation frame, then the task after it
  requestAnimationFrame(function () { setTimeout(function () {
    window.attnvizViewer.paintedAt = performance.now();
    document.documentElement.dataset.attnvizPainted = "1";
  }, 0); });
})();
