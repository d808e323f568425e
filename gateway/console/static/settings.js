// The settings panel: the session's configuration as a form, sent as one `configure`.
//
// The providers and models offered are the node's (/node.json); what the
// session runs with is the last `configured` event, shown as JSON under the
// form and copied into it unless the user is editing. A refusal (a client
// token, a key's policy, a bad value) is shown where Apply was pressed.
import { fmtClock, h, icon } from "/static/dom.js";

// Suggestions only: any name the provider knows may be typed.
const VOICES = {
  openai: ["alloy", "ash", "ballad", "cedar", "coral", "echo", "marin", "sage", "shimmer", "verse"],
  gemini: ["Aoede", "Charon", "Fenrir", "Kore", "Leda", "Orus", "Puck", "Zephyr"],
};

export class Settings {
  /** hooks: {apply(fields) → Promise<configured event>, pageTools: [spec], canConfigure() → bool,
   *  door(on): connect through the OpenAI door (on) or the gateway's own (off)} */
  constructor(root, hooks) {
    this.root = root;
    this.hooks = hooks;
    this.offer = { provider: "", providers: [] };
    this.dirty = false;
    this.config = null;
    this.build();
  }

  build() {
    let fields = 0;
    const field = (label, control, hint = "") => {
      fields += 1;
      control.id = control.id || `setting-${fields}`;
      const hintNode = hint ? h("span", { class: "field-hint", id: `${control.id}-hint` }, hint) : null;
      if (hintNode) control.setAttribute("aria-describedby", hintNode.id);
      return h("div", { class: "field" }, h("label", { class: "field-label", for: control.id }, label), control, hintNode);
    };
    const changed = () => this.markDirty();
    this.instructions = h("textarea", { rows: "4", placeholder: "e.g. You answer in one short sentence.", oninput: changed });
    this.provider = h("select", { onchange: () => { this.fillModels(); changed(); } });
    this.modelList = h("datalist", { id: "model-list" });
    this.model = h("input", { type: "text", list: "model-list", spellcheck: "false", autocomplete: "off", oninput: changed });
    this.confirmTool = h("input", { type: "checkbox", checked: true, onchange: changed });
    this.tools = h("textarea", { rows: "4", class: "mono", spellcheck: "false", placeholder: '[{"name": "get_time", "description": "…", "parameters": {"type": "object"}}]', oninput: changed });
    this.micInput = h("input", { type: "checkbox", onchange: () => { this.syncVoice(); changed(); } });
    this.rate = h("select", { onchange: changed }, h("option", { value: "24000" }, "24 kHz"), h("option", { value: "16000" }, "16 kHz"));
    this.turnDetection = h(
      "select",
      { onchange: changed },
      h("option", { value: "server_vad" }, "Server VAD (the gateway hears the end)"),
      h("option", { value: "none" }, "None (press Commit to end a turn)"),
    );
    this.outputText = h("input", { type: "radio", name: "output", value: "text", checked: true, onchange: () => { this.syncVoice(); changed(); } });
    this.outputAudio = h("input", { type: "radio", name: "output", value: "audio", onchange: () => { this.syncVoice(); changed(); } });
    this.voiceList = h("datalist", { id: "voice-list" });
    this.voice = h("input", { type: "text", list: "voice-list", placeholder: "the provider's default", spellcheck: "false", autocomplete: "off", oninput: changed });
    this.apply = h("button", { type: "submit", class: "primary" }, "Apply");
    this.revert = h("button", { type: "button", onclick: () => this.fromConfig(this.config ?? {}, true) }, "Revert");
    this.status = h("p", { class: "settings-status", role: "status", "aria-live": "polite" });
    this.readOnly = h("p", { class: "callout", hidden: true }, "This connection uses a client token: only the app's backend (with the API key) can change the session's configuration.");
    this.answer = h("pre", { class: "config-json", "aria-label": "The configuration the session runs with" }, "not configured yet: the node's defaults");

    const form = h(
      "form",
      { class: "settings-form", onsubmit: (e) => { e.preventDefault(); this.submit(); } },
      this.readOnly,
      h("fieldset", null, h("legend", null, "Model"),
        h("div", { class: "field-row" },
          field("Provider", this.provider),
          field("Model", this.model, "empty: the provider's default")),
        this.modelList,
      ),
      h("fieldset", null, h("legend", null, "Instructions"),
        field("Session instructions", this.instructions, "Appended to the operator's: a session cannot replace them."),
      ),
      h("fieldset", null, h("legend", null, "Client tools"),
        h("label", { class: "check" }, this.confirmTool, h("span", null, h("code", null, "confirm"), " — the model asks you a yes/no question in this page")),
        field("More tools (JSON array)", this.tools, "Calls to tools without a handler here get an answer form in the conversation."),
      ),
      h("fieldset", null, h("legend", null, "Voice"),
        h("label", { class: "check" }, this.micInput, h("span", null, "Microphone input (PCM16)")),
        h("div", { class: "field-row voice-in" }, field("Rate", this.rate), field("Turn detection", this.turnDetection)),
        h("div", { class: "radio-row", role: "radiogroup", "aria-label": "Answer as" },
          h("span", { class: "field-label" }, "Answer as"),
          h("label", { class: "check" }, this.outputText, h("span", null, "Text")),
          h("label", { class: "check" }, this.outputAudio, h("span", null, "Speech (text as its transcript)"))),
        field("Voice", this.voice),
        this.voiceList,
      ),
      h("div", { class: "form-actions" }, this.apply, this.revert, this.status),
      h("details", { class: "config-answer", open: true }, h("summary", null, "Configured answer"), this.answer),
    );
    this.form = form;
    // Outside the form: which protocol the page speaks is no session setting (a client
    // token may switch it too).
    this.door = h("input", { type: "checkbox", onchange: () => this.hooks.door?.(this.door.checked) });
    const door = h("fieldset", { class: "settings-form door" }, h("legend", null, "Protocol"),
      h("label", { class: "check" }, this.door, h("span", null, "OpenAI door — a new session through ", h("code", null, "/openai/v1/realtime"), ", OpenAI's Realtime protocol, its frames in Events")));
    this.root.replaceChildren(door, form);
    this.syncVoice();
  }

  /** What the node offers (/node.json). */
  setOffer(offer) {
    this.offer = offer;
    const options = [h("option", { value: "" }, `Node default (${offer.provider || "?"})`)];
    for (const p of offer.providers) options.push(h("option", { value: p.name }, `${p.name} — ${p.label}`));
    const keep = this.provider.value;
    this.provider.replaceChildren(...options);
    this.provider.value = keep;
    this.fillModels();
  }

  providerOffer() {
    const name = this.provider.value || this.offer.provider;
    return this.offer.providers.find((p) => p.name === name);
  }

  fillModels() {
    const p = this.providerOffer();
    this.modelList.replaceChildren(...(p?.models ?? []).map((m) => h("option", { value: m })));
    this.model.placeholder = p ? `${p.default_model} (default)` : "the provider's default";
    this.voiceList.replaceChildren(...(VOICES[p?.wire] ?? VOICES.openai).map((v) => h("option", { value: v })));
  }

  syncVoice() {
    for (const control of this.root.querySelectorAll(".voice-in select")) control.disabled = !this.micInput.checked || this.locked;
    this.voice.disabled = !this.outputAudio.checked || this.locked;
  }

  setLocked(locked) {
    this.locked = locked;
    this.readOnly.hidden = !locked;
    if (locked && this.config === null) {
      this.answer.textContent = "set up by the app's backend (POST /v1/sessions): a client token cannot read it";
    }
    for (const control of this.form.querySelectorAll("input, select, textarea, button")) control.disabled = locked;
    this.syncVoice();
  }

  markDirty() {
    this.dirty = true;
    this.status.textContent = "Not applied yet";
    this.status.className = "settings-status pending";
  }

  /** The form as a configure's fields (the whole configuration this form sets). */
  fields() {
    let extra = [];
    const text = this.tools.value.trim();
    if (text) {
      extra = JSON.parse(text); // the caller reports a SyntaxError
      if (!Array.isArray(extra)) throw new SyntaxError("the tools are a JSON array of {name, description, parameters}");
    }
    const tools = [...(this.confirmTool.checked ? this.hooks.pageTools : []), ...extra];
    return {
      instructions: this.instructions.value,
      provider: this.provider.value,
      model: this.model.value.trim(),
      tools,
      input_audio: this.micInput.checked
        ? { format: "pcm16", rate: Number(this.rate.value), turn_detection: this.turnDetection.value }
        : null,
      output: this.outputAudio.checked ? "audio" : "text",
      voice: this.voice.value.trim(),
    };
  }

  async submit() {
    let fields;
    try {
      fields = this.fields();
    } catch (err) {
      this.fail(`More tools: ${err.message}`);
      this.tools.focus();
      return;
    }
    this.apply.disabled = true;
    this.status.textContent = "Applying…";
    this.status.className = "settings-status pending";
    try {
      const ev = await this.hooks.apply(fields);
      this.dirty = false;
      this.showConfigured(ev);
      this.status.replaceChildren(icon("check"), ` Applied at seq ${ev.seq}: from the next model step`);
      this.status.className = "settings-status ok";
    } catch (err) {
      this.fail(err?.content ? `${err.code}: ${err.content}` : String(err?.message ?? err));
    } finally {
      this.apply.disabled = Boolean(this.locked);
    }
  }

  fail(text) {
    this.status.replaceChildren(icon("alert"), ` ${text}`);
    this.status.className = "settings-status bad";
  }

  /** A `configured` event (ours, another client's, or replayed). */
  showConfigured(ev) {
    this.config = ev.config ?? {};
    this.answer.textContent = JSON.stringify(this.config, null, 2);
    this.answer.dataset.seq = String(ev.seq);
    this.answer.title = `seq ${ev.seq} at ${fmtClock(ev.timestamp)}`;
    if (!this.dirty) this.fromConfig(this.config, false);
  }

  fromConfig(config, reverted) {
    this.instructions.value = config.instructions ?? "";
    this.provider.value = config.provider ?? "";
    this.fillModels();
    this.model.value = config.model ?? "";
    const tools = config.tools ?? [];
    const pageNames = new Set(this.hooks.pageTools.map((t) => t.name));
    this.confirmTool.checked = this.config === null || tools.some((t) => pageNames.has(t.name));
    const extra = tools.filter((t) => !pageNames.has(t.name));
    this.tools.value = extra.length ? JSON.stringify(extra, null, 2) : "";
    this.micInput.checked = Boolean(config.input_audio);
    this.rate.value = String(config.input_audio?.rate ?? 24000);
    this.turnDetection.value = config.input_audio?.turn_detection ?? "server_vad";
    this.outputAudio.checked = config.output === "audio";
    this.outputText.checked = config.output !== "audio";
    this.voice.value = config.voice ?? "";
    this.syncVoice();
    if (reverted) {
      this.dirty = false;
      this.status.textContent = "";
      this.status.className = "settings-status";
    }
  }

  reset() {
    this.config = null;
    this.dirty = false;
    this.answer.textContent = "not configured yet: the node's defaults";
    delete this.answer.dataset.seq;
    this.fromConfig({}, true);
  }
}
