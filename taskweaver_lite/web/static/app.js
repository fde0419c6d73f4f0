// The page: sessions, the chat with streamed replies, steps with code and outputs, uploads, context, export, saving experience.
// The Planner's messages are Markdown: rendered by marked, any raw HTML in them escaped (shown as
// text), and the result sanitized by DOMPurify before it enters the page. Everything else from the
// model and the kernel is inserted as text (textContent); a cell's HTML table goes into a sandboxed
// frame that may not run scripts, as tall as the table up to a limit, scrolling past it.
"use strict";

const $ = (id) => document.getElementById(id);
let current = null;      // the open session's id
let running = false;     // a request is being answered
let step = null;         // the step (details element) the CodeInterpreter is working on
let streaming = null;    // the Planner's bubble while its reply streams
let folders = [];        // the ends of the session's working and artifacts folders' paths on the server (`<id>/cwd`)
const produced = new Set();  // file names the session's cells saved or named: linked where an answer names them

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = text;
  return node;
}

const TABLE_MAX_HEIGHT = 480;  // px: a taller DataFrame scrolls inside its frame
const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHTML = (text) => text.replace(/[&<>"']/g, (c) => ESCAPES[c]);
// Raw HTML in the model's Markdown is shown as the text it is, never as markup.
marked.use({ gfm: true, breaks: true, renderer: { html: ({ text }) => escapeHTML(text) } });
const PURIFY = { USE_PROFILES: { html: true }, FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"], FORBID_ATTR: ["style"] };

// The prompt's markers around what code printed (<data>...</data>) are for the model, not the reader.
const unmark = (text) => text.replace(/^[ \t]*<\/?data>[ \t]*\n?/gm, "").replace(/<\/?data>/g, "");

function markdown(text) {
  const box = el("div", "md");
  box.innerHTML = DOMPurify.sanitize(marked.parse(unmark(text || ""), { async: false }), PURIFY);
  linkFiles(box);
  for (const link of box.querySelectorAll("a[href]")) link.rel = "noopener noreferrer";
  return box;
}

// A server path inside the session's folders, or a bare name of a file it produced, becomes a link to it.
const FILE = /(\/[^\s`'"<>()[\]]*[^\s`'"<>()[\].,;:!?])|([\w-][\w.-]*\.[A-Za-z0-9]{1,8})(?![\w/])/g;

function artifactName(text, path) {
  if (!path) return produced.has(text) ? text : null;
  const folder = folders.find((f) => path.includes(`/${f}/`));
  const name = folder && path.slice(path.lastIndexOf(`/${folder}/`) + folder.length + 2);
  return name && !name.includes("/") ? name : null;
}

function linkFiles(box) {
  const walker = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
  const texts = [];
  while (walker.nextNode()) if (!walker.currentNode.parentElement.closest("a")) texts.push(walker.currentNode);
  for (const node of texts) {
    const pieces = [];
    let last = 0;
    for (const match of node.data.matchAll(FILE)) {
      const name = current && artifactName(match[0], match[1]);
      if (!name) continue;
      pieces.push(node.data.slice(last, match.index));
      // The file's name is the link's text; the server's path (a temporary folder's, say) is only its tooltip.
      const link = el("a", "file", name);
      link.title = match[0];
      link.href = `/api/sessions/${encodeURIComponent(current)}/artifacts/${encodeURIComponent(name)}`;
      link.target = "_blank";
      pieces.push(link);
      last = match.index + match[0].length;
    }
    if (pieces.length) node.replaceWith(...pieces, node.data.slice(last));
  }
}

function remember(code, run) {
  for (const url of run.artifacts || []) produced.add(decodeURIComponent(url.split("/").pop()));
  if (run.success) for (const [, name] of code.matchAll(/["']([\w-][\w.-]*\.[A-Za-z0-9]{1,8})["']/g)) produced.add(name);
}

function notice(text) {
  const box = $("notice");
  box.textContent = text || "";
  box.hidden = !text;
}

async function api(path, options = {}) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  const body = response.headers.get("content-type")?.includes("json") ? await response.json() : null;
  if (!response.ok) throw new Error((body && body.error) || `${response.status} ${response.statusText}`);
  return body;
}

function postJSON(path, data) {
  return api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(data || {}) });
}

// --- who I am: the admin page's link for admins, a new token of one's own for every user -----------

async function showWhoIAm() {
  const me = await api("/api/me").catch(() => null);
  if (!me || !me.users) return;
  $("admin-link").hidden = !me.admin;
  $("new-token").hidden = false;
  $("new-token").onclick = async () => {
    if (!confirm("Make a new token for you? Your old one stops working at once (this page stays signed in).")) return;
    try {
      const made = await postJSON("/api/me/token");
      notice(`Your new token, shown this once (only its hash is kept): ${made.token}`);
    } catch (failure) {
      notice(failure.message);
    }
  };
}

// --- sessions -----------------------------------------------------------------------------------

async function listSessions() {
  try {
    const rows = await api("/api/sessions");
    const list = $("sessions");
    list.replaceChildren();
    for (const row of rows) {
      const item = el("li", row.id === current ? "current" : "", row.title || "(untitled)");
      const owner = row.owner ? ` · ${row.owner}` : "";  // whose it is: an admin sees every user's sessions
      item.append(el("span", "meta", `${row.rounds} request${row.rounds === 1 ? "" : "s"} · ${row.id}${owner}`));
      item.onclick = () => openSession(row.id, true);
      list.append(item);
    }
  } catch (error) {
    notice(`Could not list the sessions: ${error.message}`);
  }
}

async function newSession() {
  try {
    const { id } = await postJSON("/api/sessions");
    await openSession(id, false);
    listSessions();
  } catch (error) {
    notice(`Could not start a session: ${error.message}`);
  }
}

async function openSession(id, resume) {
  notice("");
  try {
    if (resume) {
      notice("Opening the session (earlier cells re-run to rebuild its variables)…");
      await postJSON(`/api/sessions/${encodeURIComponent(id)}/resume`);
    }
    const state = await api(`/api/sessions/${encodeURIComponent(id)}`);
    current = id;
    history.replaceState(null, "", `#${id}`);
    $("session-title").textContent = `Session ${id}`;
    for (const [link, format] of [["export-ipynb", "ipynb"], ["export-md", "md"]]) {
      $(link).href = `/api/sessions/${encodeURIComponent(id)}/export?format=${format}`;
      $(link).classList.remove("disabled");
    }
    $("show-context").disabled = false;
    $("save-experience").disabled = false;
    $("delete-session").disabled = false;
    const chat = $("chat");
    chat.replaceChildren();
    folders = state.folders || [];
    produced.clear();
    for (const round of state.rounds) showRound(round);
    following?.close();
    following = null;
    clearInterval(watching);
    if (!state.rounds.length) showSuggestions(state.suggested_requests || []);
    setRunning(state.busy);
    notice("");
    if (state.busy) follow(id, state.last_event);  // a request started elsewhere: shown as it is stored
    listSessions();
  } catch (error) {
    // After a server restart the session is stored but not open: re-open it.
    if (!resume && /not open in this server/.test(error.message)) return openSession(id, true);
    notice(error.message);
  }
}

// An empty session lists the requests the project suggests; a click asks one (typing its number does too).
function showSuggestions(requests) {
  if (!requests.length) return;
  const box = el("div", "msg system suggestions", "Try one of these requests (click it, or type its number):");
  const list = el("ol");
  for (const text of requests) {
    const item = el("li");
    const button = el("button", "suggestion", text);
    button.type = "button";
    button.onclick = () => send(text);
    item.append(button);
    list.append(item);
  }
  box.append(list);
  $("chat").append(box);
}

function showRound(round) {
  say("user", "You", round.text);
  step = null;
  for (const post of round.posts) showPost(post);
  if (round.answer !== null && round.answer !== undefined) say("planner", "Planner", round.answer);
  else if (round.state === "failed") say("error", "Failed", round.error || "This request failed.");
}

// --- the chat -------------------------------------------------------------------------------------

function say(kind, who, text) {
  const bubble = el("div", `msg ${kind}`);
  if (who) bubble.append(el("span", "who", who));
  bubble.append(kind === "planner" ? markdown(text) : document.createTextNode(text));
  $("chat").append(bubble);
  bubble.scrollIntoView({ block: "end" });
  return bubble;
}

function showPost(post) {
  if (post.from === "User" || post.to === "User") return;  // the request and the answer have their own bubbles
  if (post.step) {  // a step the Planner delegates to a role
    step = el("details", "step");
    step.open = true;
    step.append(el("summary", "", `Step → ${post.to}`));
    step.append(instruction(post.message));
    $("chat").append(step);
  } else if (post.execution) {
    showExecution(post.code || "", post.execution);
  } else if (post.from !== post.to) {  // a role's answer in text
    (step || $("chat")).append(instruction(`${post.from}: ${post.message}`));
  }
}

function instruction(text) {
  const box = markdown(text);
  box.classList.add("instruction");
  return box;
}

function currentStep() {
  if (!step) {
    step = el("details", "step");
    step.open = true;
    step.append(el("summary", "", "Step"));
    $("chat").append(step);
  }
  return step;
}

function showExecution(code, run) {
  remember(code, run);
  const box = currentStep();
  box.querySelector(".live")?.remove();
  const cell = el("details", "cell");
  cell.open = true;
  cell.append(el("summary", "", run.cancelled ? "Code (cancelled: its output until then)" : run.success ? "Code" : "Code (failed)"));
  cell.append(highlight(code));
  if (run.stdout) cell.append(el("pre", "out", run.stdout));
  if (run.stderr) cell.append(el("pre", "out err", run.stderr));
  if (run.html) {
    cell.append(tableFrame(run.html));
  } else if (run.result) {
    cell.append(el("pre", "out", run.result));
  }
  if (run.error) cell.append(el("pre", "out err", `${run.error.name}: ${run.error.value}`));
  for (const url of run.artifacts || []) {
    if (/\.(png|jpe?g|gif|svg)$/i.test(url)) {
      const image = el("img");
      image.src = url;
      image.alt = "plot";
      cell.append(image);
    } else {
      const link = el("a", "", url.split("/").pop());
      link.href = url;
      cell.append(link);
    }
  }
  cell.append(el("div", "outcome", run.outcome));
  box.append(cell);
  box.scrollIntoView({ block: "end" });
}

function tableFrame(html) {
  // No scripts run in the frame (no allow-scripts); same-origin only so the page can read its height.
  const frame = el("iframe", "table");
  frame.setAttribute("sandbox", "allow-same-origin");
  frame.srcdoc = `<style>body{font:12px/1.4 ui-monospace,monospace;margin:4px}table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:nowrap}</style>${html}`;
  frame.onload = () => {
    const height = frame.contentDocument?.documentElement.scrollHeight || 160;
    frame.style.height = `${Math.min(height + 2, TABLE_MAX_HEIGHT)}px`;
  };
  return frame;
}

const KEYWORDS = new Set("False None True and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield".split(" "));
const TOKEN = /(#[^\n]*)|("""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')|\b(\d+(?:\.\d+)?)\b|\b([A-Za-z_]\w*)\b/g;

function highlight(code) {
  const pre = el("pre", "code");
  let last = 0;
  for (const match of code.matchAll(TOKEN)) {
    if (match.index > last) pre.append(document.createTextNode(code.slice(last, match.index)));
    const [text, comment, string, number, word] = match;
    const kind = comment ? "com" : string ? "str" : number ? "num" : word && KEYWORDS.has(word) ? "kw" : "";
    pre.append(kind ? el("span", kind, text) : document.createTextNode(text));
    last = match.index + text.length;
  }
  pre.append(document.createTextNode(code.slice(last)));
  return pre;
}

function setRunning(value) {
  running = value;
  $("send").disabled = value || !current;
  $("text").disabled = !current;
  $("stop").hidden = !value;
}

let following = null;  // the EventSource that follows a request whose own stream dropped
let since = null;  // the id of the last stored event before the running request (from its stream's first line)
let answered = false;

async function send(text) {
  if (!current || running || !text.trim()) return;
  setRunning(true);
  notice("");
  step = null;
  streaming = null;
  since = null;
  answered = false;
  try {
    const response = await fetch(`/api/sessions/${encodeURIComponent(current)}/messages`, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ text }),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body.error || `${response.status} ${response.statusText}`);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const chunk = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of chunk.split("\n")) {
          if (line.startsWith("id: ")) since = Number(line.slice(4));  // the stored event this request's events come after
          else if (line.startsWith("data: ")) handle(JSON.parse(line.slice(6)));
        }
      }
    }
    if (since !== null && !answered) return follow(current, since);  // the stream ended early (a server stopping)
  } catch (error) {
    if (since !== null) return follow(current, since);
    notice(`The connection was lost (${error.message}). The session is kept on the server: reload the page to see where it stands.`);
  } finally {
    if (!following) setRunning(false);
    listSessions();
  }
}

// The request's own stream dropped (a proxy timeout, a server restarting): follow what the session
// stores instead, from any server; the browser reconnects by itself, sending Last-Event-ID.
// A server that died mid-request stores no end for its round: the session is then watched, and once
// no server runs a request in it any more (its lease ran out), it is shown as stored, Send enabled.
const WATCH_MS = 3000;
let watching = null;

function follow(id, after) {
  following = new EventSource(`/api/sessions/${encodeURIComponent(id)}/events?after=${after}`);
  notice("The connection dropped during the request: following it from the server's record…");
  setRunning(true);
  clearInterval(watching);
  watching = setInterval(() => stillRunning(id), WATCH_MS);
  following.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.type === "round_started") return;  // the request was shown when it was sent
    if (event.type === "post" && event.to === "User") handle({ type: "answer", text: event.message });
    else if (event.type === "round_ended" && event.state !== "finished") handle({ type: "error", message: event.error || "The request failed." });
    else handle(event);
    if (event.type === "round_ended") stopFollowing();
  };
}

async function stillRunning(id) {
  if (!following || current !== id) return;
  let state;
  try {
    state = await api(`/api/sessions/${encodeURIComponent(id)}`);
  } catch {
    return;  // the proxy or the store did not answer: asked again shortly
  }
  if (state.busy || !following || current !== id) return;
  const last = state.rounds[state.rounds.length - 1];
  stopFollowing();
  await openSession(id, false);
  if (last && last.state === "running") {
    notice("The server answering this request stopped before it finished. The session and what it stored are kept: send the request again.");
  }
}

function stopFollowing() {
  clearInterval(watching);
  watching = null;
  following?.close();
  following = null;
  notice("");
  setRunning(false);
  listSessions();
}

function handle(event) {
  switch (event.type) {
    case "round_started":
      $("chat").querySelector(".suggestions")?.remove();
      say("user", "You", event.text);
      break;
    case "delta":
      if (event.role === "planner" && event.fields.message) {
        streaming = streaming || say("planner", "Planner", "");
        streaming.lastChild.replaceWith(markdown(event.fields.message));
      }
      break;
    case "status":
      $("session-title").textContent = `Session ${current} — ${event.activity.replace("_", " ")}…`;
      break;
    case "output": {
      const box = currentStep();
      let live = box.querySelector(".live");
      if (!live) box.append((live = el("pre", "out live")));
      live.textContent += event.text;
      break;
    }
    case "post":
      if (event.step || event.to === "User") {  // the streamed bubble was the Planner's reply: the post replaces it
        streaming?.remove();
        streaming = null;
        if (event.to === "User") break;  // the answer event shows it
      }
      showPost(event);
      break;
    case "folded":
    case "file_loaded":
      say("system", "", event.text);
      break;
    case "answer":
      answered = true;
      streaming?.remove();
      say("planner", "Planner", event.text);
      $("session-title").textContent = `Session ${current}`;
      break;
    case "error":
      answered = true;
      streaming?.remove();
      say("error", "Error", event.message);
      $("session-title").textContent = `Session ${current}`;
      break;
  }
}

// --- uploads, stop, context -----------------------------------------------------------------------

async function upload(file) {
  if (!current) return notice("Open or start a session first.");
  const form = new FormData();
  form.append("file", file);
  try {
    const result = await api(`/api/sessions/${encodeURIComponent(current)}/files`, { method: "POST", body: form });
    say("system", "", result.text);
  } catch (error) {
    notice(`Could not load ${file.name}: ${error.message}`);
  }
}

async function showContext() {
  const box = $("context");
  if (!box.hidden) return (box.hidden = true);
  try {
    const { roles } = await api(`/api/sessions/${encodeURIComponent(current)}/context`);
    box.replaceChildren();
    const colors = ["#3b6fd8", "#27ae60", "#e67e22", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d"];
    for (const role of roles) {
      box.append(el("div", "", `${role.role}: ${role.total.toLocaleString()} of ${role.budget.toLocaleString()} tokens`));
      const bar = el("div", "bar");
      const legend = el("div", "legend");
      Object.entries(role.parts).forEach(([part, tokens], i) => {
        const piece = el("span");
        piece.style.width = `${(100 * tokens) / role.budget}%`;
        piece.style.background = colors[i % colors.length];
        piece.title = `${part}: ${tokens}`;
        bar.append(piece);
        const key = el("span", "", `${part} ${tokens}`);
        const swatch = el("i");
        swatch.style.background = colors[i % colors.length];
        key.prepend(swatch);
        legend.append(key);
      });
      box.append(bar, legend);
    }
    box.hidden = false;
  } catch (error) {
    notice(error.message);
  }
}

async function saveExperience() {
  if (!current) return;
  notice("Distilling this session into tips for later sessions…");
  try {
    const { saved } = await postJSON(`/api/sessions/${encodeURIComponent(current)}/experience`);
    notice("");
    const lines = saved.map((tip) => `#${tip.id} ${tip.kind.replace("_", " ")}: ${tip.text}`);
    say("system", "", saved.length ? `Saved ${saved.length} tip${saved.length === 1 ? "" : "s"} for later sessions:\n${lines.join("\n")}` : "Nothing in this session was worth keeping as a tip.");
  } catch (error) {
    notice(`Could not save the experience: ${error.message}`);
  }
}

// Deleting asks first: the session, its files, its kernel and the tips saved from it go for good.
async function deleteSession() {
  if (!current || !window.confirm(`Delete session ${current} for good? Its requests, files and the tips saved from it cannot be brought back.`)) return;
  try {
    await api(`/api/sessions/${encodeURIComponent(current)}`, { method: "DELETE" });
    following?.close();
    following = null;
    current = null;
    history.replaceState(null, "", location.pathname);
    $("session-title").textContent = "No session open";
    $("chat").replaceChildren();
    for (const id of ["show-context", "save-experience", "delete-session"]) $(id).disabled = true;
    for (const link of ["export-ipynb", "export-md"]) $(link).classList.add("disabled");
    setRunning(false);
    notice("The session was deleted.");
    listSessions();
  } catch (error) {
    notice(`Could not delete the session: ${error.message}`);
  }
}

window.addEventListener("DOMContentLoaded", () => {
  $("new-session").onclick = newSession;
  $("show-context").onclick = showContext;
  $("save-experience").onclick = saveExperience;
  $("delete-session").onclick = deleteSession;
  $("stop").onclick = () => current && postJSON(`/api/sessions/${encodeURIComponent(current)}/stop`).catch((e) => notice(e.message));
  $("composer").onsubmit = (event) => {
    event.preventDefault();
    const text = $("text").value;
    $("text").value = "";
    send(text);
  };
  $("text").onkeydown = (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  };
  $("file").onchange = () => [...$("file").files].forEach(upload);
  const chat = $("chat");
  chat.ondragover = (event) => { event.preventDefault(); chat.classList.add("dragging"); };
  chat.ondragleave = () => chat.classList.remove("dragging");
  chat.ondrop = (event) => {
    event.preventDefault();
    chat.classList.remove("dragging");
    [...event.dataTransfer.files].forEach(upload);
  };
  listSessions();
  showWhoIAm();
  // `#new` (serve --demo's link) opens the page on a new session; its own id then replaces it in the address.
  const wanted = location.hash.slice(1);
  if (wanted === "new") newSession();
  else if (wanted) openSession(wanted, false);
});
