// The images tab: POST v1/images/generations (b64_json), each image shown as it came back.

import * as api from "./api.js";

const $ = (id) => document.getElementById(id);
const section = $("images");

async function generate() {
  let extra;
  try {
    extra = api.extraFields($("images-extra"));
  } catch (e) {
    api.status(`More request fields: ${e.message}`, true);
    return;
  }
  const body = {
    model: api.model(),
    prompt: $("images-prompt").value.trim(),
    size: $("images-size").value,
    n: Number($("images-n").value) || 1,
    response_format: "b64_json",
    ...extra,
  };
  const out = $("images-out");
  out.replaceChildren();
  Object.assign(section.dataset, { state: "drawing", images: "0" });
  $("images-send").disabled = true;
  api.status("Drawing…");
  try {
    const r = await api.postJson("v1/images/generations", body);
    if (!r.ok) throw new Error(await api.errorText(r));
    const result = await r.json();
    const type = `image/${body.output_format ?? "png"}`;
    for (const item of result.data) {
      const img = document.createElement("img");
      img.alt = body.prompt;
      img.src = item.b64_json ? `data:${type};base64,${item.b64_json}` : item.url;
      out.append(img);
    }
    section.dataset.images = String(result.data.length);
    section.dataset.state = "done";
    api.status("");
  } catch (e) {
    section.dataset.state = "error";
    api.status(e.message, true);
  } finally {
    $("images-send").disabled = false;
  }
}

export function setup() {
  $("images-form").addEventListener("submit", (e) => {
    e.preventDefault();
    generate();
  });
}
