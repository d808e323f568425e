// Voice: the microphone (with its level meter) and the speaker (with `played`).
//
// The microphone runs getUserMedia → an AudioWorklet at the session's rate →
// PCM16 frames of 20 ms, each sent as one binary frame; the worklet measures
// each frame's loudness for the meter. The speaker schedules the model's
// speech back to back and reports, every PLAYED_EVERY ms while it plays (and
// at once when a barge-in stops it), how much of the answer was heard:
// `played(seq, ms)`: ms of the answer's audio, up to the audio tagged `seq`.
const AUDIO_RATE = 24000; // Hz, the model's speech (protocol/audio.py)
const PLAYED_EVERY = 250; // ms

export class Voice {
  /**
   * hooks: {client() → Client|null, state(text, kind), level(0..1), changed(), problem(text)}
   */
  constructor(hooks) {
    this.hooks = hooks;
    this.mic = null; // {context, stream, node} while the microphone is on
    this.inputRate = AUDIO_RATE;
    this.speaker = false;
    this.playback = null; // AudioContext playing the model's speech
    this.playAt = 0; // context time the next chunk starts
    this.chunks = []; // {source, seq, start, end, offset} scheduled and not ended
    this.answerMs = 0; // ms of the current answer's audio scheduled so far
    this.timer = null;
    this.framesSent = 0;
    this.chunksPlayed = 0;
    this.lastPlayed = null; // {seq, ms} last reported
    this.playedTo = null; // {seq, ms} where the newest chunk that ended stopped
  }

  get micOn() {
    return Boolean(this.mic);
  }

  // ------------------------------------------------------------------ microphone

  async startMic(rate = AUDIO_RATE) {
    if (this.mic) return;
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
      });
    } catch (err) {
      this.hooks.problem(`The microphone is not available: ${err?.message ?? err}`);
      return;
    }
    // A context at the session's rate: the browser resamples the microphone.
    const context = new AudioContext({ sampleRate: rate });
    await context.audioWorklet.addModule("/static/mic-worklet.js");
    const node = new AudioWorkletNode(context, "mic-frames");
    node.port.onmessage = (msg) => {
      const { pcm, level } = msg.data;
      if (this.hooks.client()?.sendAudio(pcm)) this.framesSent += 1;
      this.hooks.level(level);
    };
    context.createMediaStreamSource(stream).connect(node);
    this.inputRate = rate;
    this.mic = { context, stream, node };
    this.hooks.state("Listening", "listening");
    this.hooks.changed();
  }

  stopMic() {
    const mic = this.mic;
    if (!mic) return;
    this.mic = null;
    mic.node.port.onmessage = null;
    for (const track of mic.stream.getTracks()) track.stop();
    mic.context.close();
    this.hooks.level(0);
    this.hooks.state("", "");
    this.hooks.changed();
  }

  // ------------------------------------------------------------------ speaker

  /** Speaker on: a context made on a click, so the browser lets it play. */
  enableSpeaker(on) {
    this.speaker = on;
    if (on && !this.playback) this.playback = new AudioContext({ sampleRate: AUDIO_RATE });
    if (!on) this.stop();
    this.hooks.changed();
  }

  /** The model's speech, scheduled back to back. */
  play(pcm16, seq) {
    const context = this.playback;
    if (!this.speaker || !context) return;
    const buffer = context.createBuffer(1, pcm16.length, AUDIO_RATE);
    const samples = buffer.getChannelData(0);
    for (let i = 0; i < pcm16.length; i++) samples[i] = pcm16[i] / 0x8000;
    const source = context.createBufferSource();
    source.buffer = buffer;
    source.connect(context.destination);
    const start = Math.max(this.playAt, context.currentTime + 0.05);
    const offset = this.answerMs;
    this.answerMs += buffer.duration * 1000;
    const chunk = { source, seq, start, end: start + buffer.duration, offset };
    source.onended = () => {
      this.chunks = this.chunks.filter((c) => c !== chunk);
      // Reported when playback goes idle: an answer played to its end says so (the
      // gateway would otherwise take the last tick's report as where it was cut).
      this.playedTo = { seq, ms: Math.round(offset + buffer.duration * 1000) };
      if (!this.chunks.length) this.idle();
    };
    this.chunks.push(chunk);
    source.start(start);
    this.playAt = chunk.end;
    this.chunksPlayed += 1;
    if (!this.timer) {
      this.timer = setInterval(() => this.report(), PLAYED_EVERY);
      this.hooks.state("Speaking", "speaking");
    }
  }

  /** A new turn: its answer's audio counts from 0. */
  newAnswer() {
    this.answerMs = 0;
    this.playedTo = null;
  }

  /** How much of the answer was heard, as `played(seq, ms)`. */
  position() {
    const context = this.playback;
    if (!context) return null;
    const now = context.currentTime;
    let current = null;
    for (const c of this.chunks) if (c.start <= now) current = c;
    if (!current) return this.playedTo ?? this.lastPlayed;
    const ms = current.offset + Math.min(now - current.start, current.end - current.start) * 1000;
    return { seq: current.seq, ms: Math.round(ms) };
  }

  report() {
    const at = this.position();
    if (!at) return;
    if (this.lastPlayed && at.seq === this.lastPlayed.seq && at.ms === this.lastPlayed.ms) return;
    this.lastPlayed = at;
    this.hooks.client()?.played(at.seq, at.ms);
  }

  /** Stop at once (a barge-in, the speaker off): report where it stopped. */
  stop() {
    if (this.chunks.length) this.report();
    for (const c of this.chunks) {
      c.source.onended = null;
      c.source.stop();
    }
    this.chunks = [];
    this.playAt = 0;
    this.idle();
  }

  idle() {
    if (this.timer) {
      clearInterval(this.timer);
      this.timer = null;
      this.report();
    }
    this.hooks.state(this.mic ? "Listening" : "", this.mic ? "listening" : "");
  }

  reset() {
    this.stop();
    this.answerMs = 0;
    this.lastPlayed = null;
    this.playedTo = null;
  }
}
