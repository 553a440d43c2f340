// The tenant page: one EventSource on the tenant's stream (the tenant, its
// Hosts and its events, each a watch made as the user); the page changes
// as events arrive, no polling. Actions go through a confirmation.
"use strict";
(function () {
  const {el, row, age, until, post, confirm, conditionRows, journalRows} = apiary;
  const ns = document.body.dataset.namespace, name = document.body.dataset.name;
  const base = "/api/tenants/" + encodeURIComponent(ns) + "/" + encodeURIComponent(name);
  const status = document.getElementById("status");
  const result = document.getElementById("action-result");
  const hosts = new Map(), events = new Map();
  let tenant = null;

  function bytes(n) {
    if (n === undefined || n === null) return "";
    const u = ["B", "KiB", "MiB", "GiB"]; let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n) + " " + u[i];
  }
  function summary(t) {
    const dl = document.getElementById("summary");
    const items = [];
    const add = (k, v) => { if (v !== undefined && v !== null && v !== "") items.push(el("dt", k), el("dd", v)); };
    add("Endpoint", t.endpoint);
    add("Version", (t.version || "—") + (t.desiredVersion && t.desiredVersion !== t.version ? " → " + t.desiredVersion : ""));
    let mode = t.mode || "—";
    if (t.desiredMode && t.desiredMode !== t.mode) mode += " → " + t.desiredMode;
    const sw = t.modeSwitch;
    if (sw && !sw.finished) mode += " (switching to " + sw.target + ": " + sw.phase + " for " + age(sw.phaseStarted) + ")";
    add("Mode", mode);
    add("Replicas", t.readyReplicas + " ready of " + t.replicas + (t.desiredReplicas ? " (desired " + t.desiredReplicas + ")" : ""));
    add("Created", age(t.created) + " ago");
    add("First Ready", t.firstReady ? age(t.firstReady) + " ago" : "not yet");
    const d = t.dataStore || {};
    add("DataStore", d.name ? d.name + " (prefix " + d.prefix + ", user " + d.user + ")" : "not bound yet");
    if (d.usage) {
      const q = d.usage.quota || {};
      add("DataStore usage", bytes(d.usage.bytes) + (q.bytes ? " of " + q.bytes : "") + ", " + d.usage.objects + " keys" + (q.objects ? " of " + q.objects : ""));
    }
    const ca = t.caRotation;
    if (ca && !ca.completed) add("CA rotation", ca.phase + " for " + age(ca.phaseStarted) + (ca.message ? ": " + ca.message : ""));
    dl.replaceChildren(...items);
    const ph = document.getElementById("phase");
    ph.textContent = t.phase || "";
    ph.dataset.phase = t.phase || "";
    const replicas = document.getElementById("replicas");
    // The count follows the tenant until the user types one: an update
    // arriving between typing and confirming must not change what is
    // scaled to.
    if (!replicas.dataset.edited) replicas.value = t.desiredReplicas || t.replicas || 1;
  }
  function render() {
    if (!tenant) return;
    summary(tenant);
    document.querySelector("#conditions tbody").replaceChildren(...conditionRows(tenant.conditions, "Upgrading"));
    document.querySelector("#certificates tbody").replaceChildren(...(tenant.certificates || []).map(c => {
      const days = Math.floor((new Date(c.notAfter).getTime() - Date.now()) / 86400000);
      return row([c.name, c.secret, new Date(c.notAfter).toISOString().slice(0, 16).replace("T", " "), days, c.renewAt ? "in " + until(c.renewAt) : "not on a timer"], days < 14 ? {class: "attention"} : {});
    }));
    const cp = tenant.controlPlaneHosts || [];
    const cpt = document.getElementById("cp-hosts");
    cpt.hidden = cp.length === 0;
    cpt.querySelector("tbody").replaceChildren(...cp.map(h => row([h.host, h.address, h.step, h.result, h.serving ? "yes" : "no", h.message], h.result === "Failed" ? {class: "attention"} : {})));
    const hs = document.getElementById("hosts");
    hs.replaceChildren(...[...hosts.values()].sort((a, b) => a.name.localeCompare(b.name)).map(h => {
      const d = el("details", null, {"data-host": h.name});
      const bad = (h.conditions || []).filter(c => c.status !== "True");
      d.appendChild(el("summary", h.name + " (" + (h.role || "worker") + ", " + h.address + "): " + (h.phase || "—") +
        (h.version ? ", " + h.version : "") + (h.upgradingTo ? " → " + h.upgradingTo : "") + (bad.length ? " — " + bad.map(c => c.type + ": " + c.message).join("; ") : "")));
      const tbl = el("table", null, {"aria-label": "Journal of host " + h.name});
      tbl.appendChild(el("thead")).appendChild(row(["Step", "Result", "Started", "Took", "Attempts", "Message"]));
      tbl.appendChild(el("tbody")).replaceChildren(...journalRows(h.journal));
      d.appendChild(tbl);
      d.appendChild(el("a", "Host page of " + h.name, {href: "/hosts/" + encodeURIComponent(ns) + "/" + encodeURIComponent(h.name)}));
      return d;
    }));
    document.querySelector("#events tbody").replaceChildren(...[...events.values()]
      .sort((a, b) => new Date(b.last) - new Date(a.last)).slice(0, 20)
      .map(e => row([e.type, e.reason, e.message, e.count || 1, age(e.last)], e.type === "Warning" ? {class: "attention"} : {})));
  }

  const source = new EventSource(base + "/stream");
  source.onopen = () => { status.textContent = "live"; };
  source.onerror = () => { status.textContent = "reconnecting… (or no right to read this tenant)"; };
  source.addEventListener("tenant", e => { tenant = JSON.parse(e.data); render(); });
  source.addEventListener("tenant-deleted", () => { status.textContent = "this tenant was deleted"; source.close(); });
  source.addEventListener("host", e => { const h = JSON.parse(e.data); hosts.set(h.name, h); render(); });
  source.addEventListener("host-deleted", e => { hosts.delete(JSON.parse(e.data).name); render(); });
  source.addEventListener("event", e => { const v = JSON.parse(e.data); events.set(v.uid, v); render(); });
  source.addEventListener("unavailable", e => {
    const u = JSON.parse(e.data);
    const p = document.getElementById(u.part + "-unavailable");
    if (p) { p.hidden = false; p.textContent = "Not shown: " + u.message; }
  });
  // Ages move on without asking the server anything.
  setInterval(render, 15000);

  const who = ns + "/" + name;
  document.getElementById("kubeconfig-form").addEventListener("submit", async e => {
    if (e.target.dataset.confirmed) { delete e.target.dataset.confirmed; return; }
    e.preventDefault();
    if (await confirm("Download the admin kubeconfig of " + who + "?", [el("p", "It grants cluster-admin inside the tenant (group kubeadm:cluster-admins). Keep it safe.")], "Download")) {
      e.target.dataset.confirmed = "1";
      e.target.requestSubmit();
      result.textContent = "kubeconfig of " + who + " downloaded";
    }
  });
  document.getElementById("replicas").addEventListener("input", e => { e.target.dataset.edited = "1"; });
  document.getElementById("scale-form").addEventListener("submit", async e => {
    e.preventDefault();
    const n = parseInt(document.getElementById("replicas").value, 10);
    const from = tenant ? (tenant.desiredReplicas || tenant.replicas) : "?";
    if (!await confirm("Scale " + who + " from " + from + " to " + n + " replicas?", [el("p", "The control plane rolls out or in one pod at a time.")], "Scale")) return;
    try {
      await post(base + "/scale", {replicas: n});
      result.textContent = "scaled " + who + " to " + n + " replicas";
      delete document.getElementById("replicas").dataset.edited;
    }
    catch (err) { result.textContent = "not scaled: " + err.message; }
  });
  document.getElementById("switch").addEventListener("click", async () => {
    const target = tenant && (tenant.desiredMode || tenant.mode) === "registered" ? "standalone" : "registered";
    result.textContent = "checking a switch to " + target + "…";
    let checks;
    try { checks = JSON.parse(await post(base + "/mode/check", {target})); }
    catch (err) { result.textContent = "cannot check the switch: " + err.message; return; }
    result.textContent = "";
    const ok = checks.every(c => c.ok);
    const list = el("ul", null, {class: "checks"});
    for (const c of checks) list.appendChild(el("li", (c.ok ? "✓ " : "✗ ") + c.subject + ": " + c.what + " — " + c.detail, {class: c.ok ? "ok" : "failed"}));
    const verdict = el("p", ok ? "Every check passed; nothing was changed yet." : "A check failed: the switch cannot go through as things are. Nothing was changed.");
    if (!await confirm("Switch " + who + " to " + target + "?", [list, verdict], ok ? "Switch to " + target : null)) return;
    try { await post(base + "/mode", {target}); result.textContent = "switching " + who + " to " + target + ": follow it under Mode"; }
    catch (err) { result.textContent = "not switched: " + err.message; }
  });
})();
