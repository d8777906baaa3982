// The page: tabs, the API key (kept in memory by api.js) and the model list; each tab is its
// own module.

import * as api from "./api.js";
import * as chat from "./chat.js";
import * as images from "./images.js";
import * as voice from "./voice.js";

const $ = (id) => document.getElementById(id);

// The model each tab uses: the server's pick to begin with (chat on a trained model, images
// and voice on one that draws and speaks), then the user's, kept per tab as the picker changes.
const hints = JSON.parse(document.querySelector('meta[name="omni-models"]')?.content || "{}");
const chosen = {};
let shown = "chat";

function showTab(name) {
  shown = name;
  for (const tab of document.querySelectorAll("[data-tab]")) {
    tab.setAttribute("aria-selected", String(tab.dataset.tab === name));
  }
  for (const section of document.querySelectorAll("main > .tab")) section.hidden = section.id !== name;
  pickModel();
}

// The shown tab's model in the picker: its own choice, else the server's hint, else the first.
function pickModel() {
  const select = $("model");
  const listed = [...select.options].map((o) => o.value);
  const want = [chosen[shown], hints[shown]].find((m) => listed.includes(m));
  if (want !== undefined) select.value = want;
}

// The served models, into the picker; the page's first call, so a wrong key shows here.
// data-models on <body>: their count, or "error"; only the latest load writes it.
let loads = 0;
async function loadModels() {
  const select = $("model");
  const load = ++loads;
  delete document.body.dataset.models;
  try {
    const list = await api.getJson("v1/models");
    if (load !== loads) return;
    select.replaceChildren(...list.data.map((m) => new Option(m.id, m.id)));
    pickModel();
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
$("model").addEventListener("change", () => {
  chosen[shown] = $("model").value;
});
$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  api.setKey($("api-key").value);
  loadModels();
});
chat.setup();
images.setup();
voice.setup();
loadModels();
