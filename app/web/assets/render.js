// How a message and each of its parts look. Everything from the service is set as
// text (el() and textContent), but for a finished agent message's text, which is
// Markdown rendered by markdown-it with raw HTML off (so any HTML in it shows as
// text), images off (nothing is fetched from elsewhere) and links to http(s) and
// mailto only; links elsewhere go through link(), which admits http(s) only.
//
// The DOM is the tests' contract too: `.message[data-message-id][data-sequence]
// [data-role][data-state]`, each part `.part[data-part-id][data-type]`, and a text
// part's text, exactly as stored, in its `.text-body`'s `data-source`.

import { el, link, timeOf } from "./common.js";
// markdown-it 14 (MIT), vendored as its own distribution file: it defines
// globalThis.markdownit.
import "./markdown-it.min.js";

const markdown = globalThis.markdownit({ html: false, linkify: true, breaks: true });
markdown.disable("image");
markdown.validateLink = (url) => /^(https?:|mailto:)/i.test(String(url).trim());
// A table cell's alignment comes as a style attribute, which the page's CSP refuses.
markdown.core.ruler.push("no_inline_style", (state) => {
  for (const token of state.tokens) {
    if (token.attrs) token.attrs = token.attrs.filter(([name]) => name !== "style");
  }
});
markdown.renderer.rules.link_open = (tokens, index, options, env, self) => {
  tokens[index].attrSet("target", "_blank");
  tokens[index].attrSet("rel", "noopener noreferrer");
  return self.renderToken(tokens, index, options);
};

// Interaction statuses that still wait for a decision (the Approve/Deny buttons).
const OPEN_INTERACTIONS = new Set(["pending", "requested", "open", "waiting", "awaiting", "awaiting_approval"]);
const IMAGE_TYPES = /^image\/(png|jpeg|gif|webp)$/;
const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

function json(value) {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2) ?? String(value);
  } catch {
    return String(value);
  }
}

/** A text part's text, as Markdown when `asMarkdown` (a finished agent message's),
 * else as it streams: plain text. With citations it is plain text too: each cited
 * span is marked and numbered by
 * its source, and the sources are listed under the text. Offsets count UTF-16 code
 * units, as the stream's delta offsets do (what String.length and slice count); spans
 * out of range or overlapping an earlier one are not marked. */
function textPart(part, asMarkdown) {
  const text = typeof part.text === "string" ? part.text : "";
  const annotations = Array.isArray(part.annotations) ? part.annotations : [];
  const body = el("div", { class: "text-body", dataset: { source: text } });
  if (annotations.length === 0) {
    if (asMarkdown) {
      body.classList.add("markdown");
      body.innerHTML = markdown.render(text);
    } else {
      body.textContent = text;
    }
    return [body];
  }
  const sources = new Map(); // uri (or title) -> {number, source, verified}
  const numberOf = (annotation) => {
    const source = annotation?.source ?? {};
    const key = String(source.uri ?? source.title ?? "");
    if (!sources.has(key)) sources.set(key, { number: sources.size + 1, source, verified: annotation.verified });
    return sources.get(key).number;
  };
  const spans = annotations
    .filter((a) => a && Number.isInteger(a.start) && Number.isInteger(a.end) && a.start >= 0 && a.start < a.end && a.end <= text.length)
    .sort((a, b) => a.start - b.start || b.end - a.end);
  let at = 0;
  for (const annotation of spans) {
    const number = numberOf(annotation);
    if (annotation.start < at) continue;
    if (annotation.start > at) body.append(text.slice(at, annotation.start));
    const title = annotation.source?.title ?? annotation.source?.uri;
    body.append(
      el("mark", {
        class: "cited",
        dataset: { ref: number },
        title: title === undefined ? undefined : String(title),
        text: text.slice(annotation.start, annotation.end),
      }),
    );
    at = annotation.end;
  }
  if (at < text.length) body.append(text.slice(at));
  for (const annotation of annotations) if (annotation?.source) numberOf(annotation);
  const list = el(
    "ol",
    { class: "sources", "aria-label": "Sources" },
    [...sources.values()].map(({ number, source, verified }) =>
      el(
        "li",
        { value: number },
        source.uri ? link(source.uri, String(source.title ?? source.uri)) : String(source.title ?? "source"),
        verified?.status
          ? el("span", {
              class: `verified verified-${String(verified.status).replace(/[^a-z]/g, "")}`,
              text: ` · ${verified.status}${typeof verified.score === "number" ? ` (${verified.score})` : ""}`,
            })
          : null,
        source.snippet ? el("span", { class: "snippet", text: String(source.snippet) }) : null,
      ),
    ),
  );
  return [body, list];
}

function reasoningText(text) {
  if (typeof text === "string") return text; // live: the text so far
  if (!text || typeof text !== "object") return "";
  if (text.kind === "summary" && Array.isArray(text.parts)) return text.parts.map(String).join("\n\n");
  if (text.kind === "redacted") return "(withheld by the provider)";
  return typeof text.text === "string" ? text.text : "";
}

function reasoningPart(part, streaming) {
  const label = streaming ? "Reasoning…" : "Reasoning";
  const tokens = Number.isInteger(part.tokens) ? ` · ${part.tokens} tokens` : "";
  // Collapsed unless opened: the reader asks for it.
  return el(
    "details",
    { class: "part reasoning" },
    el("summary", { text: label + tokens }),
    el("div", { class: "reasoning-body", text: reasoningText(part.text) }),
  );
}

function toolResultBody(result) {
  if (!result) return null;
  return el(
    "div",
    { class: "tool-result" },
    result.error !== undefined && result.error !== null
      ? [el("span", { class: "label", text: "Error" }), el("pre", { class: "error-text", text: json(result.error) })]
      : [el("span", { class: "label", text: "Result" }), el("pre", { text: json(result.result) })],
  );
}

/** A client-side tool waiting for its result: a JSON result, or an error, sent as
 * `POST .../tool-results` (the client's submitToolResults()). */
function toolAnswer(part, context) {
  const id = String(part.id ?? "");
  const input = el("textarea", {
    class: "answer-input",
    rows: 3,
    placeholder: '{"result": "…"} (JSON) or, for an error, its text',
    "aria-label": `Result of ${String(part.name ?? "the tool")}`,
  });
  const failure = el("p", { class: "error-text", role: "alert" });
  const answer = (asError) => {
    let result;
    if (asError) {
      result = { tool_call_id: id, error: input.value || "failed" };
    } else {
      try {
        result = { tool_call_id: id, result: JSON.parse(input.value) };
      } catch {
        failure.textContent = "Not JSON: a result is a JSON value (a string needs its quotes).";
        return;
      }
    }
    failure.textContent = "";
    for (const button of node.querySelectorAll("button")) button.disabled = true;
    context.answerTool(result).catch((error) => {
      failure.textContent = String(error?.message ?? error);
      for (const button of node.querySelectorAll("button")) button.disabled = false;
    });
  };
  const node = el(
    "div",
    { class: "tool-answer" },
    el("span", { class: "label", text: "This tool runs in your app: answer it" }),
    input,
    el(
      "div",
      { class: "actions" },
      el("button", { type: "button", class: "send-result", text: "Send result", onclick: () => answer(false) }),
      el("button", { type: "button", class: "send-error", text: "Send as error", onclick: () => answer(true) }),
    ),
    failure,
  );
  return node;
}

function toolCallPart(part, result, context) {
  const status = String(part.status ?? (result ? (result.error ? "failed" : "completed") : "ready"));
  return [
    el(
      "div",
      { class: "tool-head" },
      el("span", { class: "label", text: "Tool" }),
      el("span", { class: "tool-name", text: String(part.name ?? "tool") }),
      el("span", { class: "badge tool-status", text: status }),
    ),
    el("span", { class: "label", text: "Arguments" }),
    el("pre", { class: "tool-arguments", text: json(part.arguments ?? {}) }),
    toolResultBody(result),
    status === "awaiting_client" && !result && context.answerTool ? toolAnswer(part, context) : null,
  ];
}

/** A decision in words: "Approved", "Denied: <reason>". */
function decisionText(response) {
  if (response && typeof response === "object" && typeof response.decision === "string") {
    const said = response.decision === "approve" ? "Approved" : response.decision === "deny" ? "Denied" : response.decision;
    return typeof response.reason === "string" && response.reason ? `${said}: ${response.reason}` : said;
  }
  return json(response);
}

function interactionPart(part, context) {
  const status = String(part.status ?? "");
  const nodes = [
    el(
      "div",
      { class: "tool-head" },
      el("span", { class: "label", text: "Interaction" }),
      el("span", { class: "tool-name", text: String(part.kind ?? "interaction") }),
      el("span", { class: "badge interaction-status", text: status }),
    ),
  ];
  if (part.prompt) nodes.push(el("div", { class: "prompt", text: String(part.prompt) }));
  if (part.response !== undefined && part.response !== null) {
    nodes.push(el("p", { class: "decision", text: decisionText(part.response) }));
  }
  if (OPEN_INTERACTIONS.has(status)) {
    const id = String(part.interaction_id ?? "");
    // Disabled once a decision is sent (until it is refused): one click, one decision.
    const busy = context.responding.has(id);
    const button = (decision, text) =>
      el("button", {
        type: "button",
        class: `decide ${decision}`,
        dataset: { decision },
        text,
        disabled: busy,
        onclick: () => context.respond(id, decision),
      });
    nodes.push(el("div", { class: "actions" }, button("approve", "Approve"), button("deny", "Deny")));
    const failure = context.failures.get(id);
    if (failure) nodes.push(el("p", { class: "error-text", text: failure }));
  }
  return nodes;
}

function imagePart(part) {
  if (typeof part.base64 === "string" && IMAGE_TYPES.test(String(part.media_type)) && BASE64.test(part.base64)) {
    const image = el("img", { alt: "image" });
    image.src = `data:${part.media_type};base64,${part.base64}`;
    return [image];
  }
  // A remote image is linked, not loaded: the page contacts no other origin.
  return [el("span", { class: "label", text: "Image " }), part.url ? link(part.url) : "(no preview)"];
}

function partNode(part, message, context, result) {
  const type = String(part.type);
  const base = { dataset: { partId: part.part_id, type } };
  const streaming = message.state === "streaming";
  switch (type) {
    case "text":
      return el("div", { class: "part text", ...base }, textPart(part, message.role === "agent" && !streaming));
    case "reasoning": {
      const node = reasoningPart(part, streaming);
      Object.assign(node.dataset, { partId: part.part_id ?? "", type });
      return node;
    }
    case "tool_call":
      return el("div", { class: "part tool", ...base, dataset: { ...base.dataset, status: part.status } }, toolCallPart(part, result, context));
    case "tool_result":
      return el(
        "div",
        { class: "part tool", ...base },
        el("span", { class: "label", text: `Tool result for ${part.tool_call_id ?? "a call"}` }),
        toolResultBody(part),
      );
    case "interaction":
      return el(
        "div",
        { class: "part interaction", ...base, dataset: { ...base.dataset, status: part.status, interactionId: part.interaction_id } },
        interactionPart(part, context),
      );
    case "action":
      return el(
        "div",
        { class: "part action", ...base, dataset: { ...base.dataset, state: part.state, actionType: part.action_type } },
        el("span", { class: "label", text: "Action " }),
        el("span", { class: "tool-name", text: String(part.title ?? part.action_type ?? "") }),
        part.state ? el("span", { class: "badge action-state", text: String(part.state) }) : null,
        part.data !== undefined && part.data !== null ? el("pre", { text: json(part.data) }) : null,
      );
    case "error":
      return el(
        "div",
        { class: "part error", role: "alert", ...base },
        el("span", { class: "code", text: String(part.code ?? "error") }),
        el("span", { class: "error-message", text: String(part.message ?? "") }),
      );
    case "context":
      return el(
        "div",
        { class: "part context", ...base },
        el("span", { class: "label", text: `<${part.tag ?? "context"}>` }),
        el("div", { class: "text-context", text: String(part.context ?? "") }),
      );
    case "image":
      return el("div", { class: "part attachment", ...base }, imagePart(part));
    case "image_file":
    case "file":
      return el(
        "div",
        { class: "part attachment", ...base },
        el("span", { class: "label", text: type === "file" ? "File " : "Image file " }),
        String(part.filename ?? part.file_id ?? part.image_id ?? ""),
      );
    default:
      return el("div", { class: "part other", ...base }, el("span", { class: "label", text: type }), el("pre", { text: json(part) }));
  }
}

function metaNode(message) {
  return el(
    "div",
    { class: "meta" },
    el("span", { class: "who", text: message.role === "user" ? "You" : "Agent" }),
    el("span", { class: "sequence", text: `#${message.sequence}` }),
    timeOf(message.created_at),
    message.phase === "commentary" ? el("span", { class: "badge", text: "commentary" }) : null,
    message.visibility === "internal" ? el("span", { class: "badge", text: "internal" }) : null,
    message.state === "streaming" ? el("span", { class: "badge state", text: "streaming…" }) : null,
  );
}

/** What a turn ran with and did, from its durable events (read when first opened):
 * the model, steps, tool calls, time and token usage, then every event, each
 * expandable to its data. */
function turnDetailsNode(message, context) {
  const turnId = String(message.turn_id ?? "");
  const body = el("div", { class: "turn-body" });
  const details = el(
    "details",
    { class: "turn-details", dataset: { turnId } },
    el("summary", { text: "Turn details" }),
    body,
  );
  const show = (events) => {
    const started = events.find((e) => e.type === "output.message.started");
    const ended = events.find((e) => ["turn.completed", "turn.failed", "turn.cancelled"].includes(e.type));
    const data = ended?.data ?? {};
    const facts = [
      ["Model", started?.data?.model],
      ["Outcome", ended ? ended.type.replace("turn.", "") : "running"],
      ["Steps", data.iterations],
      ["Tool calls", data.tool_call_count],
      ["Time", Number.isInteger(data.duration_ms) ? `${(data.duration_ms / 1000).toFixed(1)} s` : undefined],
      ...Object.entries(data.usage ?? {}).map(([name, value]) => [name.replaceAll("_", " "), value]),
    ].filter(([, value]) => value !== undefined && value !== null);
    body.replaceChildren(
      el("dl", { class: "turn-facts" }, facts.map(([name, value]) => [el("dt", { text: name }), el("dd", { text: String(value) })])),
      el(
        "ol",
        { class: "turn-events", "aria-label": "Events" },
        events.map((event) =>
          el(
            "li",
            { dataset: { type: event.type } },
            el(
              "details",
              {},
              el("summary", {}, el("span", { class: "event-type", text: event.type }), " ", timeOf(event.ts)),
              el("pre", { text: json(event.data) }),
            ),
          ),
        ),
      ),
    );
  };
  details.addEventListener("toggle", () => {
    if (!details.open || details.dataset.loaded) return;
    details.dataset.loaded = "yes";
    body.replaceChildren(el("p", { text: "Reading the turn's events…" }));
    context.turnEvents(turnId).then(show, (error) => {
      delete details.dataset.loaded;
      body.replaceChildren(el("p", { class: "error-text", text: `Events could not be read: ${error?.message ?? error}` }));
    });
  });
  return details;
}

/** Ask again in a branch: Regenerate an answer, or Edit a question (the text goes
 * to the message box, and sending asks it in a fork). */
function branchNode(message, context) {
  const agent = message.role === "agent";
  return el(
    "div",
    { class: "branch" },
    el("button", {
      type: "button",
      class: agent ? "regenerate" : "edit",
      text: agent ? "Regenerate" : "Edit",
      title: agent ? "Ask this again in a new branch" : "Change this and ask it in a new branch",
      onclick: () => context.branch(message),
    }),
  );
}

/** Thumbs up / down on a finished agent message: this key's rating, pressed when
 * given; pressing the given one again takes it back. */
function feedbackNode(message, context) {
  const given = context.ratings.get(message.id) ?? null;
  const button = (rating, text, label) =>
    el("button", {
      type: "button",
      class: `rate ${rating}`,
      dataset: { rating },
      text,
      title: label,
      "aria-label": label,
      "aria-pressed": String(given === rating),
      onclick: () => context.rate(message.id, given === rating ? null : rating),
    });
  return el(
    "div",
    { class: "feedback" },
    button("good", "👍", "Good answer"),
    button("bad", "👎", "Bad answer"),
  );
}

/** The rendered messages, keyed by id: a message is rebuilt only when the view hands
 * a new object for it, and a part only when it changed (an opened reasoning part
 * stays open while its message streams on). */
export class MessageList {
  constructor(container, context) {
    this.container = container;
    this.context = { responding: new Set(), failures: new Map(), ratings: new Map(), ...context };
    this.nodes = new Map(); // message id -> {message, node, parts: Map<key, {signature, node}>}
  }

  get first() {
    return this.container.firstElementChild;
  }

  render(messages, { force = false } = {}) {
    const seen = new Set();
    const order = [];
    for (const message of messages) {
      seen.add(message.id);
      let entry = this.nodes.get(message.id);
      if (!entry) {
        entry = { message: undefined, node: el("article", { class: "message" }), parts: new Map() };
        this.nodes.set(message.id, entry);
      }
      if (force || entry.message !== message) this.update(entry, message);
      order.push(entry.node);
    }
    for (const [id, entry] of this.nodes) {
      if (!seen.has(id)) {
        entry.node.remove();
        this.nodes.delete(id);
      }
    }
    // Moves only what is out of place (an older page goes in front).
    let previous = null;
    for (const node of order) {
      const expected = previous ? previous.nextSibling : this.container.firstChild;
      if (expected !== node) this.container.insertBefore(node, expected);
      previous = node;
    }
  }

  update(entry, message) {
    entry.message = message;
    const node = entry.node;
    Object.assign(node.dataset, {
      messageId: message.id,
      sequence: message.sequence,
      role: message.role,
      state: message.state,
      visibility: message.visibility ?? "visible",
      revision: message.revision,
    });
    const content = Array.isArray(message.content) ? message.content : [];
    // A tool's result shows under its call; a result without a call stands alone.
    const calls = new Set(content.filter((p) => p?.type === "tool_call").map((p) => p.id));
    const results = new Map(content.filter((p) => p?.type === "tool_result").map((p) => [p.tool_call_id, p]));
    const parts = new Map();
    const children = [metaNode(message)];
    content.forEach((part, index) => {
      if (!part || typeof part !== "object") return;
      if (part.type === "tool_result" && calls.has(part.tool_call_id)) return;
      const result = part.type === "tool_call" ? results.get(part.id) : undefined;
      const key = part.part_id ?? `#${index}`;
      const signature = JSON.stringify([part, result, message.state, this.interactionState(part)]);
      let held = entry.parts.get(key);
      if (!held || held.signature !== signature) {
        const fresh = partNode(part, message, this.context, result);
        if (held?.node instanceof HTMLDetailsElement && fresh instanceof HTMLDetailsElement) fresh.open = held.node.open;
        held = { signature, node: fresh };
      }
      parts.set(key, held);
      children.push(held.node);
    });
    if (message.state === "streaming" && children.length === 1) {
      children.push(el("div", { class: "part typing", "aria-label": "The agent is writing", text: "…" }));
    }
    if (message.role === "agent" && message.state !== "streaming" && this.context.rate) {
      children.push(feedbackNode(message, this.context));
    }
    if (this.context.branch && message.state !== "streaming" && (message.role === "user" || message.turn_id)) {
      children.push(branchNode(message, this.context));
    }
    if (message.role === "agent" && message.state !== "streaming" && message.turn_id && this.context.turnEvents) {
      // Kept across updates of the message (a rating; every message rendered again
      // once the key's earlier ratings are read, which may be after the first
      // render), so details someone opened stay open with the events already read.
      if (entry.turnDetails?.dataset.turnId !== String(message.turn_id)) {
        entry.turnDetails = turnDetailsNode(message, this.context);
      }
      children.push(entry.turnDetails);
    }
    entry.parts = parts;
    node.replaceChildren(...children);
  }

  interactionState(part) {
    if (part.type !== "interaction") return null;
    const id = String(part.interaction_id ?? "");
    return [this.context.responding.has(id), this.context.failures.get(id) ?? null];
  }
}
