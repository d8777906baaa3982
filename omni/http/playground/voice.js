// The voice tab: a realtime conversation over GET v1/realtime (OpenAI's Realtime API, GA
// events). The microphone goes up as 24 kHz PCM16 appends (capture-worklet.js); the server's VAD
// decides the turns (server_vad), transcribes the user's turn, and answers in speech, played
// as its output_audio deltas arrive. Barge-in: when the user starts speaking, playback stops at
// once and the assistant's item is truncated at what was heard (the server, with
// interrupt_response, has cancelled the response itself). An image the user shows goes into the
// conversation as a user item of one input_image part (a data URL), and the next turns see it;
// shown before the call, it goes once the session is set up.
//
// The section's data attributes (the browser test reads them): data-state (idle, connecting,
// live, closed, error), data-audio-bytes and data-audio-chunks (output audio received),
// data-responses (response.done events), data-images (image items the server added),
// data-image-tokens (the last response's prompt tokens standing for images).

import * as api from "./api.js";
import { PcmPlayer, RATE, base64ToBytes, bytesToBase64 } from "./player.js";

const $ = (id) => document.getElementById(id);
const section = $("voice");
const player = new PcmPlayer();
let ws = null;
let started = 0; // performance.now() at the call's start
let mic = null; // {ctx, stream, node}
const lines = new Map(); // item id -> its line in the log
const silenced = new Set(); // items cut by barge-in: their late deltas are not played
let responding = false; // between response.created and response.done
let shown = []; // image items to create once the session is set up
let ready = false; // the session.update was answered

function count(name, by = 1) {
  section.dataset[name] = String(Number(section.dataset[name]) + by);
}

function line(itemId, role) {
  let el = lines.get(itemId);
  if (!el) {
    el = document.createElement("div");
    el.className = `msg ${role}`;
    el.dataset.item = itemId;
    const text = document.createElement("div");
    text.className = "text";
    el.append(text);
    $("voice-log").append(el);
    lines.set(itemId, el);
  }
  el.scrollIntoView({ block: "end" });
  return el;
}

function note(text, isError = false) {
  const el = document.createElement("div");
  el.className = isError ? "note error" : "note";
  el.textContent = text;
  $("voice-log").append(el);
}

function append(el, text) {
  el.querySelector(".text").textContent += text;
}

function send(event) {
  if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
}

function sessionUpdate(extra) {
  const session = {
    type: "realtime",
    output_modalities: ["audio"],
    audio: {
      input: {
        format: { type: "audio/pcm", rate: RATE },
        transcription: { model: api.model() },
        turn_detection: { type: "server_vad", create_response: true, interrupt_response: true },
      },
      output: { format: { type: "audio/pcm", rate: RATE }, voice: $("voice-voice").value.trim() || "alloy" },
    },
    ...extra,
  };
  const instructions = $("voice-instructions").value.trim();
  if (instructions) session.instructions = instructions;
  return { type: "session.update", session };
}

// An image into the conversation: a user item of its own, under an id of the page's so its line
// shows at once; the server's conversation.item.added (or an error naming the part) follows.
async function showImage(file) {
  const url = await api.readDataUrl(file);
  const id = `item_img_${Date.now().toString(36)}${Math.random().toString(36).slice(2, 10)}`;
  const el = line(id, "user");
  const img = document.createElement("img");
  img.src = url;
  img.alt = file.name;
  el.append(img);
  const event = { type: "conversation.item.create", item: { id, type: "message", role: "user",
                                                           content: [{ type: "input_image", image_url: url }] } };
  if (ready) send(event);
  else shown.push(event);
}

// The user speaks: silence the answer now. The server (interrupt_response) cancels a running
// response itself; the item keeps the audio it had, of which the user heard only part (or, if
// the response was still running, perhaps more was on its way): truncate it at what was heard.
// Deltas of the cut item still in flight are not played.
function bargeIn() {
  const cut = player.stop();
  if (cut && cut.id && (cut.heardMs < cut.queuedMs || responding)) {
    send({ type: "conversation.item.truncate", item_id: cut.id, content_index: 0, audio_end_ms: cut.heardMs });
    lines.get(cut.id)?.classList.add("interrupted");
    silenced.add(cut.id);
  }
}

const MAX_EVENTS = 200;
const STREAMED = /\.delta$/; // one line per run of deltas, not one per delta

// The server's events, newest last, each with the seconds since the call started.
function logEvent(event) {
  const list = $("voice-events");
  const last = list.lastElementChild;
  if (last && STREAMED.test(event.type) && last.dataset.type === event.type) {
    last.dataset.count = String(Number(last.dataset.count) + 1);
    last.lastChild.textContent = ` ×${last.dataset.count}`;
    return;
  }
  const li = document.createElement("li");
  li.dataset.type = event.type;
  li.dataset.count = "1";
  const detail = event.type === "error" ? ` ${event.error.message}` : event.type === "response.done" ? ` ${event.response.status}` : "";
  li.append(`${((performance.now() - started) / 1000).toFixed(2)} s ${event.type}${detail}`, document.createTextNode(""));
  list.append(li);
  while (list.childElementCount > MAX_EVENTS) list.firstElementChild.remove();
}

function onEvent(event) {
  logEvent(event);
  switch (event.type) {
    case "session.updated":
      ready = true;
      shown.forEach(send);
      shown = [];
      if (!mic) startMic().catch(fail);
      break;
    case "conversation.item.added":
      if (event.item.content?.some((p) => p.type === "input_image")) {
        count("images");
        line(event.item.id, "user").dataset.image = "added";
      }
      break;
    case "input_audio_buffer.speech_started":
      bargeIn();
      line(event.item_id, "user").classList.add("speaking");
      break;
    case "input_audio_buffer.speech_stopped":
      line(event.item_id, "user").classList.remove("speaking");
      break;
    case "conversation.item.input_audio_transcription.delta":
      append(line(event.item_id, "user"), event.delta);
      break;
    case "conversation.item.input_audio_transcription.completed": {
      const el = line(event.item_id, "user");
      el.querySelector(".text").textContent = event.transcript;
      el.dataset.transcribed = "true";
      break;
    }
    case "conversation.item.input_audio_transcription.failed":
      line(event.item_id, "user").dataset.transcribed = "failed";
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      append(line(event.item_id, "assistant"), event.delta);
      break;
    case "response.output_audio.delta": {
      const pcm = base64ToBytes(event.delta);
      count("audioBytes", pcm.length);
      count("audioChunks");
      line(event.item_id, "assistant");
      if (silenced.has(event.item_id)) break;
      try {
        player.play(pcm, event.item_id);
      } catch (e) {
        api.status(`Cannot play audio: ${e.message}`, true);
      }
      break;
    }
    case "response.created":
      responding = true;
      break;
    case "response.done":
      responding = false;
      count("responses");
      section.dataset.imageTokens = String(event.response.usage?.input_token_details?.image_tokens ?? 0);
      if (event.response.status === "failed") note(`response failed: ${JSON.stringify(event.response.status_details)}`, true);
      break;
    case "error":
      note(`${event.error.code ?? event.error.type}: ${event.error.message}`, true);
      break;
  }
}

async function startMic() {
  const ctx = new AudioContext();
  await ctx.audioWorklet.addModule(api.url("playground/capture-worklet.js"));
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  const node = new AudioWorkletNode(ctx, "pcm16-capture");
  node.port.onmessage = (e) => {
    send({ type: "input_audio_buffer.append", audio: bytesToBase64(new Uint8Array(e.data)) });
  };
  ctx.createMediaStreamSource(stream).connect(node);
  // a node must lead to the destination to be pulled; silent, so the user does not hear themself
  const mute = ctx.createGain();
  mute.gain.value = 0;
  node.connect(mute).connect(ctx.destination);
  await ctx.resume();
  mic = { ctx, stream, node };
  section.dataset.state = "live";
  api.status("Listening…");
}

function fail(e) {
  section.dataset.state = "error";
  note(e.message ?? String(e), true);
  hangUp();
}

function hangUp() {
  if (mic) {
    mic.stream.getTracks().forEach((t) => t.stop());
    mic.ctx.close();
    mic = null;
  }
  ws?.close();
  ws = null;
  ready = false;
  player.stop();
  $("voice-start").disabled = false;
  $("voice-stop").disabled = true;
  if (section.dataset.state !== "error") section.dataset.state = "closed";
  api.status("");
}

function start() {
  let extra;
  try {
    extra = api.extraFields($("voice-extra"));
  } catch (e) {
    api.status(`More session fields: ${e.message}`, true);
    return;
  }
  if (!navigator.mediaDevices?.getUserMedia || !window.AudioWorkletNode) {
    api.status("No microphone access here: the page needs https, or localhost.", true);
    return;
  }
  player.ensure(); // inside the click: the context may start
  lines.clear();
  silenced.clear();
  responding = false;
  const keep = [...$("voice-log").querySelectorAll(".msg.user:not([data-image])")].filter((el) => el.querySelector("img"));
  $("voice-log").replaceChildren(...keep); // images shown before the call go with it
  keep.forEach((el) => lines.set(el.dataset.item, el));
  $("voice-events").replaceChildren();
  started = performance.now();
  Object.assign(section.dataset, { state: "connecting", audioBytes: "0", audioChunks: "0", responses: "0", images: "0",
                                   imageTokens: "0" });
  $("voice-start").disabled = true;
  $("voice-stop").disabled = false;
  const model = api.model();
  try {
    ws = new WebSocket(api.wsUrl("v1/realtime" + (model ? `?model=${encodeURIComponent(model)}` : "")), api.wsProtocols());
  } catch (e) {
    fail(e); // e.g. a key that is no valid subprotocol token
    return;
  }
  const socket = ws;
  socket.onopen = () => socket.send(JSON.stringify(sessionUpdate(extra)));
  socket.onmessage = (m) => onEvent(JSON.parse(m.data));
  socket.onerror = () => {
    if (socket === ws) fail(new Error("the connection failed (a wrong API key is refused before it opens)"));
  };
  socket.onclose = (e) => {
    if (socket !== ws) return;
    if (e.code !== 1000 && e.code !== 1005) note(`closed: ${e.code} ${e.reason}`, e.code !== 1001);
    hangUp();
  };
}

export function setup() {
  $("voice-start").addEventListener("click", start);
  $("voice-stop").addEventListener("click", hangUp);
  $("voice-image").addEventListener("change", (e) => {
    [...e.target.files].forEach((file) => showImage(file).catch((err) => api.status(err.message, true)));
    e.target.value = ""; // the same file may be shown again
  });
}
