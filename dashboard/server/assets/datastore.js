// The DataStore page: one EventSource on the DataStore's stream (a watch
// made as the user); the page changes as events arrive, no polling.
"use strict";
(function () {
  const {el, row, conditionRows} = apiary;
  const name = document.body.dataset.name;
  const status = document.getElementById("status");
  let ds = null;
  function render() {
    if (!ds) return;
    const items = [];
    const add = (k, v) => { if (v !== undefined && v !== null && v !== "") items.push(el("dt", k), el("dd", v)); };
    add("Ready", ds.ready + (ds.reason ? " (" + ds.reason + ")" : ""));
    add("Kind", ds.managed ? "managed etcd" + (ds.version ? " " + ds.version : "") : "external etcd");
    add("Members", ds.readyMembers + " ready of " + ds.members);
    add("Tenants", ds.tenants);
    add("Endpoints", (ds.endpoints || []).join(", "));
    document.getElementById("summary").replaceChildren(...items);
    document.querySelector("#conditions tbody").replaceChildren(...conditionRows(ds.conditions));
    document.querySelector("#members tbody").replaceChildren(...(ds.memberList || []).map(m => row([m.name, m.id, m.learner ? "learner" : "voting"])));
  }
  const source = new EventSource("/api/datastores/" + encodeURIComponent(name) + "/stream");
  source.onopen = () => { status.textContent = "live"; };
  source.onerror = () => { status.textContent = "reconnecting… (or no right to read this DataStore)"; };
  source.addEventListener("datastore", e => { ds = JSON.parse(e.data); render(); });
  source.addEventListener("datastore-deleted", () => { status.textContent = "this DataStore was deleted"; source.close(); });
  setInterval(render, 15000);
})();
