// The overview: an EventSource on the API's stream of tenants and one on
// its DataStores and Hosts (watches made as the signed-in user); rows
// change as events arrive, no polling. Tenants needing attention first, a
// filter, and pages of 25.
"use strict";
(function () {
  const {el, row} = apiary;
  const pageSize = 25;
  const tenants = new Map();
  const body = document.querySelector("#tenants tbody");
  const status = document.getElementById("status");
  const ns = document.getElementById("namespace");
  const filter = document.getElementById("filter");
  const counts = document.getElementById("counts");
  const pageInfo = document.getElementById("page-info");
  const prev = document.getElementById("prev"), next = document.getElementById("next");
  let source, infra, page = 0;
  const datastores = new Map(), hosts = new Map();

  function attention(t) {
    const bad = (t.conditions || []).filter(c => c.status !== "True" && c.type !== "Upgrading");
    return bad.map(c => c.type + ": " + (c.reason || "") + (c.message ? " — " + c.message : "")).join("; ");
  }
  function render() {
    const f = filter.value.trim().toLowerCase();
    const all = [...tenants.values()];
    const byPhase = new Map();
    for (const t of all) byPhase.set(t.phase || "Pending", (byPhase.get(t.phase || "Pending") || 0) + 1);
    counts.textContent = all.length + " tenants" + (all.length ? ": " + [...byPhase].sort().map(([p, n]) => n + " " + p).join(", ") : "");
    const rows = all
      .filter(t => !f || t.name.toLowerCase().includes(f) || t.namespace.toLowerCase().includes(f) || (t.phase || "").toLowerCase().includes(f))
      .sort((a, b) => (attention(b) !== "") - (attention(a) !== "") || (a.namespace + "/" + a.name).localeCompare(b.namespace + "/" + b.name));
    const pages = Math.max(1, Math.ceil(rows.length / pageSize));
    page = Math.min(page, pages - 1);
    const shown = rows.slice(page * pageSize, (page + 1) * pageSize);
    pageInfo.textContent = rows.length ? (page * pageSize + 1) + "–" + (page * pageSize + shown.length) + " of " + rows.length : "none";
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
    body.replaceChildren(...shown.map(t => {
      const link = el("a", t.name, {href: "/tenants/" + encodeURIComponent(t.namespace) + "/" + encodeURIComponent(t.name)});
      const why = attention(t);
      const tr = row([t.namespace, link, t.phase || "",
        (t.version || "—") + (t.desiredVersion && t.desiredVersion !== t.version ? " → " + t.desiredVersion : ""),
        t.mode || "", t.readyReplicas + "/" + t.replicas, why], {"data-tenant": t.namespace + "/" + t.name, tabindex: "0"});
      if (why) tr.className = "attention";
      return tr;
    }));
  }
  // DataStores not Ready first; Hosts counted by phase, those failing or
  // with a condition not True listed.
  function renderInfra() {
    const ds = [...datastores.values()].sort((a, b) => (a.ready === "True") - (b.ready === "True") || a.name.localeCompare(b.name));
    document.querySelector("#datastores tbody").replaceChildren(...ds.map(d => {
      const tr = row([el("a", d.name, {href: "/datastores/" + encodeURIComponent(d.name)}), d.ready + (d.reason ? " (" + d.reason + ")" : ""), d.readyMembers + "/" + d.members, d.tenants, d.ready === "True" ? "" : d.message]);
      if (d.ready !== "True") tr.className = "attention";
      return tr;
    }));
    const all = [...hosts.values()];
    const byPhase = new Map();
    for (const h of all) byPhase.set(h.phase || "Pending", (byPhase.get(h.phase || "Pending") || 0) + 1);
    document.getElementById("host-counts").textContent = all.length + " hosts" + (all.length ? ": " + [...byPhase].sort().map(([p, n]) => n + " " + p).join(", ") : "");
    const bad = all.map(h => [h, (h.conditions || []).filter(c => c.status !== "True").map(c => c.type + ": " + (c.reason || "") + (c.message ? " — " + c.message : "")).join("; ")])
      .filter(([h, why]) => h.phase === "Failed" || why)
      .sort(([a], [b]) => (a.namespace + "/" + a.name).localeCompare(b.namespace + "/" + b.name));
    const tbl = document.getElementById("hosts");
    tbl.hidden = bad.length === 0;
    tbl.querySelector("tbody").replaceChildren(...bad.map(([h, why]) => {
      const link = el("a", h.namespace + "/" + h.tenant, {href: "/tenants/" + encodeURIComponent(h.namespace) + "/" + encodeURIComponent(h.tenant)});
      const host = el("a", h.name, {href: "/hosts/" + encodeURIComponent(h.namespace) + "/" + encodeURIComponent(h.name)});
      const tr = row([host, link, h.phase || "", why || "failed"]);
      tr.className = "attention";
      return tr;
    }));
  }
  function connectInfra(scope) {
    if (infra) infra.close();
    datastores.clear();
    hosts.clear();
    for (const part of ["datastores", "hosts"]) document.getElementById(part + "-unavailable").hidden = true;
    renderInfra();
    infra = new EventSource("/api/infrastructure/stream?namespace=" + encodeURIComponent(scope));
    infra.addEventListener("unavailable", e => {
      const u = JSON.parse(e.data);
      const p = document.getElementById(u.part + "-unavailable");
      if (p) { p.textContent = "Not shown: " + u.message; p.hidden = false; }
    });
    infra.addEventListener("datastore", e => { const d = JSON.parse(e.data); datastores.set(d.name, d); renderInfra(); });
    infra.addEventListener("datastore-deleted", e => { datastores.delete(JSON.parse(e.data).name); renderInfra(); });
    infra.addEventListener("host", e => { const h = JSON.parse(e.data); hosts.set(h.namespace + "/" + h.name, h); renderInfra(); });
    infra.addEventListener("host-deleted", e => { const h = JSON.parse(e.data); hosts.delete(h.namespace + "/" + h.name); renderInfra(); });
  }
  function connect() {
    if (source) source.close();
    tenants.clear();
    page = 0;
    render();
    const scope = ns.value.trim();
    history.replaceState(null, "", scope ? "?namespace=" + encodeURIComponent(scope) : "/");
    connectInfra(scope);
    const url = "/api/tenants/stream?namespace=" + encodeURIComponent(scope);
    const mine = source = new EventSource(url);
    source.onopen = () => { status.textContent = "live"; };
    source.onerror = () => {
      if (mine.readyState !== EventSource.CLOSED) { status.textContent = "reconnecting…"; return; }
      // Refused (the stream answered other than 200): ask once why.
      status.textContent = "not live";
      const ctl = new AbortController();
      fetch(url, {signal: ctl.signal}).then(async resp => {
        if (resp.ok) { ctl.abort(); status.textContent = "disconnected: reload the page"; return; }
        const why = (await resp.text()).trim();
        status.textContent = (scope ? "tenants in namespace " + scope : "tenants in all namespaces") + ": " + why +
          (resp.status === 403 && !scope ? " — choose a namespace you may read" : "");
      }).catch(() => {
        // No answer at all (the network changed, the dashboard
        // restarted): try again, as EventSource itself would.
        if (source === mine) setTimeout(() => { if (source === mine) connect(); }, 2000);
      });
    };
    source.addEventListener("tenant", e => { const t = JSON.parse(e.data); tenants.set(t.namespace + "/" + t.name, t); render(); });
    source.addEventListener("tenant-deleted", e => { const t = JSON.parse(e.data); tenants.delete(t.namespace + "/" + t.name); render(); });
  }
  ns.addEventListener("change", connect);
  filter.addEventListener("input", () => { page = 0; render(); });
  prev.addEventListener("click", () => { page--; render(); });
  next.addEventListener("click", () => { page++; render(); });
  document.getElementById("scope").addEventListener("submit", e => { e.preventDefault(); connect(); });
  // Keyboard: arrow keys move between rows, Enter opens the tenant.
  body.addEventListener("keydown", e => {
    const r = e.target.closest("tr");
    if (!r) return;
    if (e.key === "Enter" && e.target === r) { r.querySelector("a").click(); e.preventDefault(); return; }
    const to = e.key === "ArrowDown" ? r.nextElementSibling : e.key === "ArrowUp" ? r.previousElementSibling : null;
    if (to) { to.focus(); e.preventDefault(); }
  });
  ns.value = new URLSearchParams(location.search).get("namespace") || "";
  connect();
})();
