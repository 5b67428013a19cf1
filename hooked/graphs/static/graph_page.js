// hooked's attribution graph page (hooked/graphs/page.py writes the data and says what it holds). Cytoscape.js
// draws and lays out the graph; this script only re-filters it when a slider moves (the last step of
// hooked/graphs/prune.py, dropping nodes left without edges), fills the side panel, pins nodes and traces the
// strongest path into a clicked logit (hooked/graphs/paths.py's strengths).
(function () {
  "use strict";
  const times = { start: performance.now() }; // milliseconds since navigation began: benchmarks/graph_page.py
  const data = JSON.parse(document.getElementById("graph-data").textContent);
  times.parsed = performance.now();
  const nodes = data.nodes;
  const N = nodes.length;
  const position = new Map(nodes.map((node, k) => [node.i, k])); // graph index -> index into nodes
  const labelOf = (i) => (position.has(i) ? nodes[position.get(i)].label : data.labels[String(i)]);

  const source = Int32Array.from(data.edges.source, (i) => position.get(i));
  const target = Int32Array.from(data.edges.target, (i) => position.get(i));
  const weight = Float64Array.from(data.edges.weight);
  const E = weight.length;
  const cuts = data.grid.cuts.map((text) => {
    const bytes = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
    return new Float32Array(bytes.buffer);
  });
  const droppable = nodes.map((node) => node.i < data.token_offset); // features and errors need an outgoing edge
  const needsInput = nodes.map((node) => node.i < data.n_features); // features need an incoming one too
  const share = Float64Array.from(weight, (w, e) => Math.abs(w) / Math.max(nodes[target[e]].input, 1e-10));
  const outEdges = nodes.map(() => []);
  for (let e = 0; e < E; e++) outEdges[source[e]].push(e);
  const byDepth = Array.from({ length: E }, (_, e) => e).sort(
    (a, b) => nodes[source[b]].depth - nodes[source[a]].depth,
  );
  let largest = 0;
  for (let e = 0; e < E; e++) largest = Math.max(largest, Math.abs(weight[e]));

  const state = {
    grid: data.start.node_threshold,
    edgeThreshold: data.start.edge_threshold,
    node: new Uint8Array(N),
    edge: new Uint8Array(E),
    pinned: new Set(),
    pinnedOnly: false,
    selected: null,
    path: [],
  };

  // Graph.prune at (grid node threshold, edge threshold): the grid's nodes, the edges whose cut is below the
  // threshold (float32, as torch compares), then nodes without the edges they need dropped until nothing changes.
  function prune(grid, threshold) {
    const t = Math.fround(threshold);
    const cut = cuts[grid];
    const node = new Uint8Array(N);
    for (const k of data.grid.nodes[grid]) node[k] = 1;
    const edge = new Uint8Array(E);
    for (let e = 0; e < E; e++) edge[e] = cut[e] < t ? 1 : 0;
    for (;;) {
      const hasOut = new Uint8Array(N);
      const hasIn = new Uint8Array(N);
      for (let e = 0; e < E; e++) {
        if (!edge[e]) continue;
        if (!node[source[e]] || !node[target[e]]) edge[e] = 0;
        else hasOut[source[e]] = hasIn[target[e]] = 1;
      }
      let changed = false;
      for (let k = 0; k < N; k++) {
        if (node[k] && ((droppable[k] && !hasOut[k]) || (needsInput[k] && !hasIn[k]))) {
          node[k] = 0;
          changed = true;
        }
      }
      if (!changed) return { node, edge };
    }
  }

  function shortLabel(node) {
    if (node.kind === "token") return data.tokens[node.pos];
    if (node.kind === "logit") return node.label.replace(/^logit /, "");
    return "";
  }

  // The first drawing holds the pruned graph at the starting thresholds; the sliders add and remove edges from it.
  const first = prune(state.grid, state.edgeThreshold);
  state.node = first.node;
  state.edge = first.edge;
  let layoutDone = false;
  let setupDone = false;
  const cy = cytoscape({
    container: document.getElementById("graph"),
    elements: [
      ...nodes.map((node, k) => ({
        group: "nodes",
        data: { id: "n" + node.i, k: k, short: shortLabel(node) },
        position: { x: node.x, y: node.y },
        classes: visible(k) ? node.kind : node.kind + " hidden",
      })),
      ...drawnEdges().map(edgeElement),
    ],
    layout: {
      name: "preset",
      fit: true,
      padding: 30,
      stop: () => {
        layoutDone = true;
        markReady();
      },
    },
    minZoom: 0.05,
    maxZoom: 6,
    style: [
      {
        selector: "node",
        style: {
          width: 12, height: 12, label: "data(short)", "font-size": 9, "text-valign": "bottom",
          "text-margin-y": 2, "min-zoomed-font-size": 5, "border-width": 1, "border-color": "#555",
        },
      },
      { selector: "node.feature", style: { shape: "ellipse", "background-color": "#f2c14e" } },
      { selector: "node.error", style: { shape: "rectangle", "background-color": "#bbbbbb" } },
      { selector: "node.token", style: { shape: "round-rectangle", width: 18, "background-color": "#9ecae1" } },
      {
        selector: "node.logit",
        style: { shape: "diamond", width: 16, height: 16, "background-color": "#a1d99b", "text-valign": "top" },
      },
      { selector: "node.hidden", style: { display: "none" } },
      { selector: "node.pinned", style: { "border-width": 3, "border-color": "#6a3d9a" } },
      { selector: "node.chosen", style: { "border-width": 3, "border-color": "#000" } },
      {
        selector: "edge",
        style: {
          "curve-style": "haystack", "haystack-radius": 0, width: "data(width)",
          "line-color": "data(colour)", opacity: "data(opacity)",
        },
      },
      { selector: ".faded", style: { opacity: 0.1 } },
      { selector: "node.path", style: { "border-width": 3, "border-color": "#ff7f0e", opacity: 1 } },
      { selector: "edge.path", style: { "line-color": "#ff7f0e", opacity: 1, "z-index": 10 } },
    ],
  });

  times.drawn = performance.now();
  const edgeElements = new Map(); // shipped edge index -> its element, while drawn
  cy.edges().forEach((element) => edgeElements.set(element.data("e"), element));

  // The page is ready (window.hookedGraphReady, which the tests and benchmarks/graph_page.py wait for) once
  // Cytoscape's layout has run and the panel is set up.
  function markReady() {
    if (!layoutDone || !setupDone) return;
    times.ready = performance.now();
    window.hookedGraphTimes = times;
    window.hookedGraphReady = true;
  }

  function drawnEdges() {
    const wanted = [];
    for (let e = 0; e < E; e++) if (state.edge[e] && visible(source[e]) && visible(target[e])) wanted.push(e);
    return wanted;
  }
  function edgeElement(e) {
    const strength = largest > 0 ? Math.sqrt(Math.abs(weight[e]) / largest) : 0;
    return {
      group: "edges",
      data: {
        id: "e" + e, source: "n" + nodes[source[e]].i, target: "n" + nodes[target[e]].i, e: e,
        width: 0.5 + 4 * strength, opacity: 0.25 + 0.6 * strength,
        colour: weight[e] > 0 ? "#1f66bf" : "#cc2626",
      },
    };
  }

  const $ = (id) => document.getElementById(id);

  function visible(k) {
    return state.pinnedOnly ? state.pinned.has(k) : state.node[k] === 1 || state.pinned.has(k);
  }

  function refilter() {
    const pruned = prune(state.grid, state.edgeThreshold);
    state.node = pruned.node;
    state.edge = pruned.edge;
    cy.batch(() => {
      // only the elements that change: restyling all of them costs more than the drawing
      cy.nodes().forEach((element) => {
        const hide = !visible(element.data("k"));
        if (element.hasClass("hidden") !== hide) element.toggleClass("hidden", hide);
      });
      const wanted = drawnEdges();
      const keep = new Set(wanted);
      for (const [e, element] of edgeElements) {
        if (!keep.has(e)) {
          element.remove();
          edgeElements.delete(e);
        }
      }
      const added = cy.add(wanted.filter((e) => !edgeElements.has(e)).map(edgeElement));
      added.forEach((element) => edgeElements.set(element.data("e"), element));
    });
    showStatus();
  }

  function showStatus() {
    let nNodes = 0;
    let nEdges = 0;
    for (let k = 0; k < N; k++) nNodes += state.node[k];
    for (let e = 0; e < E; e++) nEdges += state.edge[e];
    const extra = [...state.pinned].filter((k) => !state.node[k]).length;
    const status = $("status");
    status.dataset.nodes = nNodes;
    status.dataset.edges = nEdges;
    status.textContent =
      `${nNodes} nodes, ${nEdges} edges` + (extra ? ` (+${extra} pinned)` : "") + (state.pinnedOnly ? "; pinned only" : "");
    $("node-threshold-value").textContent = data.grid.node_thresholds[state.grid].toFixed(2);
    $("edge-threshold-value").textContent = state.edgeThreshold.toFixed(2);
    if (state.selected !== null && nodes[state.selected].kind === "logit") tracePath(state.selected);
    else showPath([]);
  }

  // The strongest path from a token to logit k over the edges drawn: each edge weighs its share of the target's
  // total |input|, a path the product (hooked/graphs/paths.py); strengths to k from the sources of the deepest
  // edges first, then the best token followed forward.
  function tracePath(k) {
    const drawn = (e) => state.edge[e] && visible(source[e]) && visible(target[e]);
    const toLogit = new Float64Array(N);
    toLogit[k] = 1;
    for (const e of byDepth) {
      if (!drawn(e)) continue;
      const strength = share[e] * toLogit[target[e]];
      if (strength > toLogit[source[e]]) toLogit[source[e]] = strength;
    }
    let start = -1;
    for (let j = 0; j < N; j++) {
      if (nodes[j].kind === "token" && visible(j) && toLogit[j] > 0 && (start < 0 || toLogit[j] > toLogit[start])) {
        start = j;
      }
    }
    const path = [];
    const pathEdges = [];
    if (start >= 0) {
      path.push(start);
      while (path[path.length - 1] !== k) {
        let best = -1;
        for (const e of outEdges[path[path.length - 1]]) {
          if (drawn(e) && (best < 0 || share[e] * toLogit[target[e]] > share[best] * toLogit[target[best]])) best = e;
        }
        pathEdges.push(best);
        path.push(target[best]);
      }
    }
    showPath(path, pathEdges, start >= 0 ? toLogit[start] : 0);
  }

  function showPath(path, pathEdges = [], strength = 0) {
    const hadPath = state.path.length > 0;
    state.path = path;
    cy.batch(() => {
      if (hadPath) cy.elements().removeClass("path faded");
      if (!path.length) return;
      cy.elements().addClass("faded");
      for (const k of path) cy.getElementById("n" + nodes[k].i).removeClass("faded").addClass("path");
      for (const e of pathEdges) edgeElements.get(e).removeClass("faded").addClass("path");
    });
    const box = $("path-box");
    const list = $("path");
    list.replaceChildren();
    const logitSelected = state.selected !== null && nodes[state.selected].kind === "logit";
    box.hidden = !logitSelected;
    if (!logitSelected) return;
    $("path-title").textContent = path.length
      ? `strongest path from a token (strength ${strength.toPrecision(3)})`
      : "no path from a token reaches this logit at these thresholds";
    for (const k of path) list.append(item(nodes[k].i, nodes[k].label));
  }

  function item(i, label) {
    const li = document.createElement("li");
    li.dataset.node = i;
    li.textContent = label;
    li.addEventListener("click", () => position.has(i) && select(position.get(i)));
    return li;
  }

  function edgeRows(table, edges) {
    table.replaceChildren();
    for (const [i, w] of edges) {
      const row = table.insertRow();
      row.dataset.node = i;
      row.dataset.weight = w;
      row.insertCell().textContent = labelOf(i);
      const cell = row.insertCell();
      cell.className = "weight " + (w > 0 ? "positive" : "negative");
      cell.textContent = w.toPrecision(3);
      row.addEventListener("click", () => position.has(i) && select(position.get(i)));
    }
    if (!edges.length) table.insertRow().insertCell().textContent = "none";
  }

  function select(k) {
    state.selected = k;
    const node = nodes[k];
    cy.nodes(".chosen").removeClass("chosen");
    cy.getElementById("n" + node.i).addClass("chosen");
    $("selected").hidden = false;
    $("selected").dataset.node = node.i;
    $("selected-label").textContent = node.label;
    const facts = [`node ${node.i}`, node.kind];
    if (node.layer !== null) facts.push(`layer ${node.layer}`);
    facts.push(`position ${node.pos}`, `influence ${node.influence.toPrecision(3)}`);
    if (node.activation !== undefined) facts.push(`activation ${node.activation.toPrecision(3)}`);
    $("selected-facts").textContent = facts.join(" · ");
    $("pin").textContent = state.pinned.has(k) ? "unpin" : "pin";
    edgeRows($("incoming"), node.in);
    edgeRows($("outgoing"), node.out);

    const acts = $("activations");
    acts.replaceChildren();
    $("activations-box").hidden = !node.acts;
    if (node.acts) {
      const values = new Map(node.acts);
      const top = Math.max(1e-10, ...node.acts.map(([, v]) => Math.abs(v)));
      data.tokens.forEach((token, p) => {
        const span = document.createElement("span");
        const value = values.get(p) || 0;
        span.dataset.position = p;
        span.dataset.activation = value;
        span.title = `position ${p}: ${value.toPrecision(3)}`;
        span.textContent = token;
        span.style.background = `rgba(242, 140, 40, ${(0.85 * Math.abs(value)) / top})`;
        acts.append(span);
      });
    }

    const qk = $("qk");
    qk.replaceChildren();
    $("qk-box").hidden = !node.qk;
    for (const pair of node.qk || []) {
      const row = qk.insertRow();
      row.dataset.contribution = pair.contribution;
      row.insertCell().textContent = pair.query;
      row.insertCell().textContent = "→ " + pair.key;
      const cell = row.insertCell();
      cell.className = "weight " + (pair.contribution > 0 ? "positive" : "negative");
      cell.textContent = pair.contribution.toPrecision(3);
    }
    if (node.kind === "logit") tracePath(k);
    else showPath([]);
  }

  function unselect() {
    state.selected = null;
    cy.nodes(".chosen").removeClass("chosen");
    $("selected").hidden = true;
    showPath([]);
  }

  function togglePin(k) {
    if (state.pinned.has(k)) state.pinned.delete(k);
    else state.pinned.add(k);
    cy.getElementById("n" + nodes[k].i).toggleClass("pinned", state.pinned.has(k));
    const list = $("pinned");
    list.replaceChildren();
    for (const j of state.pinned) {
      const li = item(nodes[j].i, nodes[j].label);
      const button = document.createElement("button");
      button.textContent = "unpin";
      button.addEventListener("click", (event) => {
        event.stopPropagation();
        togglePin(j);
      });
      li.append(button);
      list.append(li);
    }
    if (state.selected !== null) $("pin").textContent = state.pinned.has(state.selected) ? "unpin" : "pin";
    refilter();
  }

  const nodeSlider = $("node-threshold");
  nodeSlider.max = data.grid.node_thresholds.length - 1;
  nodeSlider.value = state.grid;
  nodeSlider.addEventListener("input", () => {
    state.grid = Number(nodeSlider.value);
    refilter();
  });
  const edgeSlider = $("edge-threshold");
  edgeSlider.min = data.edge_range[0];
  edgeSlider.max = data.edge_range[1];
  if (Math.abs(Math.round(state.edgeThreshold * 100) - state.edgeThreshold * 100) > 1e-9) edgeSlider.step = "any";
  edgeSlider.value = state.edgeThreshold;
  edgeSlider.addEventListener("input", () => {
    state.edgeThreshold = parseFloat(edgeSlider.value);
    refilter();
  });
  $("pinned-only").addEventListener("change", (event) => {
    state.pinnedOnly = event.target.checked;
    refilter();
  });
  $("pin").addEventListener("click", () => state.selected !== null && togglePin(state.selected));

  cy.on("mouseover", "node", (event) => {
    $("hover").textContent = nodes[event.target.data("k")].label;
  });
  cy.on("mouseout", "node", () => {
    $("hover").textContent = "\u00a0";
  });
  cy.on("tap", "node", (event) => select(event.target.data("k")));
  cy.on("tap", (event) => event.target === cy && unselect());

  showStatus();
  window.hookedGraph = { cy: cy, state: state, select: (i) => select(position.get(i)), prune: prune };
  setupDone = true;
  markReady();
})();
