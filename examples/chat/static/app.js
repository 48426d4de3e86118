// The chat page: plain JavaScript, no build step. Live updates come from an EventSource (server-sent
// events); messages are read from the database through the JSON API, so an event only says "look
// again" and a missed one costs one refetch, never a wrong screen.
//
// The tabs of one chat in one browser share one stream: over HTTP/1.1 a browser opens at most 6
// connections to a host, so a stream for each tab would leave a seventh tab (its stream and its
// requests) waiting. The tab that holds the Web Lock "chat-events/ID" keeps the EventSource and
// relays every event on the BroadcastChannel of that name; the others hear them there, and one of
// them takes the lock, and the stream, when that tab closes. Where a browser has neither (Web Locks
// need a secure context: localhost, or HTTPS), each tab keeps its own stream.
"use strict";

const state = {
  chatId: null, // the chat's id as the digits of its address, a string (a number rounds past 2^53, trial EB), without
  // leading zeros (see chatKey)
  lastId: 0, // the newest message id read in order from the API
  rendered: new Map(), // message id -> its <li>
  answered: new Set(), // ids of user messages whose reply is saved
  streaming: new Map(), // id of a user message -> the <li> its reply streams into
  gaveUp: new Map(), // id of a user message -> the <li> saying the model gave up answering it
  source: null, // the EventSource, in the tab that keeps the chat's stream
  channel: null, // the BroadcastChannel the chat's events are relayed on
  leave: null, // gives back the Web Lock of the chat's stream (and closes it) when this tab leaves the chat
  beat: null, // the interval of a following tab's asks to the tab that keeps the stream (see BEAT)
  unsent: null, // why the text in the box was not sent ({reason, retry, text, key}), until it is sent again or cleared
  drafts: new Map(), // chat id -> {text, unsent}: the box of each chat this tab left (trial ED: a failed send followed
  // the user into another chat, flag and all, and Send posted it there)
};

// A chat's id as the page keeps it: its digits without leading zeros ("0049" is chat 49, "0" stays "0"), so that
// /chats/0049 marks chat 49 in the list as the current one (trial ED: "0049" was compared with "49").
function chatKey(digits) {
  return String(digits).replace(/^0+(?=\d)/, "");
}

// Whether `text` shows nothing, as the server's has_text (service.py) says: every character a space, a line or
// paragraph separator, a control or format character, or one of the fillers (Hangul fillers, blank Braille).
// (trim() keeps U+0085 and the format characters, which the server's notion does not; trial ED)
const BLANK = /^[\p{Zs}\p{Zl}\p{Zp}\p{Cc}\p{Cf}\u115F\u1160\u3164\uFFA0\u2800]*$/u;
function isBlank(text) {
  return BLANK.test(text);
}

const $ = (id) => document.getElementById(id);

async function api(path, options = {}) {
  let res;
  try {
    // (the server refuses a POST without this header: a cross-site page cannot send it without asking; trial EB)
    res = await fetch(path, { ...options, headers: { "content-type": "application/json", ...options.headers } });
  } catch {
    // not the browser's "Failed to fetch"; and the device's own connection named when it has none (trial DQ)
    throw new Error(navigator.onLine === false
      ? "this device is offline: try again once you are back online"
      : "the server cannot be reached (is the demo running?)");
  }
  const body = await res.json().catch(() => null);
  if (!res.ok) {
    const err = new Error(body && body.error ? body.error : `${res.status} ${res.statusText}`);
    err.status = res.status;
    throw err;
  }
  return body;
}

// The chat of this page does not exist (a mistyped or old address): say so once, and stop listening and
// asking (a 404 is not "offline": trying again would never end).
function chatGone(chatId) {
  if (chatId !== state.chatId) return;
  if (state.leave) state.leave();
  if (state.source) state.source.close();
  if (state.channel) state.channel.close();
  state.source = state.channel = state.leave = null;
  setStatus("not found");
  showError(`There is no chat ${chatId}: pick one from the list, or start a new one.`);
}

// The error line: `text` (none: cleared), and, until the text in the box is sent or cleared, that it was not sent
// (trial EB: a send that failed while the store was unreachable lost its error at the next refresh, and the unsent
// text sat in the box as if it were a draft); "press Send to try again" only when trying again may help (trial ED:
// it was said of "a message needs some text" too).
function showError(text) {
  const u = state.unsent;
  const unsent = u === null ? "" : `not sent: ${u.reason}${u.retry ? " (press Send to try again)" : ""}`;
  const shown = [unsent, text].filter(Boolean).join(" · ");
  $("error").textContent = shown;
  $("error").hidden = !shown;
}

function setStatus(s) {
  $("status").dataset.state = s;
  $("status").textContent = s;
}

function scrollDown() {
  const list = $("messages");
  list.scrollTop = list.scrollHeight;
}

function bubble(role, text) {
  const li = document.createElement("li");
  li.className = `msg ${role}`;
  li.textContent = text;
  return li;
}

// A saved message, in id order (before the replies still streaming).
function render(msg) {
  if (state.rendered.has(msg.id)) return;
  const li = bubble(msg.role, msg.text);
  li.dataset.id = msg.id;
  if (msg.reply_to) {
    li.dataset.replyTo = msg.reply_to;
    state.answered.add(msg.reply_to);
    for (const gone of [state.streaming.get(msg.reply_to), state.gaveUp.get(msg.reply_to)]) {
      if (gone) gone.remove();
    }
    state.streaming.delete(msg.reply_to);
    state.gaveUp.delete(msg.reply_to);
  }
  insertInOrder(li, msg.id);
  state.rendered.set(msg.id, li);
  if (msg.failed && !state.answered.has(msg.id)) gaveUpBubble(msg.id, msg.failed);
  scrollDown();
}

// Saved bubbles are in id order; a bubble still streaming (no id) stays after them.
function insertInOrder(li, id) {
  const list = $("messages");
  let before = null;
  for (const child of list.children) {
    if (!child.dataset.id || +child.dataset.id > id) {
      before = child;
      break;
    }
  }
  list.insertBefore(li, before);
}

// The model gave up answering message `id` (nothing retries it): said under that message, after a reload too.
function gaveUpBubble(id, reason) {
  const streaming = state.streaming.get(id);
  if (streaming) {
    streaming.remove();
    state.streaming.delete(id);
  }
  if (state.gaveUp.has(id)) return;
  const li = bubble("assistant", `The model could not answer: ${reason}`);
  li.classList.add("failed");
  li.dataset.id = id + 0.5; // right after the message it was for
  state.gaveUp.set(id, li);
  insertInOrder(li, id + 0.5);
}

// Read the messages after the newest one read; calls while one runs make it go once more.
let fetching = false;
let again = false;
async function refresh() {
  if (fetching) {
    again = true;
    return;
  }
  fetching = true;
  try {
    do {
      again = false;
      const chatId = state.chatId;
      const messages = await api(`/api/chats/${chatId}/messages?after=${state.lastId}`);
      if (chatId !== state.chatId) {
        // another chat was opened meanwhile: read it now (its own refresh found this one under way and left
        // it to us; trial BO: returning here left the new chat empty until its next event)
        again = true;
        continue;
      }
      for (const m of messages) {
        render(m);
        state.lastId = Math.max(state.lastId, m.id);
      }
      if (messages.length === 500) again = true;
    } while (again);
    retryDelay = 1000;
    showError("");
  } catch (err) {
    if (err.status === 404) {
      chatGone(state.chatId);
      return;
    }
    // offline, or the server is restarting: try again after a growing delay (only while it fails)
    showError(`${err.message} (trying again)`);
    retryLater();
  } finally {
    fetching = false;
  }
}

let retryDelay = 1000;
let retryTimer = null;
function retryLater() {
  if (retryTimer) return;
  retryTimer = setTimeout(() => {
    retryTimer = null;
    refresh();
  }, retryDelay);
  retryDelay = Math.min(retryDelay * 2, 30000);
}

function streamingBubble(messageId) {
  let li = state.streaming.get(messageId);
  if (!li) {
    li = bubble("assistant", "");
    li.classList.add("streaming");
    li.dataset.streamFor = messageId;
    $("messages").appendChild(li);
    state.streaming.set(messageId, li);
  }
  return li;
}

function onStart(ev) {
  // an attempt starts the reply (again, after one that died or timed out): what streamed before goes
  if (state.answered.has(ev.id)) return;
  const li = streamingBubble(ev.id);
  li.classList.remove("failed");
  li.classList.add("streaming");
  li.textContent = "";
  li.dataset.have = "0"; // the characters of the reply this bubble holds, from its start
}

// A token says where its text goes (ev.at: the characters before it) and, now and then, what comes before it
// (ev.so_far). A bubble that holds the reply from its start appends the token that follows what it holds,
// and skips one it holds already (a replay); a tab that joined while the reply streamed shows "…" until a
// token brings the text before it, then goes on from there, from the reply's first word.
function onToken(ev) {
  if (state.answered.has(ev.id)) return; // already saved: a replay after a reconnect
  const li = streamingBubble(ev.id);
  if (li.classList.contains("failed")) {
    li.classList.remove("failed");
    li.textContent = "";
    li.dataset.have = "0";
  }
  li.classList.add("streaming");
  if (typeof ev.at !== "number") {
    li.textContent += ev.text; // (a server of before ev.at)
  } else {
    const have = li.dataset.have === undefined ? -1 : Number(li.dataset.have);
    if (have === ev.at) {
      li.textContent += ev.text;
    } else if (typeof ev.so_far === "string" && ev.so_far.length === ev.at && !(have > ev.at)) {
      li.textContent = ev.so_far + ev.text;
    } else if (have > ev.at) {
      return; // heard already
    } else {
      li.textContent = "…"; // joined in the middle: the text before this token comes with a later one
      delete li.dataset.have;
      return;
    }
    li.dataset.have = String(ev.at + ev.text.length);
  }
  scrollDown();
}

function onDone(ev) {
  const li = state.streaming.get(ev.id);
  if (li) li.classList.remove("streaming");
}

function onFailed(ev) {
  if (state.answered.has(ev.id)) return;
  const li = streamingBubble(ev.id);
  li.classList.remove("streaming");
  li.classList.add("failed");
  li.textContent = `The model failed to answer (${ev.text || "no reason given"}); trying again shortly…`;
}

function onGaveUp(ev) {
  if (state.answered.has(ev.id)) return;
  gaveUpBubble(ev.id, ev.text || "no reason given");
}

const HANDLERS = {
  open: () => refresh(), // the stream (re)opened: whatever was saved while it was down
  message: () => refresh(),
  start: (ev) => onStart(ev),
  token: (ev) => onToken(ev),
  gave_up: (ev) => onGaveUp(ev),
  done: (ev) => onDone(ev),
  failed: (ev) => onFailed(ev),
  summary: () => loadChat(),
  reload: () => {
    refresh();
    loadChat();
  },
};

// An event of the chat's stream, heard or relayed: handled here, and relayed to the other tabs by the
// tab that keeps the stream.
function dispatch(type, data, relay) {
  if (relay && state.channel) state.channel.postMessage({ type, data });
  const ev = data ? JSON.parse(data) : null;
  HANDLERS[type](ev);
}

function shareStatus(s) {
  setStatus(s);
  if (state.channel) state.channel.postMessage({ status: s });
}

// Follow the chat's events: through its shared stream where the browser can share it, else a stream of
// this tab's own.
// A tab that follows another's stream asks it how it is every BEAT ms (the answer is a message, which a hidden
// tab handles at once, where its timers may be slowed to one a minute); hearing nothing from it for STALE ms (its
// page paused or frozen: it still holds the lock), it says "waiting" rather than "live" and reads what was saved,
// every BEAT ms, until that tab is heard again (trial BO: it said "live" and showed nothing).
const BEAT = window.chatTiming?.beat ?? 5000; // (a test sets window.chatTiming before this script runs)
const STALE = window.chatTiming?.stale ?? 15000;

function connect() {
  if (state.leave) state.leave();
  if (state.source) state.source.close();
  if (state.channel) state.channel.close();
  clearInterval(state.beat);
  state.source = state.channel = state.leave = state.beat = null;
  const chatId = state.chatId;
  if (!(navigator.locks && window.BroadcastChannel)) {
    openStream(chatId, false);
    return;
  }
  const name = `chat-events/${chatId}`;
  const channel = new BroadcastChannel(name);
  state.channel = channel;
  let heard = Date.now();
  channel.onmessage = (m) => {
    const msg = m.data;
    if (!msg.ask) heard = Date.now(); // (another following tab's ask says nothing of the keeper)
    if (msg.ask) {
      if (state.source) shareStatus($("status").dataset.state); // a tab that joined asks how the stream is
    } else if (!state.source) {
      if (msg.status) setStatus(msg.status);
      else dispatch(msg.type, msg.data, false);
    }
  };
  let gone = false;
  let release = null;
  state.leave = () => {
    gone = true;
    if (release) release();
  };
  setStatus("connecting");
  channel.postMessage({ ask: true }); // the tab that keeps the stream says how it is
  state.beat = setInterval(() => {
    if (state.source) return; // (this tab keeps the stream)
    if (Date.now() - heard > STALE) {
      setStatus("waiting");
      refresh();
    }
    channel.postMessage({ ask: true });
  }, BEAT);
  navigator.locks
    .request(name, () => {
      if (gone) return null; // left the chat while waiting for the lock
      openStream(chatId, true);
      return new Promise((resolve) => (release = resolve)); // held until this tab leaves the chat or closes
    })
    .catch(() => {});
}

function openStream(chatId, relay) {
  const es = new EventSource(`/api/chats/${chatId}/events`);
  state.source = es;
  const status = relay ? shareStatus : setStatus;
  es.onopen = () => {
    status("live");
    dispatch("open", null, relay);
  };
  for (const type of Object.keys(HANDLERS)) {
    if (type !== "open") es.addEventListener(type, (e) => dispatch(type, e.data, relay));
  }
  es.onerror = () => {
    if (es !== state.source) return;
    if (es.readyState === EventSource.CLOSED) {
      // refused (the server is at its stream limit, or gone): try again once in a while
      status("offline");
      setTimeout(() => es === state.source && openStream(chatId, relay), 3000);
    } else {
      status("reconnecting"); // the browser reconnects by itself, with Last-Event-ID
    }
  };
}

async function loadChat() {
  const chatId = state.chatId;
  try {
    const chat = await api(`/api/chats/${chatId}`);
    if (chatId !== state.chatId) return;
    $("chat-title").textContent = chat.title;
    document.title = `${chat.title} · TinyStore chat`;
    $("summary").textContent = chat.summary ? `Summary: ${chat.summary}` : "";
    $("summary").hidden = !chat.summary;
  } catch (err) {
    if (err.status === 404) chatGone(chatId);
    else showError(err.message);
  }
}

function renderChats(chats) {
  const nav = $("chats");
  nav.replaceChildren();
  for (const c of chats) {
    const a = document.createElement("a");
    a.href = `/chats/${c.id}`;
    a.textContent = c.title;
    a.dataset.id = String(c.id);
    if (a.dataset.id === state.chatId) a.className = "current";
    a.addEventListener("click", (e) => {
      e.preventDefault();
      history.pushState(null, "", a.href);
      openChat(a.dataset.id);
    });
    nav.appendChild(a);
  }
}

function markCurrent() {
  for (const a of $("chats").children) a.classList.toggle("current", a.dataset.id === state.chatId);
}

async function openChat(id) {
  id = chatKey(id);
  if (state.chatId !== null && state.chatId !== id) {
    // the box belongs to its chat: keep this one's draft, and show the other's (trial ED)
    const box = $("text");
    if (box.value || state.unsent !== null) state.drafts.set(state.chatId, { text: box.value, unsent: state.unsent });
    else state.drafts.delete(state.chatId);
    const draft = state.drafts.get(id);
    state.drafts.delete(id);
    box.value = draft ? draft.text : "";
    state.unsent = draft ? draft.unsent : null;
    showError("");
  }
  state.chatId = id;
  state.lastId = 0;
  state.rendered.clear();
  state.answered.clear();
  state.streaming.clear();
  state.gaveUp.clear();
  $("messages").replaceChildren();
  markCurrent();
  loadChat();
  refresh();
  connect();
}

async function start() {
  const match = location.pathname.match(/^\/chats\/(\d+)/);
  let chats = await api("/api/chats");
  // the digits, as given (trial EB: +"99999999999999999999999" is 1e+23), without leading zeros (trial ED)
  let id = match ? chatKey(match[1]) : null;
  if (id === null) {
    if (!chats.length) {
      chats = [await api("/api/chats", { method: "POST", body: JSON.stringify({ title: "First chat" }) })];
    }
    id = String(chats[0].id);
    history.replaceState(null, "", `/chats/${id}`);
  }
  state.chatId = id;
  renderChats(chats);
  openChat(id);
}

const MAX_TEXT = 4000; // characters (code points) a message may have, as the server counts them

// A send's idempotency key (the Idempotency-Key header): random, so that no two sends share one by chance.
function newKey() {
  if (window.crypto && crypto.randomUUID) return crypto.randomUUID(); // (in a secure context: https, localhost)
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// Whether trying the same send again may work: a failure of the network or of the server (a 5xx, a 503 while the
// store is unreachable; a 408 or a 429 too), not a refusal of the message itself (a 4xx; trial ED).
function mayRetry(err) {
  return err.status === undefined || err.status >= 500 || err.status === 408 || err.status === 429;
}

$("composer").addEventListener("submit", async (e) => {
  e.preventDefault();
  const box = $("text");
  const text = box.value;
  if (isBlank(text)) return; // (trial EB: a message of zero-width characters showed as an empty bubble)
  const length = [...text].length;
  if (length > MAX_TEXT) {
    showError(`A message has at most ${MAX_TEXT.toLocaleString()} characters; this one has ${length.toLocaleString()}.`);
    return; // kept in the box, to be shortened
  }
  // the same text sent again after a send that failed goes with the same key: when that send was saved after all
  // (its answer was lost), the server gives that message back rather than saving it twice (trial EW)
  const failed = state.unsent;
  const key = failed && failed.key && failed.text === text ? failed.key : newKey();
  box.value = "";
  state.unsent = null; // sent again: what failed before is no longer the news
  const chatId = state.chatId;
  try {
    const message = await api(`/api/chats/${chatId}/messages`, {
      method: "POST",
      headers: { "idempotency-key": key },
      body: JSON.stringify({ text }),
    });
    if (chatId !== state.chatId) return; // (another chat was opened meanwhile: this one reads it when it comes back)
    render(message);
    showError("");
  } catch (err) {
    const unsent = { reason: err.message, retry: mayRetry(err), text, key };
    if (chatId !== state.chatId) {
      // another chat was opened meanwhile: the text and its flag wait in the draft of the chat it was for (trial ED)
      state.drafts.set(chatId, { text, unsent });
      return;
    }
    // what was typed while it was on its way stays, after the text that was not sent (trial EW: it was replaced)
    const typed = box.value;
    box.value = isBlank(typed) ? text : `${text}\n${typed}`;
    state.unsent = unsent;
    showError("");
  }
});

// the box cleared: the text that was not sent is given up, and so is its flag
$("text").addEventListener("input", () => {
  if (state.unsent !== null && isBlank($("text").value)) {
    state.unsent = null;
    showError("");
  }
});

$("text").addEventListener("keydown", (e) => {
  // (not the Enter that ends an input method's composition, which picks the words: trial EW)
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});

$("new-chat").addEventListener("click", async () => {
  const button = $("new-chat");
  if (button.disabled) return;
  button.disabled = true; // one chat a click, however fast the clicks (trial EW: a double-click made two)
  try {
    const chat = await api("/api/chats", { method: "POST", body: JSON.stringify({ title: `Chat ${new Date().toLocaleString()}` }) });
    history.pushState(null, "", `/chats/${chat.id}`);
    renderChats(await api("/api/chats"));
    openChat(String(chat.id)); // (which keeps the draft of the chat left, trial ED)
  } catch (err) {
    showError(err.message);
  } finally {
    button.disabled = false;
  }
});

window.addEventListener("popstate", () => {
  const match = location.pathname.match(/^\/chats\/(\d+)/);
  if (match) openChat(match[1]);
});

// a chat made in another tab shows in this one's list when this tab is shown again
async function refreshChats() {
  try {
    renderChats(await api("/api/chats"));
  } catch (err) {
    // offline: the list stays as it is until the next time
  }
}
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") refreshChats();
});
window.addEventListener("focus", refreshChats);

window.addEventListener("online", () => {
  const es = state.source;
  if (es && es.readyState === EventSource.CLOSED) openStream(state.chatId, !!state.channel);
  refresh(); // what was saved while this device was offline
  loadChat();
});

start().catch((err) => showError(err.message));
