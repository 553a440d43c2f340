// The overview: one EventSource on the API's stream of tenants (a watch
// made as the signed-in user); rows change as events arrive, no polling.
"use strict";
(function () {
  const tenants = new Map();
  const body = document.querySelector("#tenants tbody");
  const status = document.getElementById("status");
  const ns = document.getElementById("namespace");
  const filter = document.getElementById("filter");
  let source;

  function attention(t) {
    const bad = (t.conditions || []).filter(c => c.status !== "True" && c.type !== "Upgrading");
    return bad.map(c => c.type + ": " + (c.reason || "") + (c.message ? " — " + c.message : "")).join("; ");
  }
  function cell(tr, text) { const td = document.createElement("td"); td.textContent = text; tr.appendChild(td); }
  function render() {
    const f = filter.value.trim().toLowerCase();
    const rows = [...tenants.values()]
      .filter(t => !f || t.name.toLowerCase().includes(f) || (t.phase || "").toLowerCase().includes(f))
      .sort((a, b) => (attention(b) !== "") - (attention(a) !== "") || (a.namespace + "/" + a.name).localeCompare(b.namespace + "/" + b.name));
    body.replaceChildren(...rows.map(t => {
      const tr = document.createElement("tr");
      tr.tabIndex = 0;
      tr.dataset.tenant = t.namespace + "/" + t.name;
      const why = attention(t);
      if (why) tr.className = "attention";
      cell(tr, t.namespace); cell(tr, t.name); cell(tr, t.phase || "");
      cell(tr, (t.version || "—") + (t.desiredVersion && t.desiredVersion !== t.version ? " → " + t.desiredVersion : ""));
      cell(tr, t.mode || ""); cell(tr, t.readyReplicas + "/" + t.replicas); cell(tr, why);
      return tr;
    }));
  }
  function connect() {
    if (source) source.close();
    tenants.clear();
    render();
    source = new EventSource("/api/tenants/stream?namespace=" + encodeURIComponent(ns.value.trim()));
    source.onopen = () => { status.textContent = "live"; };
    source.onerror = () => { status.textContent = "reconnecting… (or no right to watch tenants here)"; };
    source.addEventListener("tenant", e => { const t = JSON.parse(e.data); tenants.set(t.namespace + "/" + t.name, t); render(); });
    source.addEventListener("tenant-deleted", e => { const t = JSON.parse(e.data); tenants.delete(t.namespace + "/" + t.name); render(); });
  }
  ns.addEventListener("change", connect);
  filter.addEventListener("input", render);
  document.getElementById("scope").addEventListener("submit", e => { e.preventDefault(); connect(); });
  // Keyboard: arrow keys move between rows.
  body.addEventListener("keydown", e => {
    const row = e.target.closest("tr");
    if (!row) return;
    const to = e.key === "ArrowDown" ? row.nextElementSibling : e.key === "ArrowUp" ? row.previousElementSibling : null;
    if (to) { to.focus(); e.preventDefault(); }
  });
  connect();
})();
