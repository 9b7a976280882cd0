// What both pages share: where the service is, the API key (kept in sessionStorage,
// asked for when the service refuses to answer without one), and `el()`, the one way
// these pages build DOM: every string it is given becomes text, never markup.

import { Evermirror, EvermirrorError } from "./client/index.js";

export const KEY_STORAGE = "evermirror.apiKey";

export const $ = (selector) => document.querySelector(selector);

/** The service's address: this page's origin and any path prefix before `/sessions`
 * (a proxy may serve the service under one). */
export function baseUrl() {
  const path = location.pathname;
  const at = path.lastIndexOf("/sessions");
  return location.origin + (at > 0 ? path.slice(0, at) : "");
}

// The key when sessionStorage cannot hold it (disabled by the browser's settings).
let memoryKey;

export function storedKey() {
  try {
    return sessionStorage.getItem(KEY_STORAGE) || undefined;
  } catch {
    return undefined; // storage disabled: the key is asked for again on each load
  }
}

function storeKey(key) {
  try {
    sessionStorage.setItem(KEY_STORAGE, key);
  } catch {
    // Kept for this page only.
  }
  memoryKey = key;
}

export function forgetKey() {
  memoryKey = undefined;
  try {
    sessionStorage.removeItem(KEY_STORAGE);
  } catch {
    // nothing stored
  }
}

/** A client of this service with the key held, if any. */
export function newClient() {
  return new Evermirror({ baseUrl: baseUrl(), apiKey: storedKey() ?? memoryKey });
}

/** Whether `error` is the service refusing the request for want of a valid key. */
export function isKeyRefusal(error) {
  return error instanceof EvermirrorError && error.status === 401;
}

/** Shows the key form; resolves once a key was entered (and stored). */
export function askForKey(message) {
  const section = $("#key");
  const form = $("#key-form");
  const input = $("#key-input");
  $("#key-error").textContent = message ?? "";
  section.hidden = false;
  input.focus();
  return new Promise((resolve) => {
    const submitted = (event) => {
      event.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      form.removeEventListener("submit", submitted);
      input.value = "";
      section.hidden = true;
      storeKey(key);
      resolve(key);
    };
    form.addEventListener("submit", submitted);
  });
}

/**
 * Builds an element. `props`: `class`, `text` (set as textContent), `dataset`, `on<event>`
 * handlers, and attributes (a `true` value is an empty attribute; `undefined`, `null`
 * and `false` are left out). Children are nodes or strings (text nodes).
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = String(value);
    else if (name === "dataset") {
      for (const [key, item] of Object.entries(value)) {
        if (item !== undefined && item !== null) node.dataset[key] = String(item);
      }
    } else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "href" || name === "src") {
      throw new TypeError(`el(): set ${name} through link() or an image renderer`);
    } else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** A link when `uri` is an http(s) URL, else the text alone: no `javascript:` or other
 * scheme ever reaches an href. */
export function link(uri, text = uri) {
  let url;
  try {
    url = new URL(String(uri));
  } catch {
    return el("span", { text });
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return el("span", { text });
  const anchor = el("a", { text, rel: "noopener noreferrer", target: "_blank" });
  anchor.href = url.href;
  return anchor;
}

/** A failure, as one line of text. */
export function describe(error) {
  if (error instanceof EvermirrorError) {
    const what = error.detail && error.detail !== error.title ? `: ${error.detail}` : "";
    return `${error.status} ${error.title ?? "Error"}${what}`;
  }
  return error?.message ? String(error.message) : String(error);
}

/** A local date and time of an RFC 3339 timestamp, in a <time> element. */
export function timeOf(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return el("time", { text: String(iso ?? "") });
  return el("time", { datetime: date.toISOString(), title: date.toISOString(), text: date.toLocaleString() });
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
