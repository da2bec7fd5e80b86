// trainmem's offline page: a job form built from this server's /openapi.json, the answers of
// /v1/estimate and /v1/recommend drawn as SVG and tables. No library, no other host: every
// number shown is a field of an API answer (nothing is computed here but GiB = bytes / 2**30).
"use strict";

const GIB = 2 ** 30;
const SVG = "http://www.w3.org/2000/svg";
const COLORS = {
  parameters: "#4e79a7", master_weights: "#a0cbe8", gradients: "#f28e2b",
  optimizer_states: "#e15759", activations: "#59a14f", transient: "#edc948",
  framework_overhead: "#b07aa1", fragmentation: "#9c755f",
};
const HEAT_MICRO_BATCHES = [1, 2, 4, 8, 16, 32];
const HEAT_SEQ_FACTORS = [0.25, 0.5, 1, 2, 4];
const PLAN_FIELDS = [
  "gpu", "num_gpus", "num_nodes", "tp", "pp", "cp", "dp", "ep", "zero", "recompute",
  "micro_batch_size", "grad_accum_steps", "global_batch_size", "framework", "precision",
];

let schema = null;   // /openapi.json
let fields = [];     // [{name, spec, input}] in the schema's order

const $ = (id) => document.getElementById(id);
const gib = (bytes) => (bytes / GIB).toFixed(2);
const flag = (name) => name.replaceAll("_", "-");

// ---- the form, from the request model of /v1/estimate ---------------------------------------

function requestSchema(path) {
  const body = schema.paths[path].post.requestBody.content["application/json"].schema;
  return schema.components.schemas[body.$ref.split("/").pop()];
}

function nonNull(spec) {
  // `X | None` is anyOf [X, null] in the schema: the form edits X, empty means null.
  if (!spec.anyOf) return spec;
  return spec.anyOf.find((s) => s.type !== "null") || spec;
}

function inputFor(name, spec) {
  const kind = nonNull(spec);
  let input;
  if (kind.enum) {
    input = document.createElement("select");
    const choices = spec.anyOf ? ["", ...kind.enum] : kind.enum;
    for (const choice of choices) input.add(new Option(choice || "(none)", choice));
    input.value = spec.default ?? "";
  } else if (kind.type === "boolean") {
    input = document.createElement("input");
    input.type = "checkbox";
    input.checked = Boolean(spec.default);
  } else {
    input = document.createElement("input");
    if (kind.type === "integer" || kind.type === "number") {
      input.type = "number";
      input.step = kind.type === "integer" ? "1" : "any";
      if (kind.minimum !== undefined) input.min = kind.minimum;
      if (kind.maximum !== undefined) input.max = kind.maximum;
    }
    const shown = Array.isArray(spec.default) ? spec.default.join(" ") : spec.default;
    input.value = shown ?? "";
    if (kind.type === "array") input.placeholder = "KEY=VALUE ...";
  }
  input.id = "f-" + name;
  input.name = name;
  return input;
}

function buildForm() {
  const model = requestSchema("/v1/estimate");
  const box = $("fields");
  for (const [name, spec] of Object.entries(model.properties)) {
    const label = document.createElement("label");
    label.title = spec.description || "";
    const text = document.createElement("span");
    text.textContent = flag(name);
    const input = inputFor(name, spec);
    label.append(text, input);
    box.append(label);
    fields.push({ name, spec, input });
  }
  const format = schema.paths["/v1/recommend"].post.parameters.find((p) => p.name === "format");
  for (const choice of format.schema.enum) $("format").add(new Option(choice, choice));
  $("format").value = format.schema.enum.includes("torchrun") ? "torchrun" : format.schema.default;
}

function fieldValue({ spec, input }) {
  const kind = nonNull(spec);
  if (kind.type === "boolean") return input.checked;
  const text = input.value.trim();
  if (text === "") return spec.anyOf ? null : spec.default;
  if (kind.type === "integer" || kind.type === "number") return Number(text);
  if (kind.type === "array") return text.split(/[\s,]+/).filter(Boolean);
  return text;
}

function jobBody() {
  // Only what differs from the schema's default: the same request a user would type, and the
  // defaults of another command (recommend's framework, precision) are left to it.
  const body = {};
  for (const field of fields) {
    const value = fieldValue(field);
    if (JSON.stringify(value) !== JSON.stringify(field.spec.default ?? null)) {
      body[field.name] = value;
    }
  }
  return body;
}

function only(body, path) {
  const known = requestSchema(path).properties;
  return Object.fromEntries(Object.entries(body).filter(([k]) => k in known));
}

// ---- the API ----------------------------------------------------------------------------------

async function post(path, body) {
  // 503 (every worker busy) is retried after Retry-After; any other error ends with its line.
  for (let attempt = 0; ; attempt++) {
    const response = await fetch(path, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    if (response.status === 503 && attempt < 20) {
      await new Promise((done) => setTimeout(done, 250));
      continue;
    }
    const answer = await response.json();
    if (!response.ok) throw new Error(`${path}: ${answer.error || response.status}`);
    return answer;
  }
}

// ---- drawing ----------------------------------------------------------------------------------

function svgNode(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function drawBar(report) {
  // One stacked bar of the components at the peak, against the GPU's usable memory and the
  // limit left after the headroom.
  const svg = $("bar");
  svg.replaceChildren();
  const width = 520, height = 64, left = 10, right = 10;
  const usable = report.gpu.usable_bytes;
  const limit = usable * (1 - report.headroom);
  const scale = (width - left - right) / Math.max(report.peak_device_bytes, usable);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  let x = left;
  for (const [name, bytes] of Object.entries(report.breakdown_at_peak)) {
    if (bytes <= 0) continue;
    const rect = svgNode("rect", { x, y: 14, width: bytes * scale, height: 30, fill: COLORS[name] || "#bab0ac" });
    rect.append(svgNode("title", {}, `${name}: ${gib(bytes)} GiB`));
    svg.append(rect);
    x += bytes * scale;
  }
  const marks = [[limit, "limit after headroom", "4 3", 9, "end"], [usable, "usable", "", 60, "end"]];
  for (const [bytes, label, dash, y, anchor] of marks) {
    const lx = left + bytes * scale;
    svg.append(svgNode("line", { x1: lx, x2: lx, y1: 11, y2: 50, stroke: "#222", "stroke-dasharray": dash }));
    svg.append(svgNode("text", { x: lx, y, "text-anchor": anchor, class: "axis" }, label));
  }
}

function row(table, cells, attrs = {}) {
  const tr = table.insertRow();
  for (const [k, v] of Object.entries(attrs)) tr.dataset[k] = v;
  for (const cell of cells) tr.insertCell().textContent = cell;
  return tr;
}

function showNumbers(report) {
  const table = $("numbers");
  table.replaceChildren();
  for (const [name, bytes] of Object.entries(report.breakdown_at_peak)) {
    const tr = row(table, ["", name, gib(bytes)], { key: name, bytes });
    const swatch = document.createElement("i");
    swatch.style.background = COLORS[name] || "#bab0ac";
    tr.cells[0].append(swatch);
  }
  const totals = [
    ["peak_device_bytes", "peak (device)"],
    ["peak_reserved_bytes", "peak reserved (torch)"],
    ["peak_allocated_bytes", "peak allocated"],
  ];
  for (const [key, label] of totals) row(table, ["", label, gib(report[key])], { key, bytes: report[key] });
  row(table, ["", "usable", gib(report.gpu.usable_bytes)], { key: "usable_bytes", bytes: report.gpu.usable_bytes });
  row(table, ["", "headroom left", gib(report.headroom_bytes)], { key: "headroom_bytes", bytes: report.headroom_bytes });
  for (const tr of table.rows) tr.cells[2].className = "num";
}

function drawPhases(report) {
  const svg = $("phases");
  svg.replaceChildren();
  const names = Object.keys(report.phases);
  const width = 420, rowHeight = 22, left = 110, height = names.length * rowHeight + 18;
  const usable = report.gpu.usable_bytes;
  const scale = (width - left - 60) / Math.max(usable, ...Object.values(report.phases));
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  names.forEach((name, i) => {
    const bytes = report.phases[name], y = i * rowHeight + 4;
    svg.append(svgNode("text", { x: left - 6, y: y + 13, "text-anchor": "end", class: "axis" }, name));
    const fill = bytes > usable ? "#e15759" : "#59a14f";
    svg.append(svgNode("rect", { x: left, y, width: bytes * scale, height: rowHeight - 6, fill }));
    svg.append(svgNode("text", { x: left + bytes * scale + 4, y: y + 13, class: "axis" }, gib(bytes)));
  });
  const ux = left + usable * scale;
  svg.append(svgNode("line", { x1: ux, x2: ux, y1: 0, y2: height - 14, stroke: "#222" }));
  svg.append(svgNode("text", { x: ux, y: height - 3, "text-anchor": "middle", class: "axis" }, "usable"));
  const time = report.time || {};
  const timing = $("timing");
  timing.replaceChildren();
  if (time.step_time_s !== undefined) {
    row(timing, ["step time (s)", time.step_time_s.toFixed(3)], { key: "step_time_s" });
    row(timing, ["tokens/s per GPU", Math.round(time.tokens_per_second_per_gpu).toLocaleString("en")]);
    row(timing, ["MFU", (100 * time.mfu).toFixed(1) + "%"]);
  }
}

function showVerdict(report) {
  const verdict = $("verdict");
  const margin = gib(Math.abs(report.headroom_bytes));
  verdict.textContent = report.fits
    ? `FITS on ${report.gpu.name}: ${gib(report.peak_device_bytes)} GiB, ${margin} GiB to spare after the headroom`
    : `DOES NOT FIT on ${report.gpu.name}: ${gib(report.peak_device_bytes)} GiB, ${margin} GiB over`;
  verdict.className = report.fits ? "fits" : "nofit";
  $("peak-phase").textContent = report.peak_phase;
}

async function drawHeatmap(body, seqLen) {
  // Each cell is one /v1/estimate with micro-batch and sequence length changed (in series: the
  // server's other worker is left to /v1/recommend).
  const seqs = [...new Set(HEAT_SEQ_FACTORS.map((f) => Math.max(1, Math.round(seqLen * f))))];
  const table = document.createElement("table");
  table.className = "heat";
  const head = table.createTHead().insertRow();
  head.insertCell().textContent = "micro-batch \\ seq";
  for (const seq of seqs) head.insertCell().textContent = seq;
  const rows = table.createTBody();
  for (const micro of HEAT_MICRO_BATCHES) {
    const tr = rows.insertRow();
    tr.insertCell().textContent = micro;
    for (const seq of seqs) {
      const cell = tr.insertCell();
      try {
        const report = await post("/v1/estimate", { ...body, micro_batch_size: micro, seq_len: seq });
        cell.textContent = gib(report.peak_device_bytes);
        cell.className = report.fits ? "fits" : "nofit";
      } catch (error) {
        cell.textContent = "—";
        cell.title = error.message;
      }
    }
  }
  $("heatmap").replaceChildren(table);
}

async function showPlan(body) {
  const fleet = $("fleet").value.trim() || `${fieldValue(byName("num_gpus"))}x${fieldValue(byName("gpu"))}`;
  const format = $("format").value;
  $("plan-fleet").textContent = `(fleet ${fleet}, POST /v1/recommend?format=${format})`;
  const table = $("plan");
  table.replaceChildren();
  try {
    const plan = await post(`/v1/recommend?format=${encodeURIComponent(format)}`, { ...only(body, "/v1/recommend"), fleet });
    for (const key of PLAN_FIELDS) if (key in plan) row(table, [key, String(plan[key])]);
    row(table, ["peak (GiB)", gib(plan.peak_device_bytes)]);
    row(table, ["step time (s)", Number(plan.step_time_s).toFixed(3)]);
    $("launch").textContent = plan.launch || JSON.stringify(plan, null, 2);
  } catch (error) {
    $("launch").textContent = error.message;
  }
}

const byName = (name) => fields.find((f) => f.name === name);

// ---- the flow ---------------------------------------------------------------------------------

async function submit(event) {
  if (event) event.preventDefault();
  const result = $("result");
  result.dataset.state = "running";
  $("error").hidden = true;
  $("submit").disabled = true;
  $("status").textContent = "estimating…";
  const body = jobBody();
  $("body").textContent = JSON.stringify(body, null, 2);
  try {
    const report = await post("/v1/estimate", body);
    showVerdict(report);
    drawBar(report);
    showNumbers(report);
    drawPhases(report);
    result.hidden = false;
    $("status").textContent = "heatmap and plan…";
    await Promise.all([drawHeatmap(body, fieldValue(byName("seq_len"))), showPlan(body)]);
    $("status").textContent = "";
  } catch (error) {
    $("error").textContent = error.message;
    $("error").hidden = false;
    $("status").textContent = "";
  } finally {
    $("submit").disabled = false;
    result.dataset.state = "done";
  }
}

async function copyLaunch() {
  const text = $("launch").textContent;
  try {
    await navigator.clipboard.writeText(text);
    $("copied").textContent = "copied";
  } catch {
    getSelection().selectAllChildren($("launch"));  // no clipboard access: select it instead
    $("copied").textContent = "selected: press Ctrl+C";
  }
}

async function start() {
  schema = await (await fetch("/openapi.json")).json();
  $("version").textContent = "v" + schema.info.version;
  buildForm();
  $("job").addEventListener("submit", submit);
  $("copy").addEventListener("click", copyLaunch);
  document.body.dataset.ready = "true";
}

start().catch((error) => {
  $("error").textContent = "could not read /openapi.json: " + error.message;
  $("error").hidden = false;
});
