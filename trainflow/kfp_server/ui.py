"""A one-page run browser for the local server.

It answers the same link form as the KFP UI (``/#/runs/details/<run_id>``), so the Airflow
extra link of a run submitted to the local server opens something useful. It only reads the
v2beta1 API and ``/local/runs/<id>/log`` (served without terminal colour codes).

When the server requires a token, the page asks for it once and keeps it in the browser's
``localStorage`` for this origin; every request sends it as ``Authorization: Bearer``. (Not a
cookie: a cookie would ride along on other sites' requests too.)
"""

INDEX_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>trainflow local KFP</title>
<style>
 body { font-family: sans-serif; margin: 2em; }
 table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
 .SUCCEEDED { color: #137333; } .FAILED { color: #c5221f; } .RUNNING, .PENDING { color: #1a73e8; }
 .CANCELED, .CANCELING { color: #888; }
 pre { background: #f6f6f6; padding: 1em; max-height: 30em; overflow: auto; }
</style>
</head>
<body>
<h1><a href="#/runs">trainflow local KFP</a></h1>
<div id="content">loading...</div>
<script>
const API = "/apis/v2beta1";
const TOKEN_KEY = "trainflow-kfp-token";
class NeedToken extends Error {}
function esc(s) { const d = document.createElement("div"); d.textContent = s ?? ""; return d.innerHTML; }
async function get(url) {
  const token = localStorage.getItem(TOKEN_KEY);
  const r = await fetch(url, { headers: token ? { Authorization: "Bearer " + token } : {} });
  if (r.status === 401 || r.status === 403) throw new NeedToken(r.status === 403 ? "the token was refused" : "");
  if (!r.ok) throw new Error(url + ": " + r.status);
  return r;
}
async function getJson(url) { return (await get(url)).json(); }
function askToken(reason) {
  document.getElementById("content").innerHTML =
    `<form id="token-form"><p>This server needs its token (trainflow kfp-server --auth-token-file, ` +
    `or TRAINFLOW_KFP_SERVER_TOKEN). ${esc(reason)}</p>` +
    `<input id="token" type="password" autocomplete="off" size="40"> ` +
    `<button id="token-save" type="submit">Use token</button></form>`;
  document.getElementById("token-form").addEventListener("submit", ev => {
    ev.preventDefault();
    localStorage.setItem(TOKEN_KEY, document.getElementById("token").value.trim());
    route();
  });
}
async function showRuns() {
  const data = await getJson(API + "/runs?sort_by=created_at%20desc&page_size=100");
  const rows = (data.runs || []).map(r =>
    `<tr><td><a href="#/runs/details/${esc(r.run_id)}">${esc(r.display_name)}</a></td>` +
    `<td class="${esc(r.state)}">${esc(r.state)}</td><td>${esc(r.created_at)}</td></tr>`).join("");
  document.getElementById("content").innerHTML =
    `<h2>Runs</h2><table><tr><th>Run</th><th>State</th><th>Created</th></tr>${rows}</table>`;
}
async function showRun(id) {
  const r = await getJson(API + "/runs/" + encodeURIComponent(id));
  const tasks = ((r.run_details || {}).task_details || []).map(t =>
    `<tr><td>${esc(t.display_name)}</td><td class="${esc(t.state)}">${esc(t.state)}</td></tr>`).join("");
  const log = await (await get("/local/runs/" + encodeURIComponent(id) + "/log")).text();
  document.getElementById("content").innerHTML =
    `<h2 id="run-name">${esc(r.display_name)}</h2>` +
    `<p>State: <b id="run-state" class="${esc(r.state)}">${esc(r.state)}</b></p>` +
    (r.error ? `<p id="run-error">${esc(r.error.message)}</p>` : "") +
    `<p>Run ID: <code id="run-id">${esc(r.run_id)}</code></p>` +
    `<h3>Tasks</h3><table>${tasks}</table><h3>Log</h3><pre id="run-log">${esc(log)}</pre>`;
}
async function route() {
  const m = location.hash.match(/^#\\/runs\\/details\\/([^/?]+)/);
  try { if (m) await showRun(decodeURIComponent(m[1])); else await showRuns(); }
  catch (e) {
    if (e instanceof NeedToken) askToken(e.message);
    else document.getElementById("content").textContent = String(e);
  }
}
window.addEventListener("hashchange", route);
route();
</script>
</body>
</html>
"""
