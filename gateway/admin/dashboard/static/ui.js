// The page's building blocks: elements, numbers, the pieces several pages share, and line
// charts as inline SVG over a rolling time window. Nothing here calls the API. No library:
// the dashboard ships without a build step or a network.
"use strict";

window.mqgwUi = (() => {
  // Elements from text only: nothing from the API is ever parsed as HTML.
  function h(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "text") node.textContent = value;
      else node.setAttribute(name, value === true ? "" : value);
    }
    node.append(...children);
    return node;
  }
  const cell = (value, cls) => h("td", { class: cls, text: value === undefined || value === null ? "–" : String(value) });
  const num = (value) => (typeof value === "number" ? value.toLocaleString("en-US", { maximumFractionDigits: 1 }) : "–");
  function bytes(value) {
    if (typeof value !== "number") return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (value >= 1024 && i < units.length - 1) { value /= 1024; i += 1; }
    return `${value.toFixed(i ? 1 : 0)} ${units[i]}`;
  }
  const tile = (label, value, key) => h("div", { class: "tile", "data-key": key || label },
    h("span", { class: "label", text: label }), h("span", { class: "value", text: value }));

  // -- pieces the pages share ------------------------------------------------------------
  // Chart points from the overview's RabbitMQ-style `samples` (newest first): rates from the
  // counters' differences, lengths as they were.
  function history(counters, lengths) {
    const points = new Map(); // timestamp -> point
    const at = (t) => points.get(t) || points.set(t, { t }).get(t);
    for (const [key, details] of Object.entries(counters)) {
      const s = (details && details.samples) || [];
      for (let i = 0; i + 1 < s.length; i += 1) {
        const seconds = (s[i].timestamp - s[i + 1].timestamp) / 1000;
        if (seconds > 0) at(s[i].timestamp)[key] = Math.max(0, (s[i].sample - s[i + 1].sample) / seconds);
      }
    }
    for (const [key, details] of Object.entries(lengths)) for (const p of (details && details.samples) || []) at(p.timestamp)[key] = p.sample;
    return [...points.values()].sort((a, b) => a.t - b.t);
  }
  // mqgw's own overview figures, whatever they are: "store.disk_bytes" -> ["disk bytes", "1.2 MiB"].
  function figures(value, prefix, out) {
    for (const [key, v] of Object.entries(value || {})) {
      const name = prefix ? `${prefix}.${key}` : key;
      const label = name.replace(/^store\./, "").replace(/_/g, " ");
      if (v && typeof v === "object" && !Array.isArray(v)) figures(v, name, out);
      else if (Array.isArray(v)) out.push([name, label, v.join(", ") || "none"]);
      else if (/_ts_ms$/.test(key)) out.push([name, label.replace(/ ts ms$/, ""), typeof v === "number" ? new Date(v).toLocaleString() : "–"]);
      else if (typeof v === "number") out.push([name, label, /bytes/.test(key) ? bytes(v) : num(v)]);
    }
    return out;
  }
  // Controls: the same buttons for a queue and a connection; `path` is the control's URL.
  function controlButtons(path, label) {
    const throttle = h("input", { type: "number", min: "1", step: "any", class: "rate", placeholder: "msg/s", "data-keep": `${path}#rate`, "aria-label": `rate for ${label}` });
    const button = (action, text, cls) => h("button", { type: "button", class: cls, "data-action": action, "data-path": path, "data-label": label, text });
    return h("span", { class: "buttons" }, button("stop", "Stop", "danger"), button("start", "Start"), throttle, button("throttle", "Throttle"), button("clear", "Clear"));
  }
  function controlText(control) {
    if (!control) return "–";
    let text = control.state === "stopped" ? "stopped" : "running";
    if (control.state_set_at_scope && control.state_set_at_scope !== "queue") text += ` (${control.state_set_at_scope})`;
    if (control.rate_msgs) text += ` ≤ ${num(control.rate_msgs)} msg/s`;
    if (control.rate_bytes) text += ` ≤ ${bytes(control.rate_bytes)}/s`;
    return text;
  }
  // Tables are rebuilt on each refresh; what the operator is typing survives it.
  function rebuild(tbody, rows) {
    const kept = new Map();
    for (const input of tbody.querySelectorAll("input[data-keep]")) kept.set(input.dataset.keep, input.value);
    const focused = document.activeElement && document.activeElement.dataset && document.activeElement.dataset.keep;
    tbody.replaceChildren(...rows);
    for (const input of tbody.querySelectorAll("input[data-keep]")) {
      if (kept.has(input.dataset.keep)) input.value = kept.get(input.dataset.keep);
      if (input.dataset.keep === focused) input.focus();
    }
  }

  function queueRates(q) {
    const stats = q.message_stats || {};
    const rate = (details) => (details && typeof details.rate === "number" ? details.rate : undefined);
    return [rate(stats.publish_details), rate(stats.deliver_get_details), rate(stats.ack_details)];
  }
  // Consumer lag as the API gives it (messages, and seconds behind when known).
  function lagText(q) {
    const m = q.mqgw || {};
    if (typeof m.consumer_lag_messages !== "number") return "–";
    const seconds = m.consumer_lag_seconds;
    return typeof seconds === "number" && seconds > 0 ? `${num(m.consumer_lag_messages)} (${num(seconds)} s)` : num(m.consumer_lag_messages);
  }

  // -- charts -----------------------------------------------------------------------------
  const SVG = "http://www.w3.org/2000/svg";
  const HEIGHT = 170;
  const MARGIN = { left: 52, right: 10, top: 10, bottom: 22 };

  function el(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // A round axis maximum (1, 2 or 5 times a power of ten) at or above the largest value.
  function niceMax(value) {
    if (!(value > 0)) return 1;
    const power = 10 ** Math.floor(Math.log10(value));
    for (const step of [1, 2, 5, 10]) if (step * power >= value) return step * power;
    return 10 * power;
  }

  function label(value) {
    if (value >= 1e6) return (value / 1e6).toFixed(value >= 1e7 ? 0 : 1) + "M";
    if (value >= 1e3) return (value / 1e3).toFixed(value >= 1e4 ? 0 : 1) + "k";
    return String(Math.round(value * 100) / 100);
  }

  // points: [{t: ms, <series key>: number}], oldest first; series: [{key, label, cls}].
  function drawChart(container, points, series, windowMs) {
    const width = Math.max(container.clientWidth || 0, 300);
    const plotW = width - MARGIN.left - MARGIN.right;
    const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
    // The axis spans the history there is (a minute at least, windowMs at most).
    const now = Date.now();
    const oldest = points.length ? points[0].t : now;
    const spanMs = Math.min(windowMs, Math.max(60000, now - oldest));
    const start = now - spanMs;
    const shown = points.filter((p) => p.t >= start);
    let top = 0;
    for (const p of shown) for (const s of series) top = Math.max(top, p[s.key] || 0);
    top = niceMax(top);
    const x = (t) => MARGIN.left + ((t - start) / spanMs) * plotW;
    const y = (v) => MARGIN.top + plotH - (Math.min(v, top) / top) * plotH;

    const svg = el("svg", { width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, role: "img" });
    svg.appendChild(el("rect", { x: MARGIN.left, y: MARGIN.top, width: plotW, height: plotH, class: "plot" }));
    for (const fraction of [0, 0.5, 1]) {
      const v = top * fraction;
      svg.appendChild(el("line", { x1: MARGIN.left, x2: width - MARGIN.right, y1: y(v), y2: y(v), class: "grid" }));
      svg.appendChild(el("text", { x: MARGIN.left - 6, y: y(v) + 4, class: "axis end" }, label(v)));
    }
    const ago = (ms) => (ms >= 120000 ? `-${Math.round(ms / 60000)} min` : `-${Math.round(ms / 1000)} s`);
    for (const [t, text] of [[start, ago(spanMs)], [now - spanMs / 2, ago(spanMs / 2)], [now, "now"]]) {
      svg.appendChild(el("text", { x: x(t), y: HEIGHT - 6, class: "axis middle" }, text));
    }
    for (const s of series) {
      const coords = shown.filter((p) => typeof p[s.key] === "number").map((p) => `${x(p.t).toFixed(1)},${y(p[s.key]).toFixed(1)}`);
      if (coords.length === 1) coords.push(coords[0].replace(/^[\d.]+/, (v) => String(Number(v) + 2)));
      if (coords.length) svg.appendChild(el("polyline", { points: coords.join(" "), class: `line ${s.cls}` }));
    }
    if (!shown.length) {
      svg.appendChild(el("text", { x: MARGIN.left + plotW / 2, y: MARGIN.top + plotH / 2, class: "axis middle" }, "no samples yet"));
    }

    const legend = document.createElement("div");
    legend.className = "legend";
    const last = shown[shown.length - 1] || {};
    for (const s of series) {
      const item = document.createElement("span");
      item.className = `key ${s.cls}`;
      item.dataset.series = s.key;
      const value = typeof last[s.key] === "number" ? label(last[s.key]) : "–";
      item.textContent = `${s.label} ${value}`;
      legend.appendChild(item);
    }
    container.replaceChildren(svg, legend);
  }

  return { h, cell, num, bytes, tile, drawChart, history, figures, controlButtons, controlText, rebuild, queueRates, lagText };
})();
