// The page: tabs, the API key (kept in memory by api.js) and the model list; each tab is its
// own module.

import * as api from "./api.js";
import * as chat from "./chat.js";
import * as images from "./images.js";
import * as voice from "./voice.js";

const $ = (id) => document.getElementById(id);

function showTab(name) {
  for (const tab of document.querySelectorAll("[data-tab]")) {
    tab.setAttribute("aria-selected", String(tab.dataset.tab === name));
  }
  for (const section of document.querySelectorAll("main > .tab")) section.hidden = section.id !== name;
}

// The served models, into the picker; the page's first call, so a wrong key shows here.
// data-models on <body>: their count, or "error"; only the latest load writes it.
let loads = 0;
async function loadModels() {
  const select = $("model");
  const chosen = select.value;
  const load = ++loads;
  delete document.body.dataset.models;
  try {
    const list = await api.getJson("v1/models");
    if (load !== loads) return;
    select.replaceChildren(...list.data.map((m) => new Option(m.id, m.id)));
    if (list.data.some((m) => m.id === chosen)) select.value = chosen;
    document.body.dataset.models = String(list.data.length);
    api.status("");
  } catch (e) {
    if (load !== loads) return;
    document.body.dataset.models = "error";
    api.status(`Models: ${e.message}`, true);
  }
}

for (const tab of document.querySelectorAll("[data-tab]")) {
  tab.addEventListener("click", () => showTab(tab.dataset.tab));
}
$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  api.setKey($("api-key").value);
  loadModels();
});
chat.setup();
images.setup();
voice.setup();
loadModels();
