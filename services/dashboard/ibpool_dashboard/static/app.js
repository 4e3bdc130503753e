// The dashboard's shell: hash routes to pages, the JSON models, and the server-sent events from the bus.
import { h } from "./dom.js";
import { pages } from "./pages.js";

const main = document.getElementById("page");
const live = document.getElementById("live");
const errors = document.getElementById("errors");
const tokenInput = document.getElementById("token");
tokenInput.value = sessionStorage.getItem("ibpool-token") || "";
tokenInput.addEventListener("change", () => { sessionStorage.setItem("ibpool-token", tokenInput.value); route(); });

export const state = { busEvents: 0, ticks: 0 };
window.ibpool = state; // what a test (or a curious operator) reads from the console

export async function getJson(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await r.json().catch(() => null);
  if (!r.ok) throw new Error(body && body.error ? `${body.error}: ${body.detail || ""}` : `${path}: HTTP ${r.status}`);
  return body;
}

export const operatorToken = () => tokenInput.value.trim();

// An operator's action, with the token and the reason from the operator panel.
export async function act(path) {
  const reason = document.getElementById("reason").value.trim();
  const token = operatorToken();
  if (!token) return showErrors({ action: "enter the operator token first (operator panel)" });
  const r = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
    body: JSON.stringify(reason ? { reason } : {}),
  });
  const body = await r.json().catch(() => ({}));
  showErrors(r.ok ? {} : { action: `${body.error || r.status}: ${body.detail || ""}` });
  refresh();
}

export function showErrors(map) {
  errors.replaceChildren(...Object.entries(map || {}).map(([k, v]) => h("div", {}, `${k}: ${v}`)));
}

let current = null;
let timer = null;

function parse() {
  const [path, query] = (location.hash.replace(/^#\/?/, "") || "overview").split("?");
  const [name, ...rest] = path.split("/");
  return { name: pages[name] ? name : "overview", arg: rest.map(decodeURIComponent).join("/"), query: new URLSearchParams(query || "") };
}

async function render() {
  if (!current) return;
  const page = current;
  try {
    const view = await page.def.load(page.route);
    if (page !== current) return; // the operator went elsewhere meanwhile
    main.replaceChildren(page.def.draw(view.model ?? view, page.route));
    showErrors(view.errors);
    main.dataset.renders = String(Number(main.dataset.renders || 0) + 1);
    if (view.errors && Object.keys(view.errors).length) refresh(3000); // a service away: try again soon
  } catch (e) {
    if (page === current) {
      showErrors({ [page.route.name]: e.message });
      refresh(3000);
    }
  }
}

export function refresh(delay = 250) {
  clearTimeout(timer);
  timer = setTimeout(render, delay);
}

function route() {
  const r = parse();
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.getAttribute("href") === `#/${r.name}`);
  current = { route: r, def: pages[r.name] };
  document.body.dataset.page = r.name;
  main.dataset.renders = "0";
  main.replaceChildren(h("p", { class: "muted" }, "loading…"));
  render();
}

function connect() {
  const source = new EventSource("/events");
  source.addEventListener("open", () => {
    if (document.body.dataset.sse === "closed") refresh(); // back after a break: what changed meanwhile
    live.textContent = "● live"; live.className = "open"; document.body.dataset.sse = "open";
  });
  source.addEventListener("error", () => { live.textContent = "○ reconnecting"; live.className = ""; document.body.dataset.sse = "closed"; });
  source.addEventListener("bus", (m) => {
    const row = JSON.parse(m.data);
    state.busEvents += 1;
    if (current && current.def.onEvent && current.def.onEvent(row, current.route, main)) refresh();
  });
  source.addEventListener("tick", (m) => {
    state.ticks += 1;
    if (current && current.def.onTick && current.def.onTick(JSON.parse(m.data), current.route)) refresh();
  });
}

window.addEventListener("hashchange", route);
route();
connect();
