// The server's API as the page reaches it. URLs are relative to the page's <base href>, which
// the server set to its root path. The API key lives in this module's memory only: never in
// localStorage or a cookie; a reload forgets it.

let key = "";

export function setKey(value) {
  key = value.trim();
}

export function url(path) {
  return new URL(path, document.baseURI).href;
}

export function wsUrl(path) {
  const u = new URL(path, document.baseURI);
  u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
  return u.href;
}

// A browser's WebSocket cannot send headers: the key travels as a subprotocol, as OpenAI's
// browser clients send it; the server answers with `realtime`.
export function wsProtocols() {
  return key ? ["realtime", "openai-insecure-api-key." + key] : ["realtime"];
}

// A file the user picked, as a data: URL (what the API takes for an image or audio part).
export function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

export function headers(extra = {}) {
  const h = { ...extra };
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

export function postJson(path, body, signal) {
  return fetch(url(path), {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body),
    signal,
  });
}

export async function getJson(path) {
  const r = await fetch(url(path), { headers: headers() });
  if (!r.ok) throw new Error(await errorText(r));
  return r.json();
}

// "401: Incorrect API key provided." from an OpenAI error body, or the status line.
export async function errorText(r) {
  try {
    const body = await r.json();
    return `${r.status}: ${body.error?.message ?? JSON.stringify(body)}`;
  } catch {
    return `${r.status} ${r.statusText}`;
  }
}

export function model() {
  return document.getElementById("model").value;
}

// The JSON object of a "more fields" box ({} when empty).
export function extraFields(textarea) {
  const text = textarea.value.trim();
  if (!text) return {};
  const value = JSON.parse(text);
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new Error("the extra fields must be a JSON object");
  }
  return value;
}

export function status(text, isError = false) {
  const out = document.getElementById("status");
  out.textContent = text;
  out.classList.toggle("error", isError);
}

// Server-sent events of a fetch response: yields each event's data (the lines after "data:").
export async function* sseData(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = block
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) yield data;
    }
  }
}
