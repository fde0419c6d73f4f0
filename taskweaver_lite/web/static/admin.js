// The admin page: users (add, rotate, promote, demote, expire, remove), sessions with their owners,
// kernels per user, usage per user, and the audit trail. Everything comes from /api/admin/... (admins only).
"use strict";

const $ = (id) => document.getElementById(id);

function utc(seconds) {
  return seconds == null ? "never" : new Date(seconds * 1000).toISOString().slice(0, 16).replace("T", " ");
}

function notice(text) {
  const box = $("notice");
  box.textContent = text || "";
  box.hidden = !text;
}

async function api(path, options = {}) {
  const answer = await fetch(path, { credentials: "same-origin", ...options });
  const body = await answer.json().catch(() => ({}));
  if (!answer.ok) throw new Error(body.error || `HTTP ${answer.status}`);
  return body;
}

function send(path, method, data) {
  const options = { method, headers: { "Content-Type": "application/json" } };
  if (data !== undefined) options.body = JSON.stringify(data);
  return api(path, options);
}

function row(table, cells, extra) {
  const tr = document.createElement("tr");
  for (const text of cells) {
    const td = document.createElement("td");
    td.textContent = text == null ? "" : String(text);
    tr.append(td);
  }
  if (extra) tr.append(extra);
  $(table).querySelector("tbody").append(tr);
  return tr;
}

function clear(table) {
  $(table).querySelector("tbody").replaceChildren();
}

function showToken(name, token) {
  $("token-user").textContent = name;
  $("token-value").textContent = token;
  $("token-shown").hidden = false;
}

function button(text, title, action) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.title = title;
  b.addEventListener("click", async () => {
    try {
      await action();
      await load();
    } catch (failure) {
      notice(failure.message);
    }
  });
  return b;
}

function userActions(user, me) {
  const td = document.createElement("td");
  const path = `/api/admin/users/${encodeURIComponent(user.name)}`;
  td.append(button("Rotate", "A new token (shown once); the old one stops at once", async () => {
    const made = await send(`${path}/rotate`, "POST");
    showToken(made.name, made.token);
  }));
  if (user.admin) {
    if (user.name !== me) td.append(button("Demote", "A user again: their own sessions only", () => send(`${path}/demote`, "POST")));
  } else {
    td.append(button("Promote", "An admin: every user's sessions", () => send(`${path}/promote`, "POST")));
  }
  td.append(button("Expire", "The token stops working at once (rotate gives a new one)", () => send(`${path}/expire`, "POST", { days: 0 })));
  if (user.name !== me) {
    td.append(button("Remove", "Their token and sign-ins stop at once; their sessions stay", async () => {
      if (confirm(`Remove ${user.name}? Their token stops working at once; their sessions stay.`)) await send(path, "DELETE");
    }));
  }
  return td;
}

async function load() {
  const me = await api("/api/me");
  $("who").textContent = me.name ? `Signed in as ${me.name}` : "";
  const [users, sessions, kernels, usage, audit] = await Promise.all([
    api("/api/admin/users"), api("/api/admin/sessions"), api("/api/admin/kernels"), api("/api/admin/usage"), api("/api/admin/audit"),
  ]);
  clear("users");
  for (const user of users) {
    row("users", [user.name, user.admin ? "admin" : "user", utc(user.created_at), utc(user.expires_at)], userActions(user, me.name));
  }
  clear("sessions");
  for (const s of sessions) row("sessions", [s.id, s.owner || "-", s.title, s.rounds, utc(s.last_active)]);
  clear("kernels");
  $("kernels-where").textContent = kernels.gateway ? `On the gateway ${kernels.gateway}${kernels.error ? `: ${kernels.error}` : ""}` : "Kernels run on this server: the sessions open here.";
  for (const k of kernels.kernels) row("kernels", [k.owner || "-", k.session || "(no session)", k.kernel || "-", k.state, k.last_activity || ""]);
  clear("usage");
  for (const u of usage) {
    const models = Object.entries(u.models);
    if (models.length === 0) row("usage", [u.user, u.sessions, u.cells, u.cell_seconds.toFixed(1), "-", 0, 0, 0]);
    for (const [model, m] of models) row("usage", [u.user, u.sessions, u.cells, u.cell_seconds.toFixed(1), model, m.calls, m.prompt_tokens, m.completion_tokens]);
  }
  clear("audit");
  for (const e of audit.slice().reverse()) row("audit", [e.time.replace("T", " ").replace("Z", ""), e.actor, e.action, e.target, e.source, e.detail]);
}

document.addEventListener("DOMContentLoaded", () => {
  $("add-user").addEventListener("submit", async (event) => {
    event.preventDefault();
    const days = $("new-days").value;
    try {
      const made = await send("/api/admin/users", "POST", { name: $("new-name").value.trim(), admin: $("new-admin").checked, expires_days: days ? Number(days) : null });
      showToken(made.name, made.token);
      $("add-user").reset();
      await load();
    } catch (failure) {
      notice(failure.message);
    }
  });
  load().catch((failure) => notice(failure.message));
});
