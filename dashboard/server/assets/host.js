// The Host page: one EventSource on the Host's stream (a watch made as the
// user); the page changes as events arrive, no polling.
"use strict";
(function () {
  const {el, conditionRows, journalRows} = apiary;
  const ns = document.body.dataset.namespace, name = document.body.dataset.name;
  const status = document.getElementById("status");
  let h = null;
  function render() {
    if (!h) return;
    document.getElementById("phase").textContent = h.phase || "";
    const items = [];
    const add = (k, v) => { if (v !== undefined && v !== null && v !== "") items.push(el("dt", k), el("dd", v)); };
    const tenant = el("a", ns + "/" + h.tenant, {href: "/tenants/" + encodeURIComponent(ns) + "/" + encodeURIComponent(h.tenant)});
    items.push(el("dt", "Tenant"), el("dd")); items[items.length - 1].appendChild(tenant);
    add("Address", h.address);
    add("Role", h.role || "worker");
    add("Version", (h.version || "—") + (h.upgradingTo ? " → " + h.upgradingTo : ""));
    add("Node", h.nodeName);
    document.getElementById("summary").replaceChildren(...items);
    document.querySelector("#conditions tbody").replaceChildren(...conditionRows(h.conditions));
    document.querySelector("#journal tbody").replaceChildren(...journalRows(h.journal));
  }
  const source = new EventSource("/api/hosts/" + encodeURIComponent(ns) + "/" + encodeURIComponent(name) + "/stream");
  source.onopen = () => { status.textContent = "live"; };
  source.onerror = () => { status.textContent = "reconnecting… (or no right to read this Host)"; };
  source.addEventListener("host", e => { h = JSON.parse(e.data); render(); });
  source.addEventListener("host-deleted", () => { status.textContent = "this Host was deleted"; source.close(); });
  setInterval(render, 15000);
})();
