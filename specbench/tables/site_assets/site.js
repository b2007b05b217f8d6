"use strict";
const DATA = JSON.parse(document.getElementById("site-data").textContent);
const PALETTE = ["#8ecae6", "#ffb703", "#90be6d", "#f4978e", "#b39ddb", "#f9c74f", "#4cc9f0", "#e5989b",
  "#a3b18a", "#ffd6a5"];
const el = (tag, attrs = {}, text) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
};
const fmt = (v, d = 2) => (v === null || v === undefined ? "—" : Number(v).toFixed(d));

// ------------------------------------------------------------------ tabs
document.querySelectorAll("nav button").forEach((b) => b.addEventListener("click", () => {
  document.querySelectorAll("nav button, .tab").forEach((x) => x.classList.remove("active"));
  b.classList.add("active");
  document.getElementById("tab-" + b.dataset.tab).classList.add("active");
}));

// ------------------------------------------------------------------ tables
const filterState = {};
function keyValue(row, key) {
  if (key === "method") return [row.keys.method, row.keys.preset].filter((x) => x !== undefined && x !== null);
  const v = row.keys[key];
  return v === undefined || v === null ? [] : [String(v)];
}
function buildFilters() {
  const box = document.getElementById("filters");
  for (const key of DATA.filters) {
    const values = new Set();
    for (const t of DATA.tables) {
      if (key === "dataset") t.columns.forEach((c) => c.dataset !== undefined && values.add(String(c.dataset)));
      t.rows.forEach((r) => keyValue(r, key).forEach((v) => values.add(String(v))));
    }
    const select = el("select", { id: "filter-" + key });
    select.appendChild(el("option", { value: "" }, "all"));
    [...values].sort().forEach((v) => select.appendChild(el("option", { value: v }, v)));
    select.addEventListener("change", () => { filterState[key] = select.value; renderTables(); });
    const label = el("label", {}, key + " ");
    label.appendChild(select);
    box.appendChild(label);
  }
}
const sortState = {};
function cellText(c) {
  if (!c) return "—";
  let s = fmt(c.ours);
  if (c.lo !== null && c.lo !== undefined) s += ` [${fmt(c.lo)}, ${fmt(c.hi)}]`;
  return s;
}
const wideState = {};  // tables shown in their wide form (one column per dataset × metric)
function renderTable(shown) {
  const wide = shown.wide && wideState[shown.name];
  const t = wide ? shown.wide : shown;
  const block = el("div", { class: "table-block", "data-table": t.name, "data-form": wide ? "wide" : "long" });
  block.appendChild(el("h2", {}, t.title));
  if (shown.wide) {  // a table that reads down (a row per dataset) and its wide form, one click apart
    const toggle = el("button", { class: "form-toggle" },
      wide ? "one row per dataset" : "wide form: a column per dataset");
    toggle.addEventListener("click", () => { wideState[shown.name] = !wide; renderTables(); });
    block.appendChild(toggle);
  }
  const cols = t.columns.filter((c) => !filterState.dataset || c.dataset === undefined ||
    String(c.dataset) === filterState.dataset);
  let rows = t.rows.filter((r) => DATA.filters.every((k) => !filterState[k] ||
    (k === "dataset" && !("dataset" in r.keys)) || keyValue(r, k).map(String).includes(filterState[k])));
  const sort = sortState[t.name];
  if (sort) {
    const val = (r) => (sort.col in r.keys ? r.keys[sort.col] : (r.cells[sort.col] || {}).ours);
    rows = rows.slice().sort((a, b) => {
      const x = val(a), y = val(b);
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * sort.dir;
    });
  }
  block.appendChild(el("div", { class: "count" }, `${rows.length} of ${t.rows.length} rows`));
  const table = el("table");
  const head = el("tr");
  const header = (label, col) => {
    const th = el("th", { "data-col": col }, label);
    if (sort && sort.col === col) th.classList.add(sort.dir > 0 ? "sorted-asc" : "sorted-desc");
    th.addEventListener("click", () => {
      const cur = sortState[t.name];
      sortState[t.name] = { col, dir: cur && cur.col === col ? -cur.dir : 1 };
      renderTables();
    });
    head.appendChild(th);
  };
  t.row_keys.forEach((k) => header(k, k));
  cols.forEach((c) => header(c.key, c.key));
  table.appendChild(head);
  for (const r of rows) {
    const tr = el("tr", { class: "row" });
    t.row_keys.forEach((k) => tr.appendChild(el("td", {}, r.keys[k] === null ? "—" : String(r.keys[k]))));
    for (const c of cols) {
      const cell = r.cells[c.key];
      const td = el("td", { class: "num" });
      td.appendChild(el("span", { class: "ours" }, cellText(cell)));
      if (cell && cell.paper !== null && cell.paper !== undefined) {
        td.appendChild(el("span", { class: "pub" }, ` / ${fmt(cell.paper)}` +
          (cell.ratio !== null && cell.ratio !== undefined ? ` (${fmt(cell.ratio)})` : "")));
      }
      tr.appendChild(td);
    }
    table.appendChild(tr);
  }
  block.appendChild(table);
  const notes = el("ul", { class: "notes" });
  t.notes.forEach((n) => notes.appendChild(el("li", {}, n)));
  block.appendChild(notes);
  return block;
}
function renderTables() {
  const box = document.getElementById("tables");
  box.replaceChildren(...DATA.tables.map(renderTable));
  if (!DATA.tables.length) box.appendChild(el("p", {}, "No table has rows in " + DATA.results + "."));
}

// ------------------------------------------------------------------ figures and runs
function renderFigures() {
  const box = document.getElementById("figures");
  for (const f of DATA.figures) {
    const fig = el("figure");
    fig.appendChild(el("img", { src: f.file, alt: f.name }));
    fig.appendChild(el("figcaption", {}, f.name));
    box.appendChild(fig);
  }
  if (!DATA.figures.length) box.appendChild(el("p", {}, "No figure has rows."));
}
function renderRuns() {
  const box = document.getElementById("runs");
  const keys = [...new Set(DATA.runs.flatMap((r) => Object.keys(r)))];
  const table = el("table", { id: "runs-table" });
  const head = el("tr");
  keys.forEach((k) => head.appendChild(el("th", {}, k)));
  table.appendChild(head);
  for (const r of DATA.runs) {
    const tr = el("tr", { class: "row" });
    keys.forEach((k) => tr.appendChild(el("td", {}, r[k] === null || r[k] === undefined ? "" : String(r[k]))));
    table.appendChild(tr);
  }
  box.appendChild(table);
}

// ------------------------------------------------------------------ generations, token by token
const colours = {};
function colour(source) {
  if (source === "target") return "#e9ecef";
  if (!(source in colours)) colours[source] = PALETTE[Object.keys(colours).length % PALETTE.length];
  return colours[source];
}
const label = (s) => s.split("+").map((x) => DATA.source_labels[x] || x).join(" + ");
function generationLabel(g) {
  return [g.experiment, g.model, g.preset, g.dataset, "T=" + g.temperature, "sample " + g.sample_id,
    "turn " + g.turn, "repeat " + g.repeat].join(" · ");
}
function fillGenerations() {
  const select = document.getElementById("generation");
  const query = document.getElementById("generation-search").value.toLowerCase();
  select.replaceChildren();
  DATA.generations.forEach((g, i) => {
    const text = generationLabel(g);
    if (!query || text.toLowerCase().includes(query)) select.appendChild(el("option", { value: i }, text));
  });
  renderGeneration();
}
function renderGeneration() {
  const select = document.getElementById("generation");
  const box = document.getElementById("tokens");
  const info = document.getElementById("generation-info");
  const legend = document.getElementById("source-legend");
  const steps = document.getElementById("steps");
  if (select.value === "") {
    box.replaceChildren(el("p", {}, "No generation."));
    return;
  }
  const g = DATA.generations[Number(select.value)];
  const sources = g.sources || g.tokens.map(() => "unknown");
  info.replaceChildren(el("p", {}, `τ ${fmt(g.tau)} · ${g.tokens.length} tokens in ${g.steps} steps` +
    (g.decoded ? "" : " · token ids shown (the model's tokenizer is not available here)") +
    (g.sources ? "" : " · this row predates token_sources: no sources")));
  const used = [...new Set(sources)];
  legend.replaceChildren(...used.map((s) => {
    const span = el("span", { class: "legend-item", "data-source": s }, label(s));
    span.style.background = colour(s);
    return span;
  }));
  const spans = g.tokens.map((piece, j) => {
    const span = el("span", { class: "tok", "data-step": g.step[j], "data-source": sources[j],
      title: `step ${g.step[j]} · ${label(sources[j])}` }, piece);
    span.style.background = colour(sources[j]);
    if (j === 0 || g.step[j] !== g.step[j - 1]) span.classList.add("step-start");
    return span;
  });
  box.replaceChildren(...spans);
  const most = Math.max(...g.step_tokens, 1);
  const bars = g.step_tokens.map((n, i) => {
    const b = el("span", { class: "bar", title: `step ${i}: ${n} token${n === 1 ? "" : "s"}` });
    b.style.height = (6 + 40 * n / most) + "px";
    return b;
  });
  steps.replaceChildren(el("div", {}, "tokens per step (the accepted length; step 0 is the prefill): " +
    g.step_tokens.join(" ")), el("div", {}, ""), ...bars);
}

buildFilters();
renderTables();
renderFigures();
renderRuns();
document.getElementById("generation").addEventListener("change", renderGeneration);
document.getElementById("generation-search").addEventListener("input", fillGenerations);
fillGenerations();
