// The chat tab: POST v1/chat/completions streamed (SSE). Attachments go as content parts
// (images as image_url data URLs, audio as input_audio base64); images the model draws arrive
// as image_url parts of delta.content; a spoken answer's delta.audio.data (24 kHz PCM16) is
// played as it arrives, its delta.audio.transcript is the text.
//
// The section's data attributes count what the last answer brought (the browser test reads
// them): data-state (idle, streaming, done, error), data-chunks, data-audio-bytes,
// data-audio-chunks, data-images.

import * as api from "./api.js";
import { PcmPlayer, base64ToBytes } from "./player.js";

const AUDIO_FORMATS = {
  "audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/vnd.wave": "wav",
  "audio/mpeg": "mp3", "audio/mp3": "mp3", "audio/flac": "flac", "audio/x-flac": "flac",
  "audio/ogg": "ogg", "audio/opus": "opus", "audio/webm": "webm", "audio/mp4": "m4a",
  "audio/x-m4a": "m4a", "audio/aac": "aac",
};

const $ = (id) => document.getElementById(id);
const section = $("chat");
const history = []; // the conversation so far, as the API takes it
let attachments = []; // {kind: "image" | "audio", name, url, format}
let controller = null;
const player = new PcmPlayer();

function audioFormat(file) {
  return AUDIO_FORMATS[file.type] ?? file.name.split(".").pop().toLowerCase();
}

async function attach(files) {
  for (const file of files) {
    const kind = file.type.startsWith("image/") ? "image" : "audio";
    attachments.push({ kind, name: file.name, url: await api.readDataUrl(file), format: audioFormat(file) });
  }
  showAttachments();
}

function showAttachments() {
  const chips = $("chat-attachments");
  chips.replaceChildren();
  attachments.forEach((a, i) => {
    const chip = document.createElement("button");
    chip.type = "button";
    chip.className = "chip";
    chip.title = "remove";
    chip.textContent = `${a.kind === "image" ? "🖼" : "🔊"} ${a.name} ×`;
    chip.onclick = () => {
      attachments.splice(i, 1);
      showAttachments();
    };
    chips.append(chip);
  });
}

function contentOf(text) {
  if (attachments.length === 0) return text;
  const parts = text ? [{ type: "text", text }] : [];
  for (const a of attachments) {
    if (a.kind === "image") parts.push({ type: "image_url", image_url: { url: a.url } });
    else parts.push({ type: "input_audio", input_audio: { data: a.url.split(",", 2)[1], format: a.format } });
  }
  return parts;
}

function addMessage(role, content) {
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  const text = document.createElement("div");
  text.className = "text";
  el.append(text);
  if (typeof content === "string") text.textContent = content;
  else if (content) {
    text.textContent = content.filter((p) => p.type === "text").map((p) => p.text).join("");
    for (const p of content) {
      if (p.type === "image_url") addImage(el, p.image_url.url);
      if (p.type === "input_audio") {
        const audio = document.createElement("audio");
        audio.controls = true;
        audio.src = `data:audio/${p.input_audio.format};base64,${p.input_audio.data}`;
        el.append(audio);
      }
    }
  }
  $("chat-log").append(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

function addImage(el, src) {
  const img = document.createElement("img");
  img.alt = "image";
  img.src = src;
  el.append(img);
  return img;
}

function count(name, by = 1) {
  section.dataset[name] = String(Number(section.dataset[name]) + by);
}

function setBusy(busy) {
  $("chat-send").disabled = busy;
  $("chat-stop").disabled = !busy;
}

async function send() {
  const text = $("chat-input").value.trim();
  if (!text && attachments.length === 0) return;
  let extra;
  try {
    extra = api.extraFields($("chat-extra"));
  } catch (e) {
    api.status(`More request fields: ${e.message}`, true);
    return;
  }
  const user = { role: "user", content: contentOf(text) };
  const body = { model: api.model(), messages: [...history, user], stream: true, ...extra };
  if ($("chat-speak").checked) {
    body.modalities = ["text", "audio"];
    body.audio = { voice: $("chat-voice").value.trim() || "alloy", format: "pcm16" };
    player.ensure(); // inside the click: the context may start
  }
  addMessage("user", user.content);
  $("chat-input").value = "";
  attachments = [];
  showAttachments();
  const answer = addMessage("assistant", "");
  const out = answer.querySelector(".text");
  const thought = document.createElement("div"); // reasoning_content, shown apart from the answer
  thought.className = "reasoning";
  answer.prepend(thought);
  Object.assign(section.dataset, { state: "streaming", chunks: "0", audioBytes: "0", audioChunks: "0", images: "0" });
  controller = new AbortController();
  setBusy(true);
  let said = "";
  try {
    const r = await api.postJson("v1/chat/completions", body, controller.signal);
    if (!r.ok) throw new Error(await api.errorText(r));
    for await (const data of api.sseData(r)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      count("chunks");
      const delta = chunk.choices?.[0]?.delta;
      if (!delta) continue;
      const pieces = typeof delta.content === "string" ? [{ type: "text", text: delta.content }] : delta.content ?? [];
      for (const part of pieces) {
        if (part.type === "text") said += part.text;
        if (part.type === "image_url") {
          addImage(answer, part.image_url.url);
          count("images");
        }
      }
      if (delta.reasoning_content) thought.textContent += delta.reasoning_content;
      if (delta.audio?.transcript) said += delta.audio.transcript;
      if (delta.audio?.data) {
        const pcm = base64ToBytes(delta.audio.data);
        count("audioBytes", pcm.length);
        count("audioChunks");
        try {
          player.play(pcm, delta.audio.id);
        } catch (e) {
          api.status(`Cannot play audio: ${e.message}`, true);
        }
      }
      for (const call of delta.tool_calls ?? []) {
        said += call.function?.name ? `\n[${call.function.name}] ` : "";
        said += call.function?.arguments ?? "";
      }
      out.textContent = said;
    }
    history.push(user, { role: "assistant", content: said });
    section.dataset.state = "done";
    api.status("");
  } catch (e) {
    section.dataset.state = e.name === "AbortError" ? "done" : "error";
    if (e.name !== "AbortError") {
      answer.classList.add("error");
      out.textContent = said + (said ? "\n" : "") + e.message;
    }
  } finally {
    controller = null;
    setBusy(false);
  }
}

export function setup() {
  $("chat-form").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("chat-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $("chat-files").addEventListener("change", (e) => {
    attach([...e.target.files]).catch((err) => api.status(err.message, true));
    e.target.value = "";
  });
  $("chat-stop").addEventListener("click", () => {
    controller?.abort();
    player.stop();
  });
  $("chat-clear").addEventListener("click", () => {
    controller?.abort();
    player.stop();
    history.length = 0;
    $("chat-log").replaceChildren();
  });
}
