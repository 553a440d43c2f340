// What the pages share: building cells with textContent only (tenant
// names, messages and events may come from a hostile tenant: never HTML),
// ages, and the confirmation dialog every action goes through.
"use strict";
const apiary = (function () {
  function el(tag, text, attrs) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }
  function row(cells, attrs) {
    const tr = el("tr", null, attrs);
    for (const c of cells) {
      const td = el("td");
      if (c instanceof Node) td.appendChild(c); else td.textContent = c === undefined || c === null ? "" : String(c);
      tr.appendChild(td);
    }
    return tr;
  }
  // age is how long ago t was, as kubectl says it.
  function age(t) {
    if (!t) return "";
    const s = Math.max(0, Math.round((Date.now() - new Date(t).getTime()) / 1000));
    if (s < 120) return s + "s";
    if (s < 7200) return Math.floor(s / 60) + "m";
    if (s < 172800) return Math.floor(s / 3600) + "h";
    return Math.floor(s / 86400) + "d";
  }
  // until is how long until t.
  function until(t) { return t ? age(new Date(2 * Date.now() - new Date(t).getTime())) : ""; }
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  // post sends an action as JSON with the CSRF token; it resolves to the
  // answer's text, or rejects with the server's message.
  async function post(url, body) {
    const resp = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf}, body: JSON.stringify(body)});
    const text = await resp.text();
    if (!resp.ok) throw new Error(text.trim() || resp.statusText);
    return text;
  }
  // confirm asks in the page's dialog; it resolves to true only when the
  // user chose the confirming button (okLabel; none: nothing to confirm).
  function confirm(title, body, okLabel) {
    const d = document.getElementById("confirm");
    document.getElementById("confirm-title").textContent = title;
    document.getElementById("confirm-body").replaceChildren(...body);
    const ok = document.getElementById("confirm-ok");
    ok.hidden = !okLabel;
    ok.textContent = okLabel || "";
    d.returnValue = "";
    d.showModal();
    (okLabel ? ok : document.getElementById("confirm-cancel")).focus();
    return new Promise(resolve => d.addEventListener("close", () => resolve(d.returnValue === "ok"), {once: true}));
  }
  // conditionRows are the rows of a conditions table; those not True
  // (but for the ones listed in ok) stand out.
  function conditionRows(conds, ...ok) {
    return (conds || []).map(c => row([c.type, c.status, c.reason, c.message, age(c.since)],
      c.status !== "True" && !ok.includes(c.type) ? {class: "attention"} : {}));
  }
  // journalRows are the rows of a Host's journal, failed steps standing out.
  function journalRows(journal) {
    return (journal || []).map(s => row([s.name, s.result, age(s.started) + " ago",
      s.finished ? Math.round((new Date(s.finished) - new Date(s.started)) / 1000) + "s" : "running", s.attempts || 1, s.message],
      s.result === "Failed" ? {class: "attention"} : {}));
  }
  return {el, row, age, until, post, confirm, conditionRows, journalRows};
})();
