// The dashboard's API client: same-origin fetches with the session cookie (never a token in a URL).
export async function get(path) {
  const resp = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (resp.status === 401) { location.reload(); throw new Error("logged out"); }
  if (!resp.ok) throw new Error(`${path}: HTTP ${resp.status}`);
  return resp.json();
}

// Server-sent events; the browser reconnects by itself, `after` resumes past the last request seen.
export function events(after, handlers, onState) {
  const source = new EventSource(`/ui/api/events?after=${after}`);
  source.onopen = () => onState(true);
  source.onerror = () => onState(false);
  for (const [name, fn] of Object.entries(handlers)) {
    source.addEventListener(name, (ev) => fn(JSON.parse(ev.data)));
  }
  return source;
}

// Elements without innerHTML: every value from the server is text.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export const time = (ts) => new Date(ts * 1000).toLocaleTimeString();
export const when = (ts) => new Date(ts * 1000).toLocaleString();
export const bytes = (n) => (n === null || n === undefined) ? "—"
  : n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KB` : `${(n / 1048576).toFixed(1)} MB`;
export const ms = (v) => (v === null || v === undefined) ? "—" : `${Math.round(v)} ms`;
