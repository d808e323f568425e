// The microphone's AudioWorklet: Float32 samples → PCM16 little-endian frames of 20 ms.
//
// It runs in an AudioContext created at the session's input rate (24 kHz):
// the browser resamples the microphone into it, so this only converts and
// cuts. Each frame is posted (transferred, not copied) to the page with its
// loudness (RMS, 0..1) for the level meter; the page sends the frame as one
// binary WebSocket frame (protocol/audio.py).
class MicFrames extends AudioWorkletProcessor {
  constructor() {
    super();
    this.size = Math.round(sampleRate / 50); // 20 ms
    this.frame = new Int16Array(this.size);
    this.filled = 0;
    this.energy = 0;
  }

  process(inputs) {
    const channel = inputs[0]?.[0];
    if (!channel) return true;
    for (let i = 0; i < channel.length; i++) {
      const s = Math.max(-1, Math.min(1, channel[i]));
      this.energy += s * s;
      this.frame[this.filled++] = s < 0 ? s * 0x8000 : s * 0x7fff;
      if (this.filled === this.size) {
        const level = Math.sqrt(this.energy / this.size);
        this.port.postMessage({ pcm: this.frame.buffer, level }, [this.frame.buffer]);
        this.frame = new Int16Array(this.size);
        this.filled = 0;
        this.energy = 0;
      }
    }
    return true;
  }
}

registerProcessor("mic-frames", MicFrames);
