// The chat view of one session: a live `SyncView` of the JavaScript client (newest
// page, then every Mutation), older pages when scrolled to the top, a message box,
// Stop (cancel), a connection indicator, and the session's settings (title, model,
// approval mode, system prompt; delete). `?limit=N` sets the page size (1-200).

import { EvermirrorError, SyncView } from "./client/index.js";
import { $, askForKey, describe, el, forgetKey, isKeyRefusal, newClient, sleep, storedKey } from "./common.js";
import { MessageList } from "./render.js";

const STATUS_TEXT = {
  connecting: "Connecting…",
  live: "Live",
  reconnecting: "Reconnecting…",
  closed: "Disconnected",
  offline: "Offline",
};
// How close to an edge (px) counts as being at it.
const EDGE = 64;

const sessionId = decodeURIComponent(location.pathname.match(/\/sessions\/([^/]+)\/chat$/)?.[1] ?? "");
const requested = Number.parseInt(new URLSearchParams(location.search).get("limit") ?? "", 10);
const limit = Number.isInteger(requested) ? Math.min(200, Math.max(1, requested)) : 50;

const box = $("#messages");
const textBox = $("#text");
let session;
let view;
let sending = false;
let loadingOlder = false;
let renderScheduled = false;
// Every message is rebuilt at the next render (ratings read), keeping the scroll.
let rebuild = false;
// The session cannot be shown (not found, or refused): nothing will connect.
let unavailable = false;
// The id sent with a text, reused when the same text is sent again after a failure,
// so a retry the service did receive is not stored twice.
let attempt;

const list = new MessageList($("#list"), { respond, rate, answerTool, turnEvents, branch });
// The user message being edited: the next send asks the box's text in a fork before it.
let editing;
// The session as last read or saved: what the settings form starts from.
let info;

function notice(text) {
  $("#notice").textContent = text ?? "";
}

function showStatus() {
  const status = !navigator.onLine ? "offline" : (view?.status ?? (unavailable ? "closed" : "connecting"));
  const node = $("#status");
  node.dataset.status = status;
  node.textContent = STATUS_TEXT[status] ?? status;
}

function streaming() {
  const messages = view?.messages ?? [];
  const last = messages[messages.length - 1];
  // A turn runs while an agent message streams, or has just been started by the
  // newest (user) message.
  return messages.some((m) => m.state === "streaming") || last?.role === "user";
}

function showControls() {
  const usable = session !== undefined;
  $("#settings-toggle").disabled = !usable;
  // An empty session: a hint, with scenarios to try.
  $("#empty").hidden = !(view?.status === "live" && view.messages.length === 0 && !view.hasMore);
  textBox.disabled = !usable;
  $("#send").disabled = !usable || sending || textBox.value.trim() === "";
  $("#stop").disabled = !usable || !(streaming() || sending);
  const more = view?.hasMore ?? false;
  $("#load-older").hidden = !more || loadingOlder;
  $("#older-state").textContent = loadingOlder
    ? "Loading older messages…"
    : !more && view?.status === "live" && view.messages.length > 0
      ? "Start of the conversation"
      : "";
}

function scheduleRender() {
  if (renderScheduled) return;
  renderScheduled = true;
  requestAnimationFrame(render);
}

function render() {
  renderScheduled = false;
  showStatus();
  if (view) {
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < EDGE;
    // What the reader looks at stays put when an older page goes in above it.
    const anchor = list.first;
    const anchorTop = anchor?.getBoundingClientRect().top;
    list.render(view.messages, { force: rebuild });
    rebuild = false;
    if (atBottom) box.scrollTop = box.scrollHeight;
    else if (anchor?.isConnected) box.scrollTop += anchor.getBoundingClientRect().top - anchorTop;
  }
  showControls();
  // A page that does not fill the screen cannot be scrolled up: load the next one.
  if (view?.status === "live" && view.hasMore && box.scrollTop < EDGE && box.scrollHeight <= box.clientHeight) {
    loadOlder();
  }
}

async function loadOlder() {
  if (loadingOlder || !view?.hasMore) return;
  loadingOlder = true;
  showControls();
  try {
    await view.loadOlder();
  } catch (error) {
    notice(`Older messages could not be loaded: ${describe(error)}`);
  } finally {
    loadingOlder = false;
    scheduleRender();
  }
}

function newMessageId() {
  if (crypto.randomUUID) return crypto.randomUUID();
  // Not a secure context (plain http on another host): no randomUUID there.
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Regenerate an answer at once; edit a question through the message box. Either
 * way the service forks before the question, and the page moves to the branch. */
async function branch(message) {
  if (message.role === "user") {
    editing = message;
    textBox.value = message.content
      .filter((part) => part.type === "text")
      .map((part) => part.text)
      .join("");
    $("#editing").hidden = false;
    textBox.focus();
    showControls();
    return;
  }
  await askAgain(`/messages/${encodeURIComponent(message.id)}/regenerate`, undefined);
}

async function askAgain(suffix, body) {
  sending = true;
  showControls();
  try {
    const made = await session.client.request("POST", session.path(suffix), { body });
    location.assign(`../../sessions/${encodeURIComponent(made.session.id)}/chat`);
  } catch (error) {
    if (isKeyRefusal(error)) return restart(error);
    notice(`Not asked again: ${describe(error)}`);
    sending = false;
    showControls();
  }
}

function stopEditing() {
  editing = undefined;
  $("#editing").hidden = true;
  showControls();
}

async function send() {
  const text = textBox.value;
  if (!session || sending || text.trim() === "") return;
  if (editing) {
    const body = { message: { content: [{ type: "text", text }] } };
    return askAgain(`/messages/${encodeURIComponent(editing.id)}/edit`, body);
  }
  if (attempt?.text !== text) attempt = { text, id: newMessageId() };
  sending = true;
  showControls();
  try {
    await session.send(text, { client_message_id: attempt.id });
    attempt = undefined;
    notice("");
    if (textBox.value === text) textBox.value = "";
    box.scrollTop = box.scrollHeight;
  } catch (error) {
    if (isKeyRefusal(error)) return restart(error);
    notice(`Not sent: ${describe(error)}`);
  } finally {
    sending = false;
    showControls();
  }
}

async function stop() {
  if (!session) return;
  $("#stop").disabled = true;
  try {
    const answer = await session.cancel();
    notice(answer.status === "no_op" ? "Nothing was running." : "");
  } catch (error) {
    if (isKeyRefusal(error)) return restart(error);
    notice(`Could not stop: ${describe(error)}`);
  } finally {
    showControls();
  }
}

/** Approve / Deny: the decision goes to the service; what it changes (the tool runs or
 * fails, the turn goes on) arrives through the live view. */
async function respond(interactionId, decision) {
  const context = list.context;
  context.responding.add(interactionId);
  context.failures.delete(interactionId);
  list.render(view.messages, { force: true });
  try {
    // Once decided, the buttons stay disabled until the part's new status arrives
    // (which removes them): a second click would only be refused.
    await session.respond(interactionId, { decision });
  } catch (error) {
    context.responding.delete(interactionId);
    context.failures.set(interactionId, `Not sent: ${describe(error)}`);
  } finally {
    list.render(view.messages, { force: true });
  }
}

/** A client-side tool's result (or error), typed into its form. What it changes (the
 * tool completes, the turn goes on) arrives through the live view. */
async function answerTool(result) {
  try {
    await session.submitToolResults([result]);
  } catch (error) {
    if (isKeyRefusal(error)) restart(error);
    throw new Error(`Not sent: ${describe(error)}`);
  }
}

/** A turn's durable events, oldest first (`GET .../events?turn_id=`). */
async function turnEvents(turnId) {
  const page = await session.client.request("GET", session.path("/events"), {
    query: { turn_id: turnId, limit: 1000 },
  });
  return page.data;
}

function showTitle() {
  const title = info?.title || "Untitled session";
  $("#title").textContent = title;
  document.title = `${title} · evermirror`;
  // A branch links to the session it was forked from.
  const source = info?.forked_from_session_id;
  const link = $("#branch-of");
  link.hidden = !source;
  if (source) link.href = `../../sessions/${encodeURIComponent(source)}/chat`;
}

/** The settings form, filled from the session as last read; the catalog's models are
 * read when it first opens. */
async function openSettings() {
  const panel = $("#settings");
  const opening = panel.hidden;
  panel.hidden = !opening;
  $("#settings-toggle").setAttribute("aria-expanded", String(opening));
  if (!opening) return;
  $("#settings-state").textContent = "";
  $("#set-title").value = info?.title ?? "";
  $("#set-approval").value = info?.approval_mode ?? "ask";
  $("#set-prompt").value = info?.system_prompt ?? "";
  const select = $("#set-model");
  if (select.options.length === 1) {
    try {
      const models = await session.client.request("GET", "/models");
      for (const model of models.data ?? []) {
        select.append(el("option", { value: String(model.id), text: String(model.name ?? model.id) }));
      }
    } catch (error) {
      $("#settings-state").textContent = `Models could not be read: ${describe(error)}`;
    }
  }
  select.value = info?.model_id ?? "";
}

/** Save what changed, as one PATCH: a change of model, approval mode or system prompt
 * shows in the conversation as an Action. */
async function saveSettings() {
  const patch = {};
  const title = $("#set-title").value;
  const model = $("#set-model").value || null;
  const approval = $("#set-approval").value;
  const prompt = $("#set-prompt").value;
  if (title !== (info?.title ?? "")) patch.title = title || null;
  if (model !== (info?.model_id ?? null)) patch.model_id = model;
  if (approval !== (info?.approval_mode ?? "ask")) patch.approval_mode = approval;
  if (prompt !== (info?.system_prompt ?? "")) patch.system_prompt = prompt || null;
  const state = $("#settings-state");
  if (Object.keys(patch).length === 0) {
    state.textContent = "Nothing changed.";
    return;
  }
  $("#save-settings").disabled = true;
  try {
    info = await session.update(patch);
    showTitle();
    state.textContent = "Saved.";
  } catch (error) {
    if (isKeyRefusal(error)) return restart(error);
    state.textContent = `Not saved: ${describe(error)}`;
  } finally {
    $("#save-settings").disabled = false;
  }
}

/** Download the session as JSON Lines (`GET .../export`, with the key the page
 * holds, so it is fetched here and handed to the browser as a file). */
async function exportSession() {
  const state = $("#settings-state");
  try {
    const response = await fetch(session.client.url(session.path("/export")), {
      headers: session.client.headers(),
    });
    if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
    const file = URL.createObjectURL(await response.blob());
    const anchor = el("a", { download: `${sessionId}.jsonl` });
    anchor.setAttribute("href", file);
    anchor.click();
    setTimeout(() => URL.revokeObjectURL(file), 10_000);
    state.textContent = "Exported.";
  } catch (error) {
    state.textContent = `Not exported: ${describe(error)}`;
  }
}

/** Delete, after a second press: the session, its messages and events go. */
async function deleteSession() {
  const button = $("#delete-session");
  if (button.dataset.confirm !== "yes") {
    button.dataset.confirm = "yes";
    button.textContent = "Really delete? Press again";
    return;
  }
  button.disabled = true;
  try {
    view?.close();
    await session.delete();
    location.assign("../../sessions");
  } catch (error) {
    button.disabled = false;
    $("#settings-state").textContent = `Not deleted: ${describe(error)}`;
  }
}

/** The sessions forked from this one, linked from the bar. */
async function loadBranches() {
  try {
    const page = await session.client.listSessions({ forked_from: sessionId, include_archived: true, limit: 100 });
    const node = $("#branches");
    const branches = page.data ?? [];
    node.hidden = branches.length === 0;
    node.replaceChildren(
      `Branches (${branches.length}):`,
      ...branches.map((branch, index) => {
        const anchor = el("a", { text: ` ${index + 1}`, title: branch.title || branch.id, dataset: { sessionId: branch.id } });
        anchor.setAttribute("href", `../../sessions/${encodeURIComponent(branch.id)}/chat`);
        return anchor;
      }),
    );
  } catch (error) {
    notice(`Branches could not be read: ${describe(error)}`);
  }
}

/** Thumbs up / down: shown at once, taken back if the service refuses it. */
async function rate(messageId, rating) {
  const ratings = list.context.ratings;
  const before = ratings.get(messageId) ?? null;
  ratings.set(messageId, rating);
  list.render(view.messages, { force: true });
  try {
    await session.rate(messageId, { rating });
  } catch (error) {
    ratings.set(messageId, before);
    notice(`Feedback not saved: ${describe(error)}`);
    list.render(view.messages, { force: true });
  }
}

/** This key's earlier ratings of the session's messages. */
async function loadRatings() {
  try {
    for (const given of await session.feedback()) list.context.ratings.set(given.message_id, given.rating);
    rebuild = true;
    scheduleRender();
  } catch (error) {
    notice(`Earlier feedback could not be read: ${describe(error)}`);
  }
}

/** The session and its live view, asking for a key for as long as the service
 * refuses the one held. */
async function open() {
  session = undefined;
  for (;;) {
    const candidate = newClient().session(sessionId);
    try {
      info = await candidate.get();
      showTitle();
      session = candidate;
      break;
    } catch (error) {
      if (isKeyRefusal(error)) {
        const refused = storedKey() !== undefined;
        forgetKey();
        await askForKey(refused ? "That key was refused; enter another." : undefined);
        continue;
      }
      if (error instanceof EvermirrorError && error.status < 500 && error.status !== 429) {
        $("#title").textContent = error.status === 404 ? "Session not found" : "Session unavailable";
        notice(describe(error));
        unavailable = true;
        showStatus();
        return;
      }
      notice(`The service does not answer (${describe(error)}); retrying…`);
      $("#status").dataset.status = "offline";
      await sleep(2000);
    }
  }
  notice("");
  view = new SyncView(session, { limit, include_internal: false, onChange: scheduleRender });
  scheduleRender();
  loadRatings();
  loadBranches();
  textBox.focus();
  view.done.then(() => {
    const error = view.error;
    if (isKeyRefusal(error)) return restart(error);
    if (error) notice(`The live view stopped: ${describe(error)}`);
    scheduleRender();
  });
}

async function restart(error) {
  view?.close();
  view = undefined;
  session = undefined;
  showControls();
  notice(describe(error));
  await open();
}

$("#compose").addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
textBox.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
textBox.addEventListener("input", showControls);
$("#stop").addEventListener("click", stop);
$("#settings-toggle").addEventListener("click", openSettings);
$("#settings-form").addEventListener("submit", (event) => {
  event.preventDefault();
  saveSettings();
});
$("#delete-session").addEventListener("click", deleteSession);
$("#export-session").addEventListener("click", exportSession);
$("#cancel-edit").addEventListener("click", () => {
  stopEditing();
  textBox.value = "";
});
for (const button of document.querySelectorAll("#empty [data-scenario]")) {
  button.addEventListener("click", () => {
    textBox.value = button.dataset.scenario;
    textBox.focus();
    showControls();
  });
}
$("#load-older").addEventListener("click", loadOlder);
box.addEventListener(
  "scroll",
  () => {
    if (box.scrollTop < EDGE) loadOlder();
  },
  { passive: true },
);
window.addEventListener("online", scheduleRender);
window.addEventListener("offline", scheduleRender);

open();
