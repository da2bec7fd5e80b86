// trainmem's API docs, offline: each operation of this server's /openapi.json with its query
// parameters and request fields (type, default, choices, bounds, help). A small stand-in for
// Swagger UI, which FastAPI loads from a CDN.
"use strict";

const el = (tag, text, className) => {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
};

function resolve(schema, spec) {
  return spec && spec.$ref ? schema.components.schemas[spec.$ref.split("/").pop()] : spec;
}

function typeOf(schema, spec) {
  spec = resolve(schema, spec);
  if (!spec) return "";
  if (spec.anyOf) return spec.anyOf.map((s) => typeOf(schema, s)).join(" | ");
  if (spec.enum) return spec.enum.join(" | ");
  if (spec.type === "array") return `list of ${typeOf(schema, spec.items)}`;
  if (spec.type === "object" && spec.title) return spec.title;
  return spec.type || spec.title || "";
}

function bounds(spec) {
  const parts = [];
  for (const s of spec.anyOf || [spec]) {
    if (s.minimum !== undefined) parts.push(`≥ ${s.minimum}`);
    if (s.exclusiveMinimum !== undefined) parts.push(`> ${s.exclusiveMinimum}`);
    if (s.maximum !== undefined) parts.push(`≤ ${s.maximum}`);
    if (s.exclusiveMaximum !== undefined) parts.push(`< ${s.exclusiveMaximum}`);
    if (s.maxLength !== undefined) parts.push(`≤ ${s.maxLength} chars`);
  }
  return parts.join(", ");
}

function fieldTable(schema, rows) {
  // rows: [name, spec, required]
  const table = el("table", undefined, "props");
  const head = table.createTHead().insertRow();
  for (const title of ["field", "type", "default", "bounds", "help"]) head.append(el("th", title));
  for (const [name, spec, required] of rows) {
    const tr = table.insertRow();
    tr.insertCell().append(el("code", name));
    tr.insertCell().textContent = typeOf(schema, spec);
    const shown = spec.default === undefined ? (required ? "required" : "") : JSON.stringify(spec.default);
    tr.insertCell().textContent = shown;
    tr.insertCell().textContent = bounds(spec);
    tr.insertCell().textContent = spec.description || "";
  }
  return table;
}

function operation(schema, path, method, op) {
  const box = el("section", undefined, "op");
  const title = el("h2");
  title.append(el("span", method.toUpperCase(), `method ${method}`), el("code", path), ` ${op.summary || ""}`);
  box.append(title);
  if (op.description) box.append(el("p", op.description, "desc"));
  const params = (op.parameters || []).map((p) => [`?${p.name}`, { ...p.schema, description: p.description }, p.required]);
  if (params.length) box.append(el("h3", "Query"), fieldTable(schema, params));
  const body = op.requestBody && op.requestBody.content["application/json"];
  if (body) {
    const model = resolve(schema, body.schema);
    const required = new Set(model.required || []);
    const rows = Object.entries(model.properties || {}).map(([n, s]) => [n, s, required.has(n)]);
    box.append(el("h3", `Body (JSON): ${model.title || ""}`), fieldTable(schema, rows));
  }
  const codes = Object.keys(op.responses || {}).join(", ");
  box.append(el("p", `Answers: ${codes}`));
  return box;
}

async function start() {
  const schema = await (await fetch("/openapi.json")).json();
  document.getElementById("version").textContent = `v${schema.info.version}`;
  const ops = document.getElementById("ops");
  for (const [path, methods] of Object.entries(schema.paths)) {
    for (const [method, op] of Object.entries(methods)) ops.append(operation(schema, path, method, op));
  }
  document.body.dataset.ready = "true";
}

start().catch((error) => {
  const box = document.getElementById("error");
  box.textContent = "could not read /openapi.json: " + error.message;
  box.hidden = false;
});
