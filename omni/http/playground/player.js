// Plays 24 kHz PCM16 chunks (chat's delta.audio.data, realtime's output_audio deltas) as they
// arrive, back to back on one AudioContext, and knows how much of the current item was heard:
// barge-in stops playback and truncates the item at that point.

export const RATE = 24000;

export function base64ToBytes(b64) {
  const raw = atob(b64);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

export function bytesToBase64(bytes) {
  let raw = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    raw += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(raw);
}

export class PcmPlayer {
  constructor() {
    this.ctx = null;
    this.sources = new Set();
    this.next = 0; // when the queued audio ends, on the context's clock
    this.item = null; // the item now playing: {id, start, seconds}
  }

  // Create or resume the context; call it from a user's click (autoplay rules).
  ensure() {
    if (!this.ctx) this.ctx = new AudioContext();
    if (this.ctx.state === "suspended") this.ctx.resume();
    return this.ctx;
  }

  play(bytes, itemId = null) {
    const ctx = this.ensure();
    const count = bytes.length >> 1;
    if (count === 0) return;
    const view = new DataView(bytes.buffer, bytes.byteOffset, count * 2);
    const samples = new Float32Array(count);
    for (let i = 0; i < count; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    const buffer = ctx.createBuffer(1, count, RATE); // the context resamples to its own rate
    buffer.copyToChannel(samples, 0);
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(ctx.destination);
    // a small lead keeps the first chunk from starting late and clipping
    const at = Math.max(ctx.currentTime + 0.05, this.next);
    source.start(at);
    this.next = at + buffer.duration;
    this.sources.add(source);
    source.onended = () => this.sources.delete(source);
    if (!this.item || this.item.id !== itemId) this.item = { id: itemId, start: at, seconds: 0 };
    this.item.seconds += buffer.duration;
  }

  // Milliseconds of the current item the listener has heard, at most what was queued.
  heardMs() {
    if (!this.item || !this.ctx) return 0;
    const heard = Math.min(Math.max(this.ctx.currentTime - this.item.start, 0), this.item.seconds);
    return Math.floor(heard * 1000);
  }

  playing() {
    return this.sources.size > 0;
  }

  // Stop at once; returns {id, heardMs, queuedMs} of the last item played (heard in full when
  // heardMs == queuedMs), or null.
  stop() {
    const cut = this.item
      ? { id: this.item.id, heardMs: this.heardMs(), queuedMs: Math.floor(this.item.seconds * 1000) }
      : null;
    for (const source of this.sources) {
      try {
        source.stop();
      } catch {
        // not started yet on some browsers: nothing to stop
      }
    }
    this.sources.clear();
    this.next = 0;
    this.item = null;
    return cut;
  }
}
