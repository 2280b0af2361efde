// The mqgw dashboard: logs in against /api/whoami with HTTP basic auth (kept in
// sessionStorage, as RabbitMQ's management UI does), then reads and changes everything
// through the admin API. Every API failure is shown in the page with its status and reason.
"use strict";

(() => {
  const AUTH_KEY = "mqgw.dashboard.auth";
  const REFRESH_KEY = "mqgw.dashboard.refresh";
  const WINDOW_MS = 10 * 60 * 1000; // the charts' rolling window
  const $ = (id) => document.getElementById(id);
  let auth = null; // {user, header, tags}
  let timer = null;
  const samples = []; // overview samples for the charts, oldest first

  const { h, cell, num, bytes, tile, drawChart, history, figures, controlButtons, controlText, rebuild, queueRates, lagText } = window.mqgwUi;
  const enc = encodeURIComponent;

  // -- the API ------------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(source, status, error, reason) {
      super(`${source} → ${status || "no answer"} ${error}: ${reason}`);
      Object.assign(this, { source, status, error, reason });
    }
  }

  const sourceOf = (method, path) => `${method} ${path.split("?")[0]}`;
  function basic(user, password) {
    let latin1 = ""; // btoa takes bytes as a latin-1 string: encode UTF-8 first
    for (const b of new TextEncoder().encode(`${user}:${password}`)) latin1 += String.fromCharCode(b);
    return `Basic ${btoa(latin1)}`;
  }

  async function api(method, path, body, header = auth && auth.header, extraHeaders = {}) {
    const source = sourceOf(method, path);
    // credentials "omit": a 401 must come back to us, not open the browser's password prompt.
    const init = { method, credentials: "omit", headers: { ...extraHeaders, Accept: "application/json" } };
    if (header) init.headers.Authorization = header;
    if (body !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
    let response;
    try { response = await fetch(path, init); } catch (e) { throw new ApiError(source, 0, "unreachable", e.message); }
    const text = await response.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = null; }
    if (!response.ok) {
      const error = (data && data.error) || response.statusText || "error";
      throw new ApiError(source, response.status, error, (data && data.reason) || text.slice(0, 200) || "(no reason given)");
    }
    return data;
  }

  // Errors stay in the page, one per source (method + path), until that source succeeds.
  function report(error) {
    if (!(error instanceof ApiError)) throw error;
    if (error.status === 401 && auth) { logout(`Logged out: ${error.reason}`); return; }
    cleared(error.source);
    const dismiss = h("button", { type: "button", class: "dismiss", title: "dismiss", text: "×" });
    const line = h("div", { class: "error", "data-source": error.source, "data-status": error.status }, h("span", { text: error.message }), dismiss);
    dismiss.addEventListener("click", () => line.remove());
    $("errors").append(line);
  }
  function cleared(source) {
    for (const old of [...$("errors").children]) if (old.dataset.source === source) old.remove();
  }
  async function load(path) {
    try { const data = await api("GET", path); cleared(sourceOf("GET", path)); return data; } catch (e) { report(e); return undefined; }
  }
  async function act(what, method, path, body, headers) {
    try {
      const data = await api(method, path, body, auth && auth.header, headers);
      cleared(sourceOf(method, path));
      notice(`${what}: done`);
      await refresh();
      return data === null ? {} : data;
    } catch (e) { report(e); return undefined; }
  }
  function notice(text) {
    $("notice").textContent = text;
    $("notice").hidden = false;
  }

  // -- login ----------------------------------------------------------------------------------
  async function login(user, password) {
    const header = basic(user, password);
    enter(await api("GET", "/api/whoami", undefined, header), header);
  }
  function enter(me, header) {
    auth = { user: me.name, header, tags: me.tags };
    sessionStorage.setItem(AUTH_KEY, JSON.stringify(auth));
    $("login").hidden = true;
    $("login-error").hidden = true;
    for (const id of ["app", "nav", "session"]) $(id).hidden = false;
    $("who").textContent = `${auth.user} (${auth.tags.join(", ") || "no tags"})`;
    route();
  }
  function logout(message) {
    auth = null;
    sessionStorage.removeItem(AUTH_KEY);
    clearTimeout(timer);
    samples.length = 0;
    for (const id of ["app", "nav", "session"]) $(id).hidden = true;
    $("errors").replaceChildren();
    $("login").hidden = false;
    $("login-error").hidden = !message;
    $("login-error").textContent = message || "";
  }

  // -- pages ----------------------------------------------------------------------------------
  function currentPage() {
    const parts = location.hash.replace(/^#\/?/, "").split("/");
    if (parts[0] === "queue" && parts.length === 3) return { page: "queue", vhost: decodeURIComponent(parts[1]), name: decodeURIComponent(parts[2]) };
    return { page: ["queues", "connections", "vhosts"].includes(parts[0]) ? parts[0] : "overview" };
  }
  function route() {
    if (!auth) return;
    const { page } = currentPage();
    for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== `page-${page}`;
    for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("active", link.dataset.page === page || (page === "queue" && link.dataset.page === "queues"));
    $("notice").hidden = true;
    $("queue-result").textContent = "";
    refresh();
  }
  async function refresh() {
    clearTimeout(timer);
    if (!auth) return;
    const where = currentPage();
    await sampleOverview();
    if (where.page === "overview") renderOverview();
    else if (where.page === "queues") await renderQueues();
    else if (where.page === "queue") await renderQueue(where.vhost, where.name);
    else if (where.page === "connections") await renderConnections();
    else await renderVhosts();
    clearTimeout(timer); // a refresh started meanwhile (after an action) may have set one
    if (auth) timer = setTimeout(refresh, Number($("refresh").value) * 1000);
  }

  // The overview is sampled on every page, so the charts have history when one comes back.
  // The first answer may carry the node's own history (RabbitMQ's `samples`, newest first,
  // when asked with msg_rates_age): then the charts start with the last ten minutes.
  const HISTORY = "?msg_rates_age=600&msg_rates_incr=5&lengths_age=600&lengths_incr=5";
  let overview = null;
  async function sampleOverview() {
    overview = await load(`/api/overview${samples.length ? "" : HISTORY}`);
    if (!overview) return;
    const stats = overview.message_stats || {};
    const totals = overview.queue_totals || {};
    const series = { publish: stats.publish_details, deliver: stats.deliver_get_details, ack: stats.ack_details };
    const lengths = { ready: totals.messages_ready_details, unacked: totals.messages_unacknowledged_details };
    if (!samples.length) samples.push(...history(series, lengths));
    const rate = (d) => (d && typeof d.rate === "number" ? d.rate : 0);
    samples.push({
      t: Date.now(), publish: rate(series.publish), deliver: rate(series.deliver), ack: rate(series.ack),
      ready: totals.messages_ready || 0, unacked: totals.messages_unacknowledged || 0,
    });
    while (samples.length && samples[0].t < Date.now() - WINDOW_MS) samples.shift();
  }
  function renderOverview() {
    drawChart($("chart-rates"), samples, [
      { key: "publish", label: "publish", cls: "s1" }, { key: "deliver", label: "deliver/get", cls: "s2" }, { key: "ack", label: "ack", cls: "s3" },
    ], WINDOW_MS);
    drawChart($("chart-queued"), samples, [
      { key: "ready", label: "ready", cls: "s1" }, { key: "unacked", label: "unacked", cls: "s2" },
    ], WINDOW_MS);
    if (!overview) return;
    const objects = overview.object_totals || {};
    const totals = overview.queue_totals || {};
    $("overview-totals").replaceChildren(
      ...["connections", "channels", "queues", "consumers", "exchanges"].map((k) => tile(k, num(objects[k]), k)),
      tile("messages ready", num(totals.messages_ready), "messages_ready"),
      tile("unacked", num(totals.messages_unacknowledged), "messages_unacknowledged"),
    );
    const store = figures(overview.mqgw, "", []);
    $("overview-store").replaceChildren(...(store.length
      ? store.map(([key, label, text]) => tile(label, text, key))
      : [h("p", { class: "muted", text: "The overview has no mqgw store figures." })]));
  }

  async function onControl(event) {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const { action, path, label } = button.dataset;
    if (action === "clear") return act(`clear control of ${label}`, "DELETE", path);
    let body = { state: action === "stop" ? "stopped" : "running" };
    if (action === "throttle") {
      const value = button.parentElement.querySelector("input.rate").value;
      body = { rate_msgs: value === "" ? null : Number(value) };
    }
    return act(`${action} ${label}`, "PUT", path, body);
  }

  const queueHash = (q) => `#/queue/${enc(q.vhost)}/${enc(q.name)}`;
  const queueControlPath = (vhost, name) => `/api/controls/queues/${enc(vhost)}/${enc(name)}`;

  async function renderQueues() {
    const queues = await load("/api/queues");
    if (!queues) return;
    const filter = $("queue-filter").value.trim().toLowerCase();
    const rows = queues.filter((q) => !filter || q.name.toLowerCase().includes(filter)).map((q) => {
      const control = (q.mqgw || {}).control;
      const [rateIn, rateOut, rateAck] = queueRates(q);
      return h("tr", { "data-vhost": q.vhost, "data-name": q.name, "data-state": control ? control.state : q.state },
        cell(q.vhost), h("td", {}, h("a", { href: queueHash(q), text: q.name })),
        cell(controlText(control), control && control.state === "stopped" ? "state stopped" : "state"),
        cell(num(q.messages_ready), "num"), cell(num(q.messages_unacknowledged), "num"), cell(num(q.messages), "num"),
        cell(num(rateIn), "num"), cell(num(rateOut), "num"), cell(num(rateAck), "num"), cell(num(q.consumers), "num"),
        cell(lagText(q), "num"), h("td", {}, controlButtons(queueControlPath(q.vhost, q.name), `queue ${q.name}`)));
    });
    rebuild($("queues-table").tBodies[0], rows.length ? rows : [h("tr", {}, h("td", { colspan: "12", class: "muted", text: "No queues." }))]);
  }

  // A depth breaker (policy "breaker"): its state, bounds and how often it tripped.
  const breakerText = (b) => `${b.state} (${b.action} above ${num(b.high)}, until below ${num(b.low)}) · ${num(b.trips)} trips · ${b.tripped_seconds.toFixed(1)} s tripped`;

  async function renderQueue(vhost, name) {
    $("queue-title").textContent = `${name} (vhost ${vhost})`;
    const q = await load(`/api/queues/${enc(vhost)}/${enc(name)}`);
    if (!q) { // no figures of another queue under this one's name
      for (const node of [$("queue-tiles"), $("queue-controls"), $("partitions-table").tBodies[0], $("consumers-table").tBodies[0]]) node.replaceChildren();
      $("route-section").hidden = true;
      return;
    }
    const m = q.mqgw || {};
    $("queue-tiles").replaceChildren(
      tile("ready", num(q.messages_ready)), tile("unacked", num(q.messages_unacknowledged)), tile("consumers", num(q.consumers)),
      tile("lag", lagText(q)), tile("published", num(m.published)), tile("delivered", num(m.delivered)), tile("acked", num(m.acked)),
      tile("dead-lettered", num(m.dead_lettered)), tile("dropped by retention", num(m.dropped_by_retention)),
      tile("commitlog held", bytes(m.commitlog_bytes_held)), tile("control", controlText(m.control), "control"),
      ...(m.breaker ? [tile("breaker", breakerText(m.breaker), "breaker")] : []));
    const controls = h("div", { class: "controls" }, controlButtons(queueControlPath(vhost, name), `queue ${name}`));
    rebuild($("queue-controls"), [controls]);
    const partitions = Array.isArray(m.partition_details) ? m.partition_details : [];
    const columns = [...new Set(partitions.flatMap((p) => Object.keys(p)))];
    $("partitions-table").tHead.replaceChildren(h("tr", {}, ...columns.map((c) => h("th", { class: "num", text: c.replace(/_/g, " ") }))));
    // Gray partitions (gray release) are colored: only gray consumers read them.
    $("partitions-table").tBodies[0].replaceChildren(...partitions.map((p) => h("tr", p.gray ? { class: "gray" } : {},
      ...columns.map((c) => cell(typeof p[c] === "number" ? num(p[c]) : String(p[c]), "num")))));
    $("partitions-missing").hidden = partitions.length > 0;
    $("partitions-missing").textContent = "The API gives no partition offsets for this queue (no mqgw.partition_details).";
    await renderRoute(vhost, name, m.ordering);
    $("consumers-table").tBodies[0].replaceChildren(...(q.consumer_details || []).map((c) => h("tr", {},
      cell(c.channel_details && c.channel_details.connection_name), cell(c.channel_details && c.channel_details.number),
      cell(c.consumer_tag), cell(c.ack_required ? "manual" : "auto"), cell(c.prefetch_count, "num"), cell(c.activity_status))));
  }
  // A keyed-order queue's route: each physical partition's state, range, gate and holder.
  async function renderRoute(vhost, name, ordering) {
    $("route-section").hidden = !ordering;
    if (!ordering) return;
    const route = await load(`/api/queues/${enc(vhost)}/${enc(name)}/route`);
    if (!route) return;
    const latest = route.versions[route.versions.length - 1];
    $("route-summary").textContent = `version ${route.version} (${latest.change}), ${route.open_partitions} partitions open, ` +
      `${route.logical_partitions} logical by ${route.key}` + (route.in_progress ? `; ${route.in_progress}` : "");
    $("route-table").tBodies[0].replaceChildren(...route.partitions.map((p) => h("tr", { "data-state": p.state, class: `route-${p.state}` },
      cell(p.partition, "num"), cell(p.state), cell(p.range ? `[${p.range[0]}, ${p.range[1]})` : ""), cell(p.group || "local"),
      cell(p.gate), cell(p.consumer ? `${p.consumer.consumer_tag} (${p.consumer.connection})` : (p.orphaned ? "orphaned" : "")),
      cell(num(p.held), "num"), cell(num(p.unacked), "num"), cell(num(p.committed), "num"), cell(p.opened_in, "num"))));
  }
  async function queueAction(kind) {
    const { vhost, name } = currentPage();
    const base = `/api/queues/${enc(vhost)}/${enc(name)}`;
    let result;
    if (kind === "purge") {
      if (!confirm(`Purge every message of queue ${name}?`)) return;
      result = await act(`purge ${name}`, "DELETE", `${base}/contents`);
    } else if (kind === "redrive") {
      result = await act(`redrive ${name}.dlq`, "POST", `${base}/redrive`);
      if (result) $("queue-result").textContent = `moved ${num(result.moved)}, ${num(result.remaining)} left in ${name}.dlq`;
    } else {
      const timestamp = new Date($("reset-time").value).getTime();
      if (!Number.isFinite(timestamp) || !confirm(`Move the consumers of ${name} to ${new Date(timestamp).toISOString()}?`)) return;
      result = await act(`reset ${name}`, "POST", `${base}/reset`, { timestamp });
      const moved = result && typeof result.skipped === "number" ? `: skipped ${num(result.skipped)}, replayed ${num(result.replayed)}` : "";
      if (result) $("queue-result").textContent = `reset to ${new Date(timestamp).toISOString()}${moved}`;
    }
  }

  // A connection's gray release state: what its consumers read, colored when gray.
  function grayCell(gray) {
    if (!gray) return cell("");
    const text = gray.switching_back ? `${gray.consumes} → normal (draining)` : gray.consumes;
    const td = cell(gray.publishes === "gray" && gray.consumes !== "gray" ? `${text}, publishes gray` : text);
    if (gray.consumes === "gray" || gray.publishes === "gray") td.classList.add("gray");
    return td;
  }

  async function renderConnections() {
    const connections = await load("/api/connections");
    if (!connections) return;
    const rows = connections.map((c) => {
      const props = c.client_properties || {};
      const close = h("button", { type: "button", class: "danger", "data-close": c.name, text: "Close" });
      return h("tr", { "data-name": c.name },
        cell(c.name), cell(props.connection_name || (props.product ? `${props.product} ${props.version || ""}` : "")), cell(c.user), cell(c.vhost), cell(c.node),
        cell(c.channels, "num"), cell(c.state), grayCell((c.mqgw || {}).gray), cell(controlText((c.mqgw || {}).control), "state"),
        h("td", {}, controlButtons(`/api/controls/connections/${enc(c.name)}`, `connection ${c.name}`)), h("td", {}, close));
    });
    rebuild($("connections-table").tBodies[0], rows.length ? rows : [h("tr", {}, h("td", { colspan: "11", class: "muted", text: "No connections." }))]);
  }
  async function closeConnection(event) {
    const name = event.target.dataset.close;
    if (!name || !confirm(`Close connection ${name}?`)) return;
    // The client gets 320 CONNECTION_FORCED with this text (RabbitMQ's X-Reason header).
    await act(`close ${name}`, "DELETE", `/api/connections/${enc(name)}`, undefined, { "X-Reason": `closed by ${auth.user} from the mqgw dashboard` });
  }

  async function renderVhosts() {
    const vhosts = await load("/api/vhosts");
    if (!vhosts) return;
    rebuild($("vhosts-table").tBodies[0], vhosts.map((v) => h("tr", { "data-name": v.name },
      cell(v.name), cell(v.description), cell(v.tracing ? "on" : "off", v.tracing ? "state on" : "state"),
      h("td", {}, h("button", { type: "button", "data-vhost": v.name, "data-tracing": v.tracing ? "on" : "off", text: v.tracing ? "Turn firehose off" : "Turn firehose on" })))));
  }
  async function toggleFirehose(event) {
    const button = event.target.closest("button[data-vhost]");
    if (!button) return;
    const vhost = button.dataset.vhost;
    const v = await load(`/api/vhosts/${enc(vhost)}`); // a PUT replaces: keep what it has
    if (!v) return;
    const tracing = button.dataset.tracing !== "on";
    await act(`firehose ${tracing ? "on" : "off"} for ${vhost}`, "PUT", `/api/vhosts/${enc(vhost)}`, { description: v.description || "", tags: v.tags || [], tracing });
  }

  // -- wiring ---------------------------------------------------------------------------------
  document.addEventListener("DOMContentLoaded", () => {
    $("login").addEventListener("submit", async (event) => {
      event.preventDefault();
      $("login-submit").disabled = true;
      try { await login($("login-user").value, $("login-password").value); } catch (e) {
        if (!(e instanceof ApiError)) throw e;
        logout(e.status === 401 ? `Login failed: ${e.reason} (${e.status} ${e.error})` : `Login failed: ${e.message}`);
      } finally { $("login-submit").disabled = false; }
    });
    $("logout").addEventListener("click", () => logout(""));
    $("refresh").value = sessionStorage.getItem(REFRESH_KEY) || "5";
    $("refresh").addEventListener("change", () => { sessionStorage.setItem(REFRESH_KEY, $("refresh").value); refresh(); });
    $("queue-filter").addEventListener("input", () => refresh());
    for (const id of ["queues-table", "queue-controls", "connections-table"]) $(id).addEventListener("click", onControl);
    $("connections-table").addEventListener("click", closeConnection);
    $("vhosts-table").addEventListener("click", toggleFirehose);
    $("purge").addEventListener("click", () => queueAction("purge"));
    $("redrive").addEventListener("click", () => queueAction("redrive"));
    $("reset-form").addEventListener("submit", (event) => { event.preventDefault(); queueAction("reset"); });
    window.addEventListener("hashchange", route);
    const saved = JSON.parse(sessionStorage.getItem(AUTH_KEY) || "null");
    if (saved) { // check it again: the password may have changed since
      api("GET", "/api/whoami", undefined, saved.header).then((me) => enter(me, saved.header),
        (e) => logout(e instanceof ApiError ? `Please log in again: ${e.reason}` : ""));
    }
  });
})();
