// The microphone, as 24 kHz PCM16 in 20 ms frames, posted to the page (voice.js), which sends
// each as an input_audio_buffer.append. The context runs at the device's rate (often 48 kHz):
// going down, each output sample is the mean of the input samples its interval covers (a box
// filter: enough against aliasing for speech and VAD); going up, linear interpolation.

const OUT_RATE = 24000;
const FRAME = OUT_RATE / 50; // 20 ms

class Pcm16Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / OUT_RATE; // input samples per output sample
    this.pos = 0; // where the next output sample starts, in input samples from this block's start
    this.sum = 0; // box filter: the running sum and count of the current output sample
    this.n = 0;
    this.prev = 0; // linear interpolation: the last sample of the previous block
    this.frame = new Int16Array(FRAME);
    this.filled = 0;
  }

  emit(value) {
    const v = Math.max(-1, Math.min(1, value));
    this.frame[this.filled++] = v < 0 ? v * 32768 : v * 32767;
    if (this.filled === FRAME) {
      this.port.postMessage(this.frame.buffer, [this.frame.buffer]);
      this.frame = new Int16Array(FRAME);
      this.filled = 0;
    }
  }

  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0) return true;
    const samples = input[0];
    if (this.step >= 1) {
      for (let i = 0; i < samples.length; i++) {
        this.sum += samples[i];
        this.n += 1;
        if (i + 1 >= this.pos + this.step) {
          this.emit(this.sum / this.n);
          this.sum = 0;
          this.n = 0;
          this.pos += this.step;
        }
      }
      this.pos -= samples.length;
    } else {
      // output sample k sits at input position pos + k*step, between samples floor and floor+1
      // (position -1 is the previous block's last sample)
      while (this.pos < samples.length - 1) {
        const i = Math.floor(this.pos);
        const left = i < 0 ? this.prev : samples[i];
        const frac = this.pos - i;
        this.emit(left + (samples[i + 1] - left) * frac);
        this.pos += this.step;
      }
      this.pos -= samples.length;
      this.prev = samples[samples.length - 1];
    }
    return true;
  }
}

registerProcessor("pcm16-capture", Pcm16Capture);
