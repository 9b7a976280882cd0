// The session list: newest activity first, with search (sessions by title or message
// text, and the messages that match), paging and a form that creates a session and
// opens its chat view.

import { $, askForKey, describe, el, forgetKey, isKeyRefusal, newClient, storedKey, timeOf } from "./common.js";

const LIMIT = 20;
let offset = 0;
let search = "";

function chatHref(id) {
  // Relative to /sessions: works under any path prefix.
  return `sessions/${encodeURIComponent(id)}/chat`;
}

function row(session) {
  const anchor = el("a", { text: session.title || "Untitled session" });
  anchor.href = chatHref(session.id);
  const archived = session.archived_at !== undefined;
  const mark = (what, on, text) =>
    el("button", {
      type: "button",
      class: `mark ${what}`,
      text,
      onclick: () => toggle(session.id, what, on),
    });
  return el(
    "tr",
    { dataset: { sessionId: session.id, pinned: String(session.is_pinned === true), archived: String(archived) } },
    el("td", {}, session.is_pinned ? el("span", { class: "pin", title: "Pinned", text: "📌 " }) : null, anchor),
    el("td", { text: session.status }),
    el("td", {}, timeOf(session.updated_at)),
    el("td", { class: "id mono", text: session.id }),
    el(
      "td",
      { class: "marks" },
      mark("pin", !session.is_pinned, session.is_pinned ? "Unpin" : "Pin"),
      mark("archive", !archived, archived ? "Unarchive" : "Archive"),
    ),
  );
}

/** Pin or archive a session (or undo it), then list again. */
async function toggle(id, what, on) {
  try {
    await withKey((client) => {
      const handle = client.session(id);
      return what === "pin" ? handle.pin(on) : handle.archive(on);
    });
    await load();
  } catch (error) {
    $("#notice").textContent = `Not changed: ${describe(error)}`;
  }
}

/** Runs `call` with a client, asking for a key for as long as the service refuses
 * the one held. */
async function withKey(call) {
  for (;;) {
    try {
      return await call(newClient());
    } catch (error) {
      if (!isKeyRefusal(error)) throw error;
      const refused = storedKey() !== undefined;
      forgetKey();
      await askForKey(refused ? "That key was refused; enter another." : undefined);
    }
  }
}

const HITS = 10;

const WORD = /[\p{L}\p{N}]+/gu;

/** The snippet as text nodes, each word of the search in a <mark> (as the service
 * marks them in `snippet_html`, which the page does not parse). */
function snippetNodes(text) {
  const wanted = new Set((search.match(WORD) ?? []).map((word) => word.toLowerCase()));
  const nodes = [];
  let at = 0;
  for (const match of text.matchAll(WORD)) {
    if (!wanted.has(match[0].toLowerCase())) continue;
    nodes.push(document.createTextNode(text.slice(at, match.index)), el("mark", { text: match[0] }));
    at = match.index + match[0].length;
  }
  nodes.push(document.createTextNode(text.slice(at)));
  return nodes;
}

function hit(found) {
  const anchor = el("a", { text: found.session_title || "Untitled session" });
  anchor.href = chatHref(found.session_id);
  return el(
    "li",
    { dataset: { messageId: found.message_id, sessionId: found.session_id } },
    el("div", { class: "hit-head" }, anchor, el("span", { class: "role", text: ` · ${found.role} · ` }), timeOf(found.created_at)),
    el("p", { class: "snippet" }, ...snippetNodes(found.snippet)),
  );
}

/** The first messages that match the search, or nothing when it has no word. */
async function loadHits() {
  if (!search?.match(WORD)) {
    $("#hits").hidden = true;
    return;
  }
  const page = await withKey((client) => client.search(search, { limit: HITS }));
  $("#hit-list").replaceChildren(...page.data.map(hit));
  $("#hits").hidden = page.data.length === 0;
}

async function load() {
  loadHits().catch((error) => {
    $("#hits").hidden = true;
    $("#notice").textContent = `Messages could not be searched: ${describe(error)}`;
  });
  try {
    const query = { offset, limit: LIMIT, order: "last_activity" };
    if (search) query.search = search;
    if ($("#archived").checked) query.archived_only = true;
    const page = await withKey((client) => client.listSessions(query));
    $("#notice").textContent = "";
    $("#rows").replaceChildren(...page.data.map(row));
    $("#empty").hidden = page.data.length > 0 || offset > 0;
    const shown = page.data.length;
    $("#range").textContent = shown ? `${offset + 1}–${offset + shown} of ${page.total}` : `${page.total} sessions`;
    $("#prev").disabled = offset === 0;
    $("#next").disabled = offset + shown >= page.total;
    $("#next").dataset.offset = String(offset + shown);
  } catch (error) {
    $("#notice").textContent = `Sessions could not be listed: ${describe(error)}`;
  }
}

$("#create").addEventListener("submit", async (event) => {
  event.preventDefault();
  const title = $("#new-title").value.trim();
  try {
    const session = await withKey((client) => client.createSession(title ? { title } : {}));
    location.href = chatHref(session.id);
  } catch (error) {
    $("#notice").textContent = `No session created: ${describe(error)}`;
  }
});
$("#search").addEventListener("submit", (event) => {
  event.preventDefault();
  search = $("#search-input").value.trim();
  offset = 0;
  load();
});
$("#archived").addEventListener("change", () => {
  offset = 0;
  load();
});
$("#prev").addEventListener("click", () => {
  offset = Math.max(0, offset - LIMIT);
  load();
});
$("#next").addEventListener("click", () => {
  offset = Number($("#next").dataset.offset);
  load();
});

load();
