// Types of the evermirror client (src/index.js).

/** A content part of a message; every part has a stable `part_id` and `sequence`. */
export interface Part {
  part_id: string;
  sequence: number;
  type: string;
  /** `text`: a string; committed `reasoning`: `{kind, text}`; live parts: a string. */
  text?: string | { kind: string; text?: string; [key: string]: unknown };
  [key: string]: unknown;
}

/** The seed's data-wrapped Message (upstream's fields plus revision, state, ...). */
export interface Message {
  id: string;
  session_id: string;
  sequence: number;
  role: "user" | "agent";
  content: Part[];
  revision: number;
  state: "streaming" | "done";
  visibility: "visible" | "internal";
  turn_id?: string;
  phase?: "commentary" | "final_answer";
  phase_source?: string;
  controls?: Record<string, unknown>;
  metadata?: Record<string, unknown>;
  external_actor?: Record<string, unknown>;
  tags?: string[];
  created_at: string;
  updated_at: string;
  /** Only on the answer to `send()`. */
  delivery?: "started" | "steered" | "resumed" | "duplicate";
  [key: string]: unknown;
}

/** The seed's SessionMessagePage, plus `cursor` (the stream position it was read at). */
export interface SessionMessagePage {
  items: Message[];
  total: number;
  start_sequence?: number;
  end_sequence?: number;
  next_before_sequence?: number;
  has_more: boolean;
  cursor?: string;
}

export interface SessionInfo {
  id: string;
  status: "started" | "active" | "idle" | "waitingfortoolresults";
  title?: string;
  self_url?: string;
  view_url?: string;
  ui_link?: string;
  is_pinned?: boolean;
  archived_at?: string;
  created_at: string;
  updated_at?: string;
  [key: string]: unknown;
}

/** A key's feedback on a message (`created_at`/`updated_at` absent once removed). */
export interface Feedback {
  session_id: string;
  message_id: string;
  rating: "good" | "bad" | null;
  comment: string | null;
  created_at?: string;
  updated_at?: string;
}

export interface SessionsPage {
  data: SessionInfo[];
  total: number;
  offset: number;
  limit: number;
  next_url?: string;
  prev_url?: string;
}

/** A committed snapshot; `cursor` is where a reconnect resumes after it. */
export interface MessageMutation {
  type: "message";
  message: Message;
  cursor?: string;
}
/** A part began in the live projection of the committed `revision` (with its text so far). */
export interface PartMutation {
  type: "part";
  message_id: string;
  revision: number;
  part: Part;
}
/** Text appended at `offset` (UTF-16 code units: what String.length counts). */
export interface DeltaMutation {
  type: "delta";
  message_id: string;
  revision: number;
  part_id: string;
  /** What the text extends: the part's `text`, or its `reasoning`. */
  kind: "text" | "reasoning" | string;
  offset: number;
  text: string;
}
/** A turn's status changed. */
export interface TurnMutation {
  type: "turn";
  mutation_id: string;
  turn_id: string;
  status: "running" | "completed" | "failed" | "cancelled";
}
/** A session field changed: `status`, `title` or `model_id`. */
export interface SessionMutation {
  type: "session";
  mutation_id: string;
  status?: "started" | "active" | "idle" | "waitingfortoolresults";
  title?: string;
  model_id?: string;
}
/** `sendAndWait()`: how the message's turn ended. */
export interface TurnResult {
  /** `waiting`: the turn cannot go on without this client (see `waiting_for`). */
  status: "completed" | "failed" | "waiting" | "timeout";
  /** The posted message, as stored. */
  message: Message;
  /** The turn's agent messages, so far when it waits (absent on a timeout). */
  messages?: Message[];
  error?: { code: string; message: string };
  /** With `waiting`: client-side tool calls to answer, or an approval to decide. */
  waiting_for?: "tool_results" | "approval";
}
/** A result of a client-side tool call, for `submitToolResults()`. */
export interface ToolResult {
  /** The `id` of the `tool_call` part (and of `tool.call_requested`'s call). */
  tool_call_id: string;
  /** What the tool returned (any JSON). */
  result?: unknown;
  /** Why the tool failed; the model sees it. */
  error?: string;
}
/** `submitToolResults()`: how many results were stored, and the session's status then. */
export interface ToolResultsAnswer {
  accepted: number;
  /** `waitingfortoolresults` while other calls of the step still wait, else `active`. */
  status: "waitingfortoolresults" | "active" | string;
}
export type InteractionStatus = "pending" | "approved" | "denied" | "cancelled";
/** An approval the model's tool call waits for (or waited for). */
export interface Interaction {
  interaction_id: string;
  interaction_type: "approval" | string;
  status: InteractionStatus;
  /** The agent message whose `interaction` part it is. */
  message_id: string;
  tool_call_id?: string | null;
  request?: {
    tool_call?: { id: string; name: string; arguments: Record<string, unknown> };
    [key: string]: unknown;
  } | null;
  response?: { decision: "approve" | "deny"; reason?: string; [key: string]: unknown } | null;
  resolved_at?: string | null;
  cancel_reason?: "turn_stopped" | "session_disposed" | "runtime_interrupted" | null;
  [key: string]: unknown;
}
export interface Decision {
  decision: "approve" | "deny";
  /** Why; a denial's reason is what the model sees. */
  reason?: string;
}
/** The server cannot continue from the cursor: reload snapshots. */
export interface ResetMutation {
  type: "reset";
  reason: string;
}
/** A kind this client does not know yet (delivered as the server sent it). */
export interface OtherMutation {
  type: string;
  [key: string]: unknown;
}
export type Mutation =
  | MessageMutation
  | PartMutation
  | DeltaMutation
  | TurnMutation
  | SessionMutation
  | ResetMutation
  | OtherMutation;

export interface ClientOptions {
  /** The service's address, without `/v1`. */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <key>`. */
  apiKey?: string;
  /** Sent as `X-Org-Id`. */
  orgId?: string;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof fetch;
  /** Per request (not streams); default 30,000. */
  timeoutMs?: number;
  /** Pause before reconnecting a stream when the server gave no `retry:`; default 1,000. */
  retryMs?: number;
  /** Cap of the backoff while reconnecting fails; default 30,000. */
  maxRetryMs?: number;
  /** A stream with no byte (not even a heartbeat) for this long is reconnected; default 90,000. */
  idleTimeoutMs?: number;
}

/** A problem+json answer (RFC 9457) of the service. */
export class EvermirrorError extends Error {
  readonly name: "EvermirrorError";
  readonly status: number;
  readonly title?: string;
  readonly detail?: string;
  readonly code?: string;
  readonly type?: string;
  readonly instance?: string;
  /** A 422's offending fields. */
  readonly errors?: { loc: (string | number)[]; msg: string; type: string }[];
  /** The whole problem document. */
  readonly problem: Record<string, unknown>;
  /** `X-Request-Id`, under which the server logged the request. */
  readonly requestId?: string;
  /** `Retry-After` in seconds (429, 503). */
  readonly retryAfter?: number;
}

/** A request that got no answer within `timeoutMs`. */
export class EvermirrorTimeout extends Error {
  readonly name: "EvermirrorTimeout";
}

interface Signal {
  signal?: AbortSignal;
}

export class Evermirror {
  constructor(options: ClientOptions);
  readonly baseUrl: string;
  /** A handle on one session; no request is made. */
  session(id: string): Session;
  /** `POST /v1/sessions`: the new session's handle (its `info` is the created session). */
  createSession(body?: Record<string, unknown>, options?: Signal): Promise<Session>;
  listSessions(
    query?: { offset?: number; limit?: number; search?: string; status?: string; order?: string },
    options?: Signal,
  ): Promise<SessionsPage>;
  /** `GET /v1/search`: messages whose text holds every word of `q`, best first. */
  search(q: string, query?: { offset?: number; limit?: number }, options?: Signal): Promise<SearchPage>;
}

export interface SearchHit {
  session_id: string;
  session_title: string | null;
  message_id: string;
  sequence: number;
  role: "user" | "agent";
  created_at: string;
  snippet: string;
  /** The snippet HTML-escaped, each matching word in `<mark>`. */
  snippet_html: string;
}

export interface SearchPage {
  data: SearchHit[];
  offset: number;
  limit: number;
  next_url?: string;
}

export interface SendOptions extends Signal {
  client_message_id?: string;
  visibility?: "visible" | "internal";
  controls?: Record<string, unknown>;
  metadata?: Record<string, unknown>;
  tags?: string[];
}

export interface SubscribeOptions extends Signal {
  /** Start after this cursor (`"0"`: every message first); default: live changes only. */
  after?: string | number;
  include_internal?: boolean;
  onStatus?: (status: SubscriptionStatus) => void;
  /** A refusal that ended the subscription, or an exception of the handler. */
  onError?: (error: unknown) => void;
}

export type SubscriptionStatus = "connecting" | "open" | "reconnecting" | "closed";

export class Subscription {
  readonly status: SubscriptionStatus;
  /** The cursor of the last `message` Mutation: a reconnect sends it as `Last-Event-ID`. */
  readonly lastEventId?: string;
  readonly error?: unknown;
  /** Resolves once closed; rejects with the error of a refused stream (401, 404, ...). */
  readonly done: Promise<void>;
  close(): void;
}

export interface SyncOptions extends Signal {
  /** Size of the newest window, and of each `loadOlder()` page; default 50. */
  limit?: number;
  include_internal?: boolean;
  onChange?: (view: SyncView) => void;
}

export type SyncStatus = "connecting" | "live" | "reconnecting" | "closed";

export class SyncView {
  /** The messages in order, each with the live parts of the revision it holds. */
  readonly messages: readonly Message[];
  /** `reconnecting`: what is shown is provisional until the reload. */
  readonly status: SyncStatus;
  /** Older messages exist than those loaded. */
  readonly hasMore: boolean;
  /** What ended the view, when a refusal did. */
  readonly error?: unknown;
  /** Resolves once the view is closed. */
  readonly done: Promise<void>;
  onChange(listener: (view: SyncView) => void): () => void;
  /** Loads the page before the oldest message held; resolves with how many were added. */
  loadOlder(options?: { limit?: number }): Promise<number>;
  /** Resolves with `messages` once `predicate` holds; rejects after `timeoutMs` (30,000) or on close. */
  waitFor(
    predicate: (messages: readonly Message[], view: SyncView) => boolean,
    options?: { timeoutMs?: number },
  ): Promise<readonly Message[]>;
  close(): void;
}

export class Session {
  readonly id: string;
  /** The session as last read by createSession, get or update. */
  readonly info?: SessionInfo;
  get(options?: Signal): Promise<SessionInfo>;
  update(patch: Record<string, unknown>, options?: Signal): Promise<SessionInfo>;
  delete(options?: Signal): Promise<void>;
  /** Pins (true, the default) or unpins (false) the session. */
  pin(pinned?: boolean, options?: Signal): Promise<void>;
  /** Archives (true, the default) or unarchives (false) the session. */
  archive(archived?: boolean, options?: Signal): Promise<void>;
  /** This key's feedback on a message; no rating and no comment remove it. */
  rate(
    messageId: string,
    options?: { rating?: "good" | "bad" | null; comment?: string } & Signal,
  ): Promise<Feedback>;
  /** This key's feedback on the session's messages, in their order. */
  feedback(options?: Signal): Promise<Feedback[]>;
  messages(
    options?: { limit?: number; before_sequence?: number; include_internal?: boolean } & Signal,
  ): Promise<SessionMessagePage>;
  message(messageId: string, options?: Signal): Promise<Message>;
  /** Posts a user message: a text, or content parts. */
  send(text: string | Record<string, unknown>[], options?: SendOptions): Promise<Message>;
  /** Posts a user message and resolves when its turn ends (or after `timeout_ms`). */
  sendAndWait(
    text: string | Record<string, unknown>[],
    options?: SendOptions & { timeout_ms?: number },
  ): Promise<TurnResult>;
  cancel(options?: Signal): Promise<{ status: "cancelled" | "no_op"; message: string }>;
  /** `POST .../tool-results`: answers client-side tool calls; a 409
   * `not_waiting_for_tool_results` when nothing waits. */
  submitToolResults(results: ToolResult[], options?: Signal): Promise<ToolResultsAnswer>;
  /** `GET .../interactions`: the session's approvals, oldest first. */
  interactions(options?: { status?: InteractionStatus } & Signal): Promise<Interaction[]>;
  /** `POST .../interactions/{id}`: approves or denies a pending approval; a 409
   * `interaction_resolved` when it was decided or cancelled before. */
  respond(interactionId: string, decision: Decision & Signal): Promise<Interaction>;
  subscribe(handler: (mutation: Mutation) => void, options?: SubscribeOptions): Subscription;
  /** Resolves once the first snapshot is shown. */
  sync(options?: SyncOptions): Promise<SyncView>;
}

/** The `text/event-stream` parser the client uses. */
export class SSEParser {
  lastEventId: string;
  retryMs?: number;
  feed(text: string): { type: string; data: string; id: string; hasId: boolean }[];
}
