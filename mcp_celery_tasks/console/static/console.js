// The console's only script (the Content-Security-Policy allows no inline code). On a task's
// page it follows the task's live stream and replaces each [data-live] element's text; values
// are set with textContent, never as HTML.
"use strict";

function applyState(state) {
  for (const element of document.querySelectorAll("[data-live]")) {
    const name = element.dataset.live;
    if (!(name in state)) continue;
    if (name === "timeline") {
      const items = state.timeline.map(([when, what]) => {
        const item = document.createElement("li");
        const time = document.createElement("time");
        time.textContent = when;
        item.append(time, " " + what);
        return item;
      });
      element.replaceChildren(...items);
    } else {
      element.textContent = state[name];
    }
    if (name === "display_status") element.className = "status s-" + state[name];
  }
  for (const element of document.querySelectorAll("[data-live-while]")) {
    element.hidden = !state[element.dataset.liveWhile];
  }
}

function follow(url) {
  const note = document.getElementById("live-note");
  const source = new EventSource(url);
  source.addEventListener("state", (event) => {
    const state = JSON.parse(event.data);
    applyState(state);
    if (note) note.textContent = state.final ? "" : "live";
    if (state.final) source.close();
  });
  source.addEventListener("gone", () => {
    if (note) note.textContent = "this task no longer exists";
    source.close();
  });
  source.onerror = () => {
    if (note) note.textContent = "reconnecting…";
  };
}

// A list page: each shown row's status, status message and attempts, as they change; on the
// first page, new rows under its filter too.
function followRows(url) {
  const source = new EventSource(url);
  source.addEventListener("row", (event) => {
    const state = JSON.parse(event.data);
    const row = document.querySelector(`tr[data-job="${CSS.escape(state.job)}"]`);
    if (!row) return;
    for (const cell of row.querySelectorAll("[data-row-live]")) {
      const name = cell.dataset.rowLive;
      cell.textContent = state[name];
      if (name === "status") cell.className = "status s-" + state[name];
    }
  });
  source.addEventListener("new", (event) => addRow(JSON.parse(event.data)));
  source.addEventListener("settled", () => source.close());
}

// A task created since the first page was shown: on top, its cells as text.
function addRow(state) {
  const body = document.querySelector("#tasks tbody");
  if (!body || body.querySelector(`tr[data-job="${CSS.escape(state.job)}"]`)) return;
  for (const empty of body.querySelectorAll("td.empty")) empty.parentElement.remove();
  const row = document.createElement("tr");
  row.dataset.job = state.job;
  row.className = "new";
  const link = document.createElement("a");
  link.href = `${location.pathname}/${encodeURIComponent(state.job)}`;
  link.textContent = state.job;
  const cells = [
    [link], ["status", "status s-" + state.status], ["tool"], ["owner"], ["queue"],
    ["status_message", "message"], ["created"], ["attempts", "n"], ["finished"],
  ];
  for (const [what, className] of cells) {
    const cell = document.createElement("td");
    if (what instanceof Element) {
      cell.append(what);
    } else {
      cell.textContent = state[what];
      if (["status", "status_message", "attempts"].includes(what)) cell.dataset.rowLive = what;
    }
    if (className) cell.className = className;
    row.append(cell);
  }
  body.prepend(row);
}

document.addEventListener("DOMContentLoaded", () => {
  const url = document.body.dataset.live;
  if (url) follow(url);
  const list = document.body.dataset.listLive;
  if (list) followRows(list);
});
