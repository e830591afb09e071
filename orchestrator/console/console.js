// The reason console: ask a question and watch it reason (the /reason event stream drawn
// as it arrives), then look up any request's trace (GET /traces/{id}).
//
// Everything on this page that a model or a client wrote (questions, plans, step inputs
// and outputs, answers, log lines) is put into the DOM as text: nodes are made with
// createElement and filled with textContent, never parsed as markup. The server's
// Content-Security-Policy (no inline script) is the second line of defence.
"use strict";

(() => {
  const KEY_STORE = "reason.apiKey"; // sessionStorage: this tab only, never in a URL
  const SVG_NS = "http://www.w3.org/2000/svg";
  const NODE_W = 172;
  const NODE_H = 50;
  const TRACE_ID = /^[0-9a-fA-F]{32}$/;
  const STAGES = ["plan", "solve", "execute", "verify", "contribute"];

  const $ = (id) => document.getElementById(id);
  let config = { auth: false, options: {} };
  let current = null; // the request being drawn: its rounds, plans and nodes
  let selected = null; // {card, stepId}: the node whose details are shown

  // ------------------------------------------------------------------ DOM helpers

  // el("p", {class: "x", text: "..."}, child, ...): every string becomes a text node.
  function el(tag, props, ...children) {
    return fill(document.createElement(tag), props, children);
  }

  function svg(tag, props, ...children) {
    return fill(document.createElementNS(SVG_NS, tag), props, children);
  }

  function fill(node, props, children) {
    for (const [name, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "class") node.setAttribute("class", value);
      else if (name === "text") node.textContent = String(value);
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function ms(value) {
    if (typeof value !== "number" || !isFinite(value)) return "–";
    return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value.toFixed(1)} ms`;
  }

  function num(value, digits = 2) {
    return typeof value === "number" && isFinite(value) ? value.toFixed(digits) : "–";
  }

  function traceLink(id) {
    // ids come from the server, but a link's href is never built from unchecked text
    if (typeof id !== "string" || !TRACE_ID.test(id)) return el("span", { text: String(id) });
    return el("a", { href: `#/trace/${id.toLowerCase()}`, class: "trace-link", text: id });
  }

  // ------------------------------------------------------------------ errors

  // The service's error body, as it says it: type, message, param, retry time, trace.
  function showError(box, status, body, retryAfter) {
    clear(box).hidden = false;
    const error = body && typeof body === "object" && body.error ? body.error : null;
    const head = error ? `${status ? status + " " : ""}${error.type}` : `${status || "error"}`;
    box.append(el("strong", { text: head }));
    box.append(": ", error ? String(error.message) : String(body || "no error body"));
    if (error && error.param) box.append(el("span", { class: "param", text: ` (${error.param})` }));
    if (retryAfter) box.append(el("span", { class: "retry", text: ` Retry in ${retryAfter} s.` }));
    if (body && body.trace_id && TRACE_ID.test(body.trace_id)) {
      box.append(el("span", { class: "trace" }, " Trace ", traceLink(body.trace_id)));
    }
  }

  async function errorFrom(response) {
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = `${response.status} ${response.statusText} (the reply was not the error body)`;
    }
    return { status: response.status, body, retryAfter: response.headers.get("retry-after") };
  }

  // ------------------------------------------------------------------ auth

  function authHeaders() {
    if (!config.auth) return {};
    const key = $("api_key").value.trim();
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  function setUpAuth() {
    const row = $("auth-row");
    row.hidden = !config.auth;
    const input = $("api_key");
    if (!config.auth) return;
    input.value = sessionStorage.getItem(KEY_STORE) || "";
    input.addEventListener("input", () => {
      if (input.value) sessionStorage.setItem(KEY_STORE, input.value);
      else sessionStorage.removeItem(KEY_STORE);
    });
  }

  // ------------------------------------------------------------------ options

  function setUpOptions() {
    const opts = config.options || {};
    for (const name of ["n_plans", "deadline_s"]) {
      const input = $(name);
      const schema = opts[name] || {};
      if (schema.minimum !== undefined) input.min = schema.minimum;
      if (schema.maximum !== undefined) input.max = schema.maximum;
      input.step = schema.type === "integer" ? "1" : "any";
      if (schema.default !== undefined) input.value = schema.default;
    }
    for (const name of ["verify", "use_cache", "contributions"]) {
      const schema = opts[name] || {};
      $(name).checked = schema.default !== undefined ? Boolean(schema.default) : name !== "contributions";
    }
  }

  function readOptions() {
    const options = { verify: $("verify").checked, use_cache: $("use_cache").checked };
    if ($("contributions").checked) options.contributions = true;
    for (const name of ["n_plans", "deadline_s"]) {
      const raw = $(name).value.trim();
      // what was typed goes to the service as is: its validation error is the one shown
      if (raw !== "") options[name] = Number(raw);
      else if ($(name).validity.badInput) options[name] = raw;
    }
    return options;
  }

  // ------------------------------------------------------------------ the stream

  // Server-sent events over fetch: EventSource can neither POST a body nor send an
  // Authorization header, so the frames are parsed here (WHATWG "event stream
  // interpretation": `event:` and `data:` lines, a blank line ends an event).
  async function* readEvents(response) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = "message";
        const data = [];
        for (const line of frame.split("\n")) {
          if (line.startsWith("event:")) name = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        }
        if (data.length) yield { name, data: JSON.parse(data.join("\n")) };
      }
    }
  }

  async function ask(event) {
    event.preventDefault();
    // one request at a time: Enter submits the form even while the button is disabled,
    // and a second stream would draw its events into the first one's graphs
    if ($("ask").disabled) return;
    const question = $("question").value.trim();
    const errorBox = $("ask-error");
    errorBox.hidden = true;
    if (!question) {
      showError(errorBox, null, "write a question first");
      $("question").focus();
      return;
    }
    startDrawing();
    const button = $("ask");
    button.disabled = true;
    $("busy").textContent = "Working…";
    try {
      // events=all: the rounds and each plan as it is made, not only the steps
      const response = await fetch("reason?events=all", {
        method: "POST",
        headers: {
          "Content-Type": "application/json",
          Accept: "text/event-stream",
          ...authHeaders(),
        },
        body: JSON.stringify({ question, options: readOptions() }),
      });
      const type = response.headers.get("content-type") || "";
      if (!response.ok || !type.startsWith("text/event-stream")) {
        const { status, body, retryAfter } = await errorFrom(response);
        showError(errorBox, status, body, retryAfter);
        return;
      }
      let ended = false;
      for await (const { name, data } of readEvents(response)) {
        if (name === "error") {
          // the status and retry time the JSON answer would have had come with it
          showError(errorBox, data.status, data, data.retry_after_s);
          ended = true;
        } else if (name === "result") {
          drawResult(data);
          ended = true;
        } else if (handlers[name]) {
          handlers[name](data);
        }
      }
      if (!ended) showError(errorBox, null, "the stream ended before the answer came");
    } catch (err) {
      showError(errorBox, null, `cannot reach the orchestrator (${err && err.message})`);
    } finally {
      button.disabled = false;
      $("busy").textContent = "";
    }
  }

  function startDrawing() {
    clear($("rounds"));
    clear($("result")).hidden = true;
    current = { rounds: new Map(), cards: new Map() };
    selected = null;
  }

  const handlers = {
    round_start(data) {
      roundSection(data.round, data.replan_for);
    },
    plan(data) {
      const round = roundSection(data.round, null);
      const card = planCard(data, `Plan ${data.plan + 1}`, `r${data.round}p${data.plan}`);
      current.cards.set(`${data.round}.${data.plan}`, card);
      round.grid.append(card.root);
    },
    step(data) {
      const card = current.cards.get(`${data.round}.${data.plan}`);
      if (card) updateStep(card, data);
    },
    round_end(data) {
      const round = roundSection(data.round, data.replan_for);
      drawRoundEnd(round, data);
    },
  };

  function roundSection(number, replanFor) {
    const existing = current.rounds.get(number);
    if (existing) return existing;
    const title = el("h3", { text: `Round ${number}` });
    if (replanFor) title.append(el("span", { class: "tag", text: `replanned: ${replanFor}` }));
    const summary = el("p", { class: "round-summary", text: "drawing plans…" });
    const grid = el("div", { class: "plans" });
    const root = el("section", { class: "round", "aria-label": `Round ${number}` }, title, summary, grid);
    $("rounds").append(root);
    const round = { root, summary, grid, number };
    current.rounds.set(number, round);
    return round;
  }

  function drawRoundEnd(round, data) {
    clear(round.summary);
    if (data.error) {
      round.summary.classList.add("failed");
      round.summary.append(`This round failed: ${data.error} (${ms(data.ms)}).`);
      return;
    }
    const answer = data.answer === null ? "no answer" : data.answer;
    round.summary.append(
      el("strong", { text: `${data.agreeing} of ${data.samples}` }),
      " agree on ",
      el("code", { class: "answer-inline", text: answer }),
      ` · ${data.verdict} · confidence ${num(data.confidence)} · ${ms(data.ms)}`,
    );
    if (data.replan_reasons && data.replan_reasons.length) {
      round.summary.append(` · would replan for: ${data.replan_reasons.join(", ")}`);
    }
    const prose = [];
    for (const vote of data.votes || []) {
      if (vote.plan === null || vote.plan === undefined) {
        prose.push(vote);
        continue;
      }
      const card = current.cards.get(`${data.round}.${vote.plan}`);
      if (card) drawVote(card, vote);
    }
    if (prose.length) {
      const list = el("ul", { class: "prose-votes" });
      for (const vote of prose) {
        list.append(
          el(
            "li",
            { class: vote.agrees ? "agrees" : "disagrees" },
            "worked solution: ",
            el("code", { text: vote.answer === null ? "no answer" : vote.answer }),
            vote.verifier !== null && vote.verifier !== undefined ? ` · verifier ${num(vote.verifier)}` : "",
          ),
        );
      }
      round.root.insertBefore(list, round.grid);
    }
  }

  function drawVote(card, vote) {
    clear(card.vote);
    card.root.classList.toggle("agrees", vote.agrees);
    card.root.classList.toggle("disagrees", !vote.agrees);
    card.vote.append(
      "answer ",
      el("code", { class: "answer-inline", text: vote.answer === null ? "none" : vote.answer }),
      el("span", { class: vote.agrees ? "mark ok" : "mark no", text: vote.agrees ? " agrees with the vote" : " outvoted" }),
      vote.verifier !== null && vote.verifier !== undefined
        ? ` · verifier ${num(vote.verifier)}`
        : " · verifier not asked",
    );
  }

  // ------------------------------------------------------------------ a plan as a graph

  function planCard(plan, label, uid) {
    const steps = Array.isArray(plan.steps) ? plan.steps : [];
    const root = el("article", { class: "plan", "aria-label": label });
    root.append(el("h4", { text: label }));
    if (plan.reasoning) root.append(el("p", { class: "reasoning", text: plan.reasoning }));
    const card = { root, plan, nodes: new Map(), results: new Map(), detail: null, vote: null };
    root.append(drawGraph(card, steps, plan.answer_step, uid));
    card.vote = el("p", { class: "vote", text: "running…" });
    card.detail = el("div", { class: "detail", "aria-live": "polite" });
    card.detail.append(el("p", { class: "hint", text: "Select a step (Tab, then Enter) to see it." }));
    root.append(card.vote, card.detail);
    return card;
  }

  function drawGraph(card, steps, answerStep, uid) {
    const ids = new Set(steps.map((s) => s.id));
    const g = new dagre.graphlib.Graph();
    g.setGraph({ rankdir: "TB", nodesep: 20, ranksep: 34, marginx: 6, marginy: 6 });
    g.setDefaultEdgeLabel(() => ({}));
    for (const step of steps) g.setNode(step.id, { width: NODE_W, height: NODE_H });
    for (const step of steps) {
      for (const dep of step.depends_on || []) if (ids.has(dep)) g.setEdge(dep, step.id);
    }
    dagre.layout(g);
    const { width, height } = g.graph();
    const marker = `arrow-${uid}`;
    const root = svg("svg", {
      class: "dag",
      viewBox: `0 0 ${Math.ceil(width)} ${Math.ceil(height)}`,
      role: "group",
      "aria-label": `${steps.length} steps; arrows point from a step to the steps that use it`,
    });
    root.style.maxWidth = `${Math.ceil(width)}px`;
    root.append(
      svg(
        "defs",
        {},
        svg(
          "marker",
          { id: marker, viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto" },
          svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }),
        ),
      ),
    );
    for (const edge of g.edges()) {
      const points = g.edge(edge).points || [];
      const d = points.map((p, i) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
      root.append(svg("path", { d, class: "edge", "marker-end": `url(#${marker})` }));
    }
    for (const step of steps) {
      const pos = g.node(step.id);
      const isAnswer = step.id === answerStep;
      const status = svg("text", { x: 10, y: 38, class: "node-status", text: "pending" });
      const node = svg(
        "g",
        {
          class: `node pending${isAnswer ? " answer" : ""}`,
          transform: `translate(${(pos.x - NODE_W / 2).toFixed(1)},${(pos.y - NODE_H / 2).toFixed(1)})`,
          tabindex: "0",
          role: "button",
          "data-step": step.id,
        },
        svg("rect", { width: NODE_W, height: NODE_H, rx: 7 }),
        svg("text", { x: 10, y: 19, class: "node-title", text: `${step.id} · ${step.tool}` }),
        status,
        isAnswer ? svg("text", { x: NODE_W - 10, y: 19, class: "node-answer", "text-anchor": "end", text: "answer" }) : null,
      );
      node.setAttribute("aria-label", nodeLabel(step, null, isAnswer));
      const show = () => select(card, step.id);
      node.addEventListener("click", show);
      node.addEventListener("focus", show);
      node.addEventListener("keydown", (e) => {
        if (e.key === "Enter" || e.key === " ") {
          e.preventDefault();
          show();
          card.detail.scrollIntoView({ block: "nearest" });
        }
      });
      card.nodes.set(step.id, { node, status, step, isAnswer });
    }
    // nodes after the edges, so that arrows run under them
    for (const { node } of card.nodes.values()) root.append(node);
    return root;
  }

  function nodeLabel(step, result, isAnswer) {
    const parts = [`step ${step.id}`, step.tool, result ? result.status : "pending"];
    if (result && result.source) parts.push(`from ${result.source}`);
    if (isAnswer) parts.push("the answer step");
    if (result && result.contribution && result.contribution.contributes === false) {
      parts.push("contributes nothing to the answer");
    }
    return parts.join(", ");
  }

  function updateStep(card, result) {
    const entry = card.nodes.get(result.id);
    if (!entry) return;
    card.results.set(result.id, result);
    const classes = ["node", result.status];
    if (entry.isAnswer) classes.push("answer");
    if (result.source && result.source !== "tool") classes.push(`from-${result.source}`);
    const idle = result.contribution && result.contribution.contributes === false;
    if (idle) classes.push("idle");
    entry.node.setAttribute("class", classes.join(" "));
    const source = result.source && result.source !== "tool" ? ` · ${result.source}` : "";
    entry.status.textContent = `${result.status}${source} · ${ms(result.latency_ms)}${idle ? " · no effect" : ""}`;
    entry.node.setAttribute("aria-label", nodeLabel(entry.step, result, entry.isAnswer));
    if (selected && selected.card === card && selected.stepId === result.id) showDetail(card, result.id);
  }

  function select(card, stepId) {
    if (selected && selected.card.nodes.get(selected.stepId)) {
      selected.card.nodes.get(selected.stepId).node.classList.remove("selected");
    }
    selected = { card, stepId };
    card.nodes.get(stepId).node.classList.add("selected");
    showDetail(card, stepId);
  }

  function showDetail(card, stepId) {
    const { step, isAnswer } = card.nodes.get(stepId);
    const result = card.results.get(stepId);
    const box = clear(card.detail);
    box.append(el("h5", { text: `${step.id} · ${step.tool}${isAnswer ? " (answer step)" : ""}` }));
    const facts = el("dl", { class: "facts" });
    const fact = (k, v) => facts.append(el("dt", { text: k }), el("dd", { text: v }));
    fact("status", result ? result.status : "pending");
    if (result) {
      fact("source", result.source || "tool");
      fact("latency", ms(result.latency_ms));
      if (result.contribution) fact("contribution", describeContribution(result.contribution));
    }
    fact("depends on", (step.depends_on || []).join(", ") || "nothing");
    box.append(facts);
    box.append(el("p", { class: "label", text: "input" }), code(step.input, step.tool));
    if (result && result.output !== null && result.output !== undefined) {
      box.append(el("p", { class: "label", text: "output" }), code(result.output, "output"));
    }
    if (result && result.error) {
      box.append(el("p", { class: "label", text: "error" }), code(result.error, "error"));
    }
  }

  // what the answer did with this step's value changed, then taken away
  function describeContribution(c) {
    const verdict = c.contributes === true ? "the answer depends on it"
      : c.contributes === false ? "contributes nothing to the answer" : "not measured";
    return `${verdict} (value changed: answer ${c.perturbed}; value removed: answer ${c.removed})`;
  }

  function code(text, kind) {
    return el("pre", { class: `code code-${kind}` }, el("code", { text: String(text) }));
  }

  // ------------------------------------------------------------------ the answer

  function drawResult(data) {
    const box = clear($("result"));
    box.hidden = false;
    const answer = data.answer === null ? "no answer" : data.answer;
    box.append(
      el(
        "div",
        { class: "answer-row" },
        el("span", { class: "label", text: "Answer" }),
        el("output", { class: "answer", id: "answer", text: answer }),
        el("span", { class: `verdict verdict-${data.verdict}`, id: "verdict", text: data.verdict }),
        data.cached ? el("span", { class: "tag", text: "from the cache" }) : null,
      ),
    );
    box.append(confidence(data));
    if (data.agreement) {
      const a = data.agreement;
      box.append(
        el("p", { class: "agreement", text: `${a.agreeing} of ${a.plans} votes agree; ${a.rounds} round${a.rounds === 1 ? "" : "s"}` }),
      );
    }
    box.append(timings(data.timings_ms || {}));
    const trace = el("p", { class: "trace" }, "Trace ", traceLink(data.trace_id));
    if (data.cached && data.cached_trace_id) trace.append(" · answered first in ", traceLink(data.cached_trace_id));
    box.append(trace);
    if (data.solution) {
      box.append(el("p", { class: "label", text: "worked solution (no plan gave this answer)" }), code(data.solution.text, "solution"));
    }
    markServed(data);
  }

  function confidence(data) {
    const s = data.signals;
    const wrap = el("div", { class: "confidence" });
    wrap.append(el("p", {}, el("span", { class: "label", text: "Confidence " }), el("strong", { id: "confidence", text: num(data.confidence, 3) })));
    if (!s) return wrap;
    const facts = el("dl", { class: "facts signals", "aria-label": "what the confidence was made of" });
    const fact = (k, v) => facts.append(el("dt", { text: k }), el("dd", { text: v }));
    fact("agreement", `${num(s.agreement)} of ${s.plans} sample${s.plans === 1 ? "" : "s"}`);
    fact("work complete", s.complete ? "yes" : "no");
    fact("verifier", s.verifier === null || s.verifier === undefined ? "not asked or no reply" : num(s.verifier, 3));
    fact("round", String(s.rounds));
    wrap.append(facts);
    return wrap;
  }

  function timings(t) {
    const total = typeof t.total === "number" && t.total > 0 ? t.total : 0;
    const wrap = el("div", { class: "timings" });
    wrap.append(el("p", { class: "label", text: `Time per stage (total ${ms(t.total)})` }));
    const bar = el("div", { class: "bar", role: "img" });
    const legend = el("ul", { class: "legend" });
    const parts = [];
    let known = 0;
    for (const stage of STAGES) {
      const v = typeof t[stage] === "number" ? t[stage] : 0;
      known += v;
      if (v > 0) parts.push([stage, v]);
    }
    // stages can overlap (solve runs beside plan), so the bar shows shares of their sum
    const scale = Math.max(known, total);
    if (total > known) parts.push(["other", total - known]);
    for (const [stage, v] of parts) {
      const seg = el("span", { class: `seg seg-${stage}`, title: `${stage} ${ms(v)}` });
      seg.style.width = `${scale ? (100 * v) / scale : 0}%`;
      bar.append(seg);
      legend.append(el("li", {}, el("span", { class: `swatch seg-${stage}` }), `${stage} ${ms(v)}`));
    }
    bar.setAttribute("aria-label", parts.map(([k, v]) => `${k} ${ms(v)}`).join(", ") || "no timings");
    wrap.append(bar, legend);
    return wrap;
  }

  function markServed(data) {
    const round = data.signals ? data.signals.rounds : 1;
    if (!data.plan) return;
    const wanted = JSON.stringify([data.plan.reasoning, data.plan.steps, data.plan.answer_step]);
    for (const [key, card] of current.cards) {
      if (!key.startsWith(`${round}.`)) continue;
      const p = card.plan;
      if (JSON.stringify([p.reasoning, p.steps, p.answer_step]) === wanted) {
        card.root.classList.add("served");
        card.root.querySelector("h4").append(el("span", { class: "tag", text: "served" }));
        // the served steps as the answer has them (with their contributions, if asked)
        for (const step of data.steps || []) updateStep(card, step);
        return;
      }
    }
    // nothing streamed for it (an answer from the cache): draw the served plan now
    const section = roundSection(round, null);
    section.summary.textContent = "the served plan, with its steps";
    const card = planCard(data.plan, "Served plan", "served");
    card.root.classList.add("served");
    section.grid.append(card.root);
    for (const step of data.steps || []) updateStep(card, step);
  }

  // ------------------------------------------------------------------ traces

  async function openTrace(id) {
    const out = clear($("trace-out"));
    const errorBox = $("trace-error");
    errorBox.hidden = true;
    $("trace-id").value = id;
    if (!id) return;
    if (/^\.{1,2}$/.test(id)) {
      // a dot segment: the URL would resolve to another path, not to this id
      showError(errorBox, null, "not a trace id: a trace id is 32 hexadecimal characters");
      return;
    }
    out.append(el("p", { class: "busy", text: "Reading the trace…" }));
    let response;
    try {
      response = await fetch(`traces/${encodeURIComponent(id)}`, { headers: { Accept: "application/json", ...authHeaders() } });
    } catch (err) {
      clear(out);
      showError(errorBox, null, `cannot reach the orchestrator (${err && err.message})`);
      return;
    }
    clear(out);
    if (!response.ok) {
      const { status, body, retryAfter } = await errorFrom(response);
      showError(errorBox, status, body, retryAfter);
      return;
    }
    let view;
    try {
      view = await response.json();
    } catch (_) {
      showError(errorBox, null, `${response.status} ${response.statusText} (the reply was not a trace)`);
      return;
    }
    drawTrace(out, view);
  }

  function drawTrace(out, view) {
    const total = typeof view.duration_ms === "number" && view.duration_ms > 0 ? view.duration_ms : 0;
    out.append(
      el(
        "p",
        { class: "trace-summary" },
        `${view.lines} log lines from ${view.source === "elasticsearch" ? "Elasticsearch" : "the log files"}`,
        view.started ? ` · started ${view.started}` : "",
        ` · ${ms(view.duration_ms)}`,
      ),
    );
    if (view.truncated) out.append(el("p", { class: "warning", text: "More lines than shown: these are the earliest." }));
    const list = el("ul", { class: "spans", "aria-label": "spans, nested by caller" });
    for (const span of view.spans || []) list.append(drawSpan(span, total));
    out.append(list);
  }

  function drawSpan(span, total) {
    const item = el("li", { class: `span${span.error ? " has-error" : ""}` });
    const head = el(
      "div",
      { class: "span-head" },
      el("strong", { text: span.service || "?" }),
      ` span ${span.span_id} · ${ms(span.duration_ms)}`,
      span.error ? el("span", { class: "tag tag-error", text: "error" }) : null,
    );
    const track = el("div", { class: "track", "aria-hidden": "true" });
    const bar = el("span", { class: "span-bar" });
    if (total && typeof span.start_ms === "number") {
      bar.style.left = `${Math.min(100, (100 * span.start_ms) / total)}%`;
      const width = typeof span.duration_ms === "number" ? (100 * span.duration_ms) / total : 0;
      bar.style.width = `${Math.max(0.5, Math.min(100 - (100 * span.start_ms) / total, width))}%`;
    }
    track.append(bar);
    const lines = el("ol", { class: "lines" });
    for (const line of span.lines || []) {
      const level = String(line.level || "info").toLowerCase();
      const bad = line.error || level === "error" || level === "critical";
      const row = el(
        "li",
        { class: `line level-${level.replace(/[^a-z]/g, "")}${bad ? " line-error" : ""}` },
        el("span", { class: "at", text: `+${ms(line.offset_ms)}` }),
        el("span", { class: "lvl", text: level }),
        el("span", { class: "msg", text: line.message || "" }),
        line.duration_ms !== null && line.duration_ms !== undefined ? el("span", { class: "dur", text: ms(line.duration_ms) }) : null,
        line.error ? el("span", { class: "err", text: line.error }) : null,
      );
      lines.append(row);
    }
    item.append(head, track, lines);
    if (span.children && span.children.length) {
      const kids = el("ul", { class: "spans" });
      for (const child of span.children) kids.append(drawSpan(child, total));
      item.append(kids);
    }
    return item;
  }

  // ------------------------------------------------------------------ views

  function route() {
    const hash = location.hash || "#/";
    const trace = hash.match(/^#\/trace(?:\/([^/?#]*))?$/);
    $("ask-view").hidden = Boolean(trace);
    $("trace-view").hidden = !trace;
    $("nav-ask").toggleAttribute("aria-current", !trace);
    $("nav-trace").toggleAttribute("aria-current", Boolean(trace));
    if (trace) {
      let id = trace[1] || "";
      try {
        id = decodeURIComponent(id);
      } catch (_) {
        // a malformed escape: the id as written, for the service to refuse
      }
      openTrace(id);
      if (!id) $("trace-id").focus();
    }
  }

  async function start() {
    $("ask-form").addEventListener("submit", ask);
    $("question").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        $("ask-form").requestSubmit();
      }
    });
    $("trace-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const id = $("trace-id").value.trim();
      const target = `#/trace/${encodeURIComponent(id)}`;
      if (location.hash === target) route();
      else location.hash = target;
    });
    window.addEventListener("hashchange", route);
    try {
      const response = await fetch("console/config", { headers: { Accept: "application/json" } });
      if (response.ok) config = await response.json();
      else {
        const { status, body, retryAfter } = await errorFrom(response);
        showError($("ask-error"), status, body, retryAfter);
      }
    } catch (err) {
      showError($("ask-error"), null, `cannot reach the orchestrator (${err && err.message})`);
    }
    setUpOptions();
    setUpAuth();
    document.body.classList.add("ready");
    route();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
