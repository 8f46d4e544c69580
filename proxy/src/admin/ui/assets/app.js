// ctxscope's UI: a hash-routed page over the admin port's JSON (/api/*, /ui/api/*); no dependencies.

const view = () => document.getElementById("view");
const KINDS = ["history_dropped", "engine_truncation", "context_overflow", "phantom_cache_reuse", "cache_miss", "amnesia_reply", "token_count_drift"];
const state = { latestTurn: 0, latestFinding: 0, onTurn: null, onFinding: null };

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function time(ms) { return ms ? new Date(ms).toLocaleString() : ""; }
function us(v) { return v == null ? "" : v >= 1e6 ? (v / 1e6).toFixed(2) + " s" : (v / 1e3).toFixed(1) + " ms"; }
async function getJson(url) {
  const r = await fetch(url, { credentials: "same-origin" });
  if (r.status === 401) { location.href = "/ui/login"; throw new Error("log in first"); }
  const body = await r.json();
  if (!r.ok) throw new Error(body?.error?.message || r.statusText);
  return body;
}
function sevClass(s) { return "chip sev-" + esc(s); }
function relation(r) {
  if (!r) return "";
  const k = r.kind;
  if (k === "extend") return "extend";
  if (k === "regenerate") return `regenerate of #${r.turn}`;
  if (k === "branch") return `branch of c${r.conversation} (${r.shared_messages} shared)`;
  if (k === "diverged") return `diverged (${r.shared_messages} shared)`;
  return k;
}

// ---- conversations -------------------------------------------------------------------------------
async function conversationsPage(params) {
  const p = new URLSearchParams(params);
  const v = view();
  const opt = (vals, cur) => ['<option value="">any</option>', ...vals.map((x) => `<option${x === cur ? " selected" : ""}>${x}</option>`)].join("");
  const dt = (ms) => (ms ? new Date(+ms - new Date().getTimezoneOffset() * 60000).toISOString().slice(0, 16) : "");
  v.innerHTML = `<h1>Conversations</h1><div class="chips" id="counts"></div>
    <form class="filters" id="filters">
      <label>finding<select name="kind">${opt(KINDS, p.get("kind"))}</select></label>
      <label>severity<select name="severity">${opt(["critical", "warning", "info"], p.get("severity"))}</select></label>
      <label>model<input name="model" value="${esc(p.get("model"))}"></label>
      <label>upstream<input name="upstream" value="${esc(p.get("upstream"))}"></label>
      <label>updated after<input type="datetime-local" name="since" value="${dt(p.get("since"))}"></label>
      <label>updated before<input type="datetime-local" name="until" value="${dt(p.get("until"))}"></label>
      <label>text (latest turn of recent conversations)<input name="q" value="${esc(p.get("q"))}"></label>
      <button>Filter</button><button type="button" class="plain" id="clear">Clear</button></form>
    <table id="conversations"><thead><tr><th>id</th><th>name</th><th>model</th><th>upstream</th><th>turns</th><th>updated</th><th>findings</th></tr></thead><tbody></tbody></table>
    <p><button class="plain" id="more" hidden>More</button> <span class="muted" id="scan"></span></p>`;
  document.getElementById("clear").onclick = () => (location.hash = "#/");
  document.getElementById("filters").onsubmit = (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const [k, val] of new FormData(e.target)) {
      if (!val) continue;
      q.set(k, k === "since" || k === "until" ? String(new Date(val).getTime()) : val);
    }
    location.hash = "#/?" + q.toString();
  };
  getJson("/ui/api/finding-counts").then((counts) => {
    document.getElementById("counts").innerHTML = Object.entries(counts)
      .map(([k, n]) => `<a class="chip" href="#/?kind=${k}">${k.replace(/_/g, " ")}: <b>${n}</b></a>`).join("");
  }).catch(() => {});
  const body = document.querySelector("#conversations tbody");
  const row = (c, fresh) => {
    const tr = document.createElement("tr");
    tr.className = "clickable" + (fresh ? " new" : "");
    tr.dataset.id = c.id;
    const f = Object.entries(c.findings || {}).map(([k, n]) => `<span class="chip">${esc(k)} ${n > 1 ? "×" + n : ""}</span>`).join(" ");
    tr.innerHTML = `<td>${c.id}</td><td>${esc(c.name)}</td><td>${esc(c.model)}</td><td class="mono">${esc(c.upstream)}</td><td>${c.turns}</td><td>${time(c.updated_unix_ms)}</td><td>${f}</td>`;
    tr.onclick = () => (location.hash = `#/c/${c.id}`);
    return tr;
  };
  let cursor = null;
  const load = async () => {
    const q = new URLSearchParams(p);
    if (cursor) q.set("cursor", cursor);
    const page = await getJson("/ui/api/conversations?" + q.toString());
    for (const c of page.conversations) body.appendChild(row(c));
    cursor = page.next;
    document.getElementById("more").hidden = !cursor;
    document.getElementById("scan").textContent = p.get("q") ? `text search looks at ${page.scanned} conversations per page` : "";
  };
  document.getElementById("more").onclick = load;
  await load();
  const filtered = [...p.keys()].length > 0;
  state.onTurn = filtered ? null : async (t) => {
    const detail = await getJson(`/api/conversations/${t.conversation}`);
    body.querySelector(`tr[data-id="${t.conversation}"]`)?.remove();
    const c = detail.conversation;
    c.findings = {};
    for (const f of detail.findings) c.findings[f.kind] = (c.findings[f.kind] || 0) + 1;
    body.prepend(row(c, true));
  };
}

// ---- one conversation ----------------------------------------------------------------------------
function contextLimit(findings) {
  for (const f of findings) {
    for (const [k, val] of Object.entries(f.evidence || {})) {
      if (/context_(limit|length|tokens)|max_model_len/.test(k) && typeof val === "number") return val;
    }
  }
  return null;
}

/** Four horizontal grid lines labelled with their values, and the x axis at `bottom`. */
function gridAndAxis(left, right, bottom, max, y) {
  let svg = "";
  for (let k = 0; k <= 4; k++) {
    const v = Math.round((max * k) / 4);
    svg += `<line class="grid" x1="${left}" x2="${right}" y1="${y(v)}" y2="${y(v)}"/><text x="${left - 6}" y="${y(v) + 4}" text-anchor="end">${v}</text>`;
  }
  return svg + `<line class="axis" x1="${left}" x2="${right}" y1="${bottom}" y2="${bottom}"/>`;
}

function chart(turns, findings) {
  const W = 1000, H = 300, L = 56, R = 16, T = 16, B = 34;
  const series = [
    ["local", "local prompt tokens", (t) => t.local_tokens?.prompt],
    ["engine", "engine prompt tokens", (t) => t.usage?.prompt_tokens],
    ["cached", "cached tokens", (t) => t.usage?.cached_tokens],
  ];
  const limit = contextLimit(findings);
  let max = limit || 1;
  for (const t of turns) for (const [, , f] of series) max = Math.max(max, f(t) || 0);
  max = Math.ceil(max * 1.1);
  const n = turns.length;
  const x = (i) => L + (n <= 1 ? (W - L - R) / 2 : (i * (W - L - R)) / (n - 1));
  const y = (v) => T + (H - T - B) * (1 - v / max);
  let svg = `<svg id="chart" viewBox="0 0 ${W} ${H}" role="img" aria-label="tokens per turn">`;
  svg += gridAndAxis(L, W - R, H - B, max, y);
  turns.forEach((t, i) => { svg += `<text x="${x(i)}" y="${H - B + 16}" text-anchor="middle">${t.index}</text>`; });
  svg += `<text x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle">turn</text>`;
  if (limit) svg += `<line x1="${L}" x2="${W - R}" y1="${y(limit)}" y2="${y(limit)}" stroke="var(--limit)" stroke-dasharray="6 4"/><text x="${W - R}" y="${y(limit) - 4}" text-anchor="end">context limit ${limit}</text>`;
  // Findings: a band on their turn, a labelled marker on top.
  for (const f of findings) {
    const i = turns.findIndex((t) => t.id === f.turn);
    if (i < 0) continue;
    const color = f.severity === "critical" ? "var(--crit)" : f.severity === "warning" ? "var(--warn)" : "var(--info)";
    svg += `<g class="finding-marker" data-kind="${esc(f.kind)}" data-turn="${f.turn}" data-index="${turns[i].index}"><title>${esc(f.summary)}</title>
      <line x1="${x(i)}" x2="${x(i)}" y1="${T}" y2="${H - B}" stroke="${color}" stroke-width="2" opacity="0.35"/>
      <circle cx="${x(i)}" cy="${T + 6}" r="6" fill="${color}"/></g>`;
  }
  for (const [cls, , f] of series) {
    const pts = turns.map((t, i) => [i, f(t)]).filter(([, v]) => v != null);
    if (!pts.length) continue;
    svg += `<polyline fill="none" stroke="var(--${cls})" stroke-width="2" points="${pts.map(([i, v]) => `${x(i)},${y(v)}`).join(" ")}"/>`;
    for (const [i, v] of pts) svg += `<circle class="pt-${cls}" cx="${x(i)}" cy="${y(v)}" r="3.5" fill="var(--${cls})"><title>turn ${turns[i].index}: ${v}</title></circle>`;
  }
  svg += "</svg>";
  const legend = series.map(([c, label]) => `<span><i style="background:var(--${c})"></i>${label}</span>`).join("") +
    (limit ? `<span><i style="background:var(--limit)"></i>context limit</span>` : "") + `<span><i style="background:var(--crit)"></i>finding</span>`;
  return `<div class="card chart">${svg}<div class="legend">${legend}</div></div>`;
}

// What the model could see at each turn (stacked by kind) in front of what was ever said (the
// lighter, outlined bar behind): a harness that prunes, windows or compacts shows as the gap.
const CTX_KINDS = { system: "system", user: "user", system_reminder: "reminders", assistant: "assistant", tool_result: "tool results", summary: "summaries", other: "other", reasoning: "reasoning" };
function contextChart(report) {
  const W = 1000, H = 260, L = 56, R = 16, T = 16, B = 34;
  const kinds = (report.kinds || Object.keys(CTX_KINDS)).filter((k) => k !== "media");
  const chars = (counts, k) => counts?.[k]?.chars || 0;
  const total = (counts) => kinds.reduce((n, k) => n + chars(counts, k), 0);
  const turns = report.turns || [];
  if (!turns.length) return '<p class="muted">No turns yet.</p>';
  let max = 1;
  for (const t of turns) max = Math.max(max, total(t.ever), total(t.visible));
  max = Math.ceil(max * 1.1);
  const n = turns.length, slot = (W - L - R) / n, bw = Math.min(56, slot * 0.7);
  const cx = (i) => L + slot * (i + 0.5);
  const y = (v) => T + (H - T - B) * (1 - v / max);
  let svg = `<svg id="context-chart" viewBox="0 0 ${W} ${H}" role="img" aria-label="characters the model could see per turn, against what was ever said">`;
  svg += gridAndAxis(L, W - R, H - B, max, y);
  svg += `<text x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle">turn (characters visible in front of characters ever said)</text>`;
  turns.forEach((t, i) => {
    const x0 = cx(i) - bw / 2, seen = total(t.visible), said = total(t.ever);
    const share = t.visible_share ?? (said ? seen / said : 1);
    const lost = kinds.filter((k) => chars(t.ever, k) > chars(t.visible, k)).map((k) => `${CTX_KINDS[k] || k} ${chars(t.ever, k) - chars(t.visible, k)}`);
    svg += `<g class="ctx-bar${share < 1 ? " lossy" : ""}" data-turn="${t.turn}" data-index="${t.index}" data-share="${share}">`;
    svg += `<title>turn ${t.index}: ${seen} of ${said} characters visible (${Math.round(share * 100)}%)${lost.length ? "; not visible: " + esc(lost.join(", ")) : ""}${t.prompt_tokens != null ? "; " + t.prompt_tokens + " prompt tokens" : ""}</title>`;
    // What was ever said: the lighter stack behind, outlined.
    let acc = 0;
    for (const k of kinds) {
      const c = chars(t.ever, k);
      if (!c) continue;
      svg += `<rect class="ever" x="${x0}" y="${y(acc + c)}" width="${bw}" height="${y(acc) - y(acc + c)}" fill="var(--k-${k})"/>`;
      acc += c;
    }
    svg += `<rect class="ever-outline" x="${x0}" y="${y(said)}" width="${bw}" height="${y(0) - y(said)}"/>`;
    // What the request carried: the full-colour stack in front, a little narrower.
    acc = 0;
    for (const k of kinds) {
      const c = chars(t.visible, k);
      if (!c) continue;
      svg += `<rect class="seen" data-kind="${k}" x="${x0 + bw * 0.15}" y="${y(acc + c)}" width="${bw * 0.7}" height="${y(acc) - y(acc + c)}" fill="var(--k-${k})"/>`;
      acc += c;
    }
    if (share < 1) svg += `<text class="share" x="${cx(i)}" y="${y(said) - 4}" text-anchor="middle">${Math.round(share * 100)}%</text>`;
    svg += (i % Math.ceil(n / 30) === 0 ? `<text x="${cx(i)}" y="${H - B + 16}" text-anchor="middle">${t.index}</text>` : "") + "</g>";
  });
  svg += "</svg>";
  const used = kinds.filter((k) => turns.some((t) => chars(t.ever, k) || chars(t.visible, k)));
  const legend = used.map((k) => `<span><i class="box" style="background:var(--k-${k})"></i>${CTX_KINDS[k] || esc(k)}</span>`).join("") +
    `<span><i class="box ever-key"></i>ever said, no longer visible</span>`;
  return `${svg}<div class="legend">${legend}</div>`;
}

// Each turn's prompt tokens by part (the turn's `composition`), stacked, against its context limit:
// the limit as a dashed line over the turn's slot, the last 10% below it as a warning band, and a
// turn inside that band (or past the limit) marked "!".
const COMP_PARTS = { system: ["system", "--k-system"], tools: ["tool definitions", "--k-tools"], tool_results: ["tool results", "--k-tool_result"],
  user: ["user", "--k-user"], assistant: ["assistant", "--k-assistant"], reasoning: ["reasoning", "--k-reasoning"], images: ["images", "--k-media"],
  summary: ["summaries", "--k-summary"], other: ["other / template", "--k-other"] };
function compositionChart(turns) {
  const W = 1000, H = 260, L = 56, R = 16, T = 22, B = 34;
  const rows = turns.filter((t) => t.composition);
  if (!rows.length) return '<p class="muted">No turn has a composition (captured before ctxscope recorded them).</p>';
  const parts = Object.keys(COMP_PARTS);
  const limitOf = (t) => t.composition.limit?.tokens || null;
  let max = 1;
  for (const t of rows) max = Math.max(max, t.composition.total, limitOf(t) || 0);
  max = Math.ceil(max * 1.1);
  const n = rows.length, slot = (W - L - R) / n, bw = Math.min(56, slot * 0.7);
  const cx = (i) => L + slot * (i + 0.5);
  const y = (v) => T + (H - T - B) * (1 - v / max);
  const latest = [...rows].reverse().map(limitOf).find((l) => l) || null;
  let svg = `<svg id="composition-chart" viewBox="0 0 ${W} ${H}" role="img" aria-label="prompt tokens by part per turn, against the context limit"${latest ? ` data-limit="${latest}"` : ""}>`;
  svg += gridAndAxis(L, W - R, H - B, max, y);
  svg += `<text x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle">turn (prompt tokens by part${latest ? ", against the context limit" : ""})</text>`;
  // The limit and its warning band, over each turn's slot (an engine restarted with another size shows as a step).
  let limits = "";
  rows.forEach((t, i) => {
    const lim = limitOf(t);
    if (!lim) return;
    const x0 = L + slot * i, x1 = x0 + slot;
    limits += `<rect class="warn-band" x="${x0}" y="${y(lim)}" width="${slot}" height="${y(lim * 0.9) - y(lim)}"/>`;
    limits += `<line class="limit-line" data-turn="${t.id}" data-limit="${lim}" x1="${x0}" x2="${x1}" y1="${y(lim)}" y2="${y(lim)}"/>`;
  });
  if (latest) svg += `<g class="limit" data-limit="${latest}">${limits}<text x="${W - R}" y="${y(latest) - 4}" text-anchor="end">context limit ${latest}</text></g>`;
  rows.forEach((t, i) => {
    const c = t.composition, lim = limitOf(t), x0 = cx(i) - bw / 2;
    const pressure = lim ? c.total / lim : null, near = pressure != null && pressure >= 0.9;
    const named = parts.filter((p) => c.parts[p]).map((p) => `${COMP_PARTS[p][0]} ${c.parts[p]}`).join(", ");
    svg += `<g class="comp-bar${near ? " near" : ""}" data-turn="${t.id}" data-index="${t.index}" data-total="${c.total}" data-method="${esc(c.method)}"` +
      (lim ? ` data-limit="${lim}" data-pressure="${pressure.toFixed(4)}"` : "") + ` data-near="${near}">`;
    svg += `<title>turn ${t.index}: ${c.total}${lim ? ` of ${lim} tokens (${(pressure * 100).toFixed(1)}%)` : " tokens"}${c.estimated ? ", estimated" : ""} (${esc(c.method)}): ${esc(named)}</title>`;
    let acc = 0;
    for (const p of parts) {
      const v = c.parts[p] || 0;
      if (!v) continue;
      svg += `<rect data-part="${p}" x="${x0}" y="${y(acc + v)}" width="${bw}" height="${y(acc) - y(acc + v)}" fill="var(${COMP_PARTS[p][1]})"/>`;
      acc += v;
    }
    // Labels above the bar, and above the limit line when the bar reaches its band.
    const top = near ? Math.min(y(c.total), y(lim)) : y(c.total);
    if (near) svg += `<text class="near-mark" x="${cx(i)}" y="${top - 18}" text-anchor="middle">!</text>`;
    if (lim) svg += `<text class="pct" x="${cx(i)}" y="${top - 4}" text-anchor="middle">${(pressure * 100).toFixed(pressure < 0.1 ? 1 : 0)}%</text>`;
    svg += (i % Math.ceil(n / 30) === 0 ? `<text x="${cx(i)}" y="${H - B + 16}" text-anchor="middle">${t.index}</text>` : "") + "</g>";
  });
  svg += "</svg>";
  const used = parts.filter((p) => rows.some((t) => t.composition.parts[p]));
  const legend = used.map((p) => `<span><i class="box" style="background:var(${COMP_PARTS[p][1]})"></i>${COMP_PARTS[p][0]}</span>`).join("") +
    (latest ? `<span><i style="background:var(--limit)"></i>context limit</span><span><i class="box warn-key"></i>within 10% of it</span>` : "");
  const last = rows[rows.length - 1];
  const note = last.composition.limit ? ` Limit from <span class="mono">${esc(last.composition.limit.source)}</span>.` : " No context limit known (the engine reported none; see --context-limit).";
  return `${svg}<div class="legend">${legend}</div><p class="muted">Counted by ${esc(last.composition.method)}${last.composition.estimated ? " (estimated)" : ""}.${note}</p>`;
}

async function contextCard(id) {
  const box = document.getElementById("context");
  if (!box) return;
  try {
    const report = await getJson(`/api/conversations/${id}/context`);
    box.innerHTML = `<h2>Context</h2>${contextChart(report)}`;
  } catch (e) {
    box.innerHTML = `<h2>Context</h2><p class="muted">The context report could not be loaded (${esc(e.message)}).</p>`;
  }
}

function evidence(e) {
  if (e == null || typeof e !== "object") return `<span class="mono">${esc(JSON.stringify(e))}</span>`;
  return `<dl class="evidence">${Object.entries(e).filter(([, v]) => v !== null).map(([k, v]) => {
    const shown = typeof v === "object" ? `<code>${esc(JSON.stringify(v))}</code>` : typeof v === "string" ? `<code>${visible(v)}</code>` : `<b>${esc(v)}</b>`;
    return `<dt>${esc(k.replace(/_/g, " "))}</dt><dd>${shown}</dd>`;
  }).join("")}</dl>`;
}

function findingCard(f) {
  return `<div class="card finding" data-kind="${esc(f.kind)}" data-turn="${f.turn}"><span class="${sevClass(f.severity)}">${esc(f.severity)}</span>
    <b>${esc(f.kind)}</b> on <a href="#/c/${f.conversation}?turn=${f.turn}">conversation ${f.conversation}, turn ${f.turn_index}</a>
    · <a href="#/t/${f.turn}/diff">diff</a> <span class="muted">${time(f.time_unix_ms)}</span><div>${esc(f.summary)}</div>${evidence(f.evidence)}</div>`;
}

function message(m, status) {
  if (!m) return `<div class="msg"><span class="muted">message not stored</span></div>`;
  const text = typeof m.content === "string" ? m.content : JSON.stringify(m.content ?? m, null, 1);
  return `<div class="msg ${status || ""}"><span class="role">${esc(m.role)}</span>${status ? `<span class="status ${status}">${status}</span>` : ""}<pre>${esc(text)}</pre></div>`;
}

function turnDetail(t, detail) {
  const msgs = t.messages.map((h) => message(detail.messages[h])).join("");
  const reply = t.reply ? message(detail.messages[t.reply]) : `<pre class="block">${esc(t.reply_text)}</pre>`;
  return `<div class="cols"><div><h2>Request messages (${t.messages.length})</h2>${msgs}</div>
    <div><h2>Reply</h2>${reply}<h2>Parameters</h2>${evidence(t.params)}<h2>Usage</h2>${evidence(t.usage || {})}
    <h2>Local count</h2>${evidence(t.local_tokens ? { prompt: t.local_tokens.prompt, tokenizer: t.local_tokens.tokenizer } : {})}
    <h2>Timing</h2>${evidence({ headers: us(t.timing.headers_us), first_byte: us(t.timing.ttfb_us), total: us(t.timing.total_us) })}
    ${t.error ? `<h2>Error</h2><pre class="block">${esc(t.error)}</pre>` : ""}<p><a href="#/t/${t.id}/diff">What this request changed →</a></p></div></div>`;
}

async function conversationPage(id, params) {
  const d = await getJson(`/api/conversations/${id}`);
  const c = d.conversation;
  const v = view();
  const byTurn = {};
  for (const f of d.findings) (byTurn[f.turn] ||= []).push(f);
  v.innerHTML = `<h1>Conversation ${c.id}${c.name ? " · " + esc(c.name) : ""}</h1>
    <p class="muted">${esc(c.model)} via <span class="mono">${esc(c.upstream)}</span> · ${c.turns} turns · created ${time(c.created_unix_ms)} · updated ${time(c.updated_unix_ms)}
    ${c.branch_of ? ` · branch of <a href="#/c/${c.branch_of.conversation}">conversation ${c.branch_of.conversation}</a>` : ""}</p>
    ${chart(d.turns, d.findings)}
    <div class="card chart" id="budget"><h2>Budget</h2>${compositionChart(d.turns)}</div>
    <div class="card chart" id="context"><h2>Context</h2><p class="muted">Loading what the model could see…</p></div>
    <h2>Findings (${d.findings.length})</h2>${d.findings.map(findingCard).join("") || '<p class="muted">none</p>'}
    <h2>Replay</h2>${replayForm(c.id)}
    <h2>Turns</h2><table id="turns"><thead><tr><th>#</th><th>relation</th><th>status</th><th>messages</th><th>local / engine / cached</th><th>first byte</th><th>total</th><th>finish</th><th>findings</th><th></th></tr></thead><tbody></tbody></table>`;
  const body = v.querySelector("#turns tbody");
  for (const t of d.turns) {
    const tr = document.createElement("tr");
    tr.className = "clickable";
    tr.id = `turn-${t.id}`;
    const u = t.usage || {};
    tr.innerHTML = `<td>${t.index}</td><td>${esc(relation(t.relation))}</td><td>${t.status}</td><td>${t.message_count}</td>
      <td>${t.local_tokens?.prompt ?? "–"} / ${u.prompt_tokens ?? "–"} / ${u.cached_tokens ?? "–"}</td><td>${us(t.timing.ttfb_us)}</td><td>${us(t.timing.total_us)}</td>
      <td>${esc(t.finish_reason)}</td><td>${(byTurn[t.id] || []).map((f) => `<span class="${sevClass(f.severity)}">${esc(f.kind)}</span>`).join(" ")}</td>
      <td><a href="#/t/${t.id}/diff">diff</a></td>`;
    const open = document.createElement("tr");
    open.className = "turn-detail";
    open.hidden = true;
    open.innerHTML = `<td colspan="10"></td>`;
    tr.onclick = (e) => {
      if (e.target.tagName === "A") return;
      open.hidden = !open.hidden;
      if (!open.hidden && !open.firstChild.innerHTML) open.firstChild.innerHTML = turnDetail(t, d);
    };
    body.append(tr, open);
    if (String(t.id) === params.get("turn")) { tr.onclick({ target: tr }); tr.scrollIntoView(); }
  }
  state.onTurn = (t) => { if (t.conversation === c.id) route(); };
  state.onFinding = (f) => { if (f.conversation === c.id) route(); };
  wireReplayForm(c.id);
  await contextCard(c.id);
}

// ---- replays started from a conversation ---------------------------------------------------------
function replayForm(id) {
  return `<form id="replay-form" class="replay-form" data-conversation="${id}">
    <label>targets, one per line (as <code>ctxscope replay --target</code>)<textarea name="targets" rows="2" placeholder="engine:patches=kv_fp8&#10;url=http://127.0.0.1:8000,model=m,name=peer"></textarea></label>
    <label>golden<input name="golden" value="engine"></label>
    <label>or bisect over patches<input name="patches" placeholder="rmsnorm_bf16,kv_fp8,ctx_shift=256"></label>
    <label>or over the toggles of a launch profile<select name="profile"><option value="">(none given with --profile)</option></select></label>
    <label>toggles<input name="toggles" placeholder="kv_q8,flash_attn"></label>
    <label>metric<select name="metric"><option>agreement</option><option>probes</option><option>exact</option><option>first_diff</option></select></label>
    <label>max tokens<input name="max_tokens" type="number" min="1" value="32"></label>
    <button type="submit">Start</button>
    <div id="replay-progress" class="muted"></div></form>`;
}

function showRun(run) {
  const box = document.getElementById("replay-progress");
  if (!box) return;
  const bar = `<progress max="${run.total || 1}" value="${run.done}"></progress> ${run.done} / ${run.total || "?"} turns`;
  if (run.state === "running") box.innerHTML = `${esc(run.kind)} ${run.id} running: ${bar}`;
  else if (run.state === "done") box.innerHTML = `${esc(run.kind)} ${run.id} done: ${esc(run.summary)} · <a id="replay-open" href="#/replays?open=${run.id}">open its report</a>`;
  else box.innerHTML = `<span class="sev-critical">${esc(run.kind)} ${run.id} failed: ${esc(run.error)}</span>`;
  box.dataset.state = run.state;
}

async function pollRun(id) {
  const { runs } = await getJson("/ui/api/replays/running");
  const run = runs.find((r) => r.id === id);
  if (!run) return;
  showRun(run);
  if (run.state === "running") setTimeout(() => pollRun(id), 500);
}

function wireReplayForm(conversation) {
  const form = document.getElementById("replay-form");
  if (!form) return;
  getJson("/ui/api/replays/running").then(({ profiles }) => {
    const select = form.querySelector("select[name=profile]");
    if (!select || !profiles?.length) return;
    select.innerHTML = `<option value="">(none)</option>` + profiles.map((p) => `<option value="${esc(p.name)}" title="${esc(p.toggles.map((t) => t.name).join(", "))}">${esc(p.name)}</option>`).join("");
    select.onchange = () => {
      const p = profiles.find((x) => x.name === select.value);
      form.querySelector("input[name=toggles]").placeholder = p ? p.toggles.map((t) => t.name).join(",") : "";
    };
  }).catch(() => {});
  form.onsubmit = async (e) => {
    e.preventDefault();
    const f = new FormData(form);
    const targets = String(f.get("targets")).split("\n").map((t) => t.trim()).filter(Boolean);
    const body = { conversation, targets, golden: String(f.get("golden")) || "engine", max_tokens: +f.get("max_tokens") || undefined };
    const patches = String(f.get("patches")).trim();
    const profile = String(f.get("profile") || "").trim();
    const toggles = String(f.get("toggles") || "").trim();
    if (patches) body.bisect = { patches, metric: String(f.get("metric")) };
    else if (profile || toggles) body.bisect = { profile, toggles, metric: String(f.get("metric")) };
    const box = document.getElementById("replay-progress");
    const r = await fetch("/ui/api/replays/start", { method: "POST", credentials: "same-origin", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    const answer = await r.json();
    if (!r.ok) { box.innerHTML = `<span class="sev-critical">${esc(answer?.error?.message || r.statusText)}</span>`; box.dataset.state = "refused"; return; }
    box.textContent = `started ${answer.id}`;
    pollRun(answer.id);
  };
}

// ---- turn diff -----------------------------------------------------------------------------------
const VOLATILE = /(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2})?(\.\d+)?Z?|\d{1,2}:\d{2}:\d{2}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b[0-9a-f]{12,}\b|\b(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{16,}\b|\b\d{10,13}\b)/g;

/** Text with whitespace made visible (· for space, → for tab, ↵ before a newline). */
function visible(s) {
  return esc(s).replace(/ /g, '<span class="ws">·</span>').replace(/\t/g, '<span class="ws">→</span>').replace(/\n/g, '<span class="ws">↵</span>\n');
}
/** Escaped text with timestamps and ids outlined. */
function marked(s, showWs) {
  let out = "", last = 0;
  for (const m of s.matchAll(VOLATILE)) {
    out += (showWs ? visible : esc)(s.slice(last, m.index)) + `<span class="volatile" title="looks like a timestamp or an id">${(showWs ? visible : esc)(m[0])}</span>`;
    last = m.index + m[0].length;
  }
  return out + (showWs ? visible : esc)(s.slice(last));
}

function charDiff(d) {
  let html = d.skipped_before ? `<span class="muted">… ${d.skipped_before} characters …</span>` : "";
  let pos = d.skipped_before, caret = false;
  for (const op of d.ops) {
    if (op.op !== "eq" && !caret) { html += `<span class="caret" title="first differing character: ${d.at_char}">▸</span>`; caret = true; }
    const body = marked(op.text, true);
    html += op.op === "eq" ? body : op.op === "del" ? `<del>${body}</del>` : `<ins>${body}</ins>`;
    if (op.op !== "ins") pos += [...op.text].length;
  }
  if (d.skipped_after) html += `<span class="muted">… ${d.skipped_after} characters …</span>`;
  return `<div class="diff" data-at="${d.at_char}">${html}</div>`;
}

const VERDICTS = {
  first_turn: "The first turn of its conversation: every message is new.",
  extends: "A clean extension: the previous history is kept whole and new messages are appended.",
  retry: "A retry: the last exchange was replaced (the user edited or regenerated it).",
  prefix_break: "A prefix break: a small edit before the end of the previous history (the prefix cache cannot be reused past it).",
  dropped: "History dropped: messages of the previous turn's history were removed or rewritten.",
  by_design: "Edited by design: only reasoning that the model's chat template drops anyway was removed, so the model sees what it would have seen.",
};
// One sentence per cause of dropped history (detect::history::Cause).
const CAUSES = {
  compaction: ["compaction", "the harness replaced a run of earlier turns with a summary message."],
  windowed: ["windowed", "the harness dropped the oldest turns and kept the most recent ones."],
  pruned: ["pruned", "the harness removed messages from the middle of the history, or cleared their content (old tool results)."],
  rewritten: ["rewritten", "the harness replaced a message in place with other content."],
  truncated_in_place: ["truncated in place", "the harness shortened a message in place, keeping only its head."],
  media_stripped: ["media stripped", "the harness removed images, audio or files from messages it kept."],
  reasoning_dropped: ["reasoning dropped", "the harness removed reasoning from assistant messages whose reasoning the model's format needs."],
};
// How each message's fate reads in the two columns (status -> label).
const STATUS_LABELS = {
  dropped: "dropped", cleared: "cleared", truncated: "truncated", rewritten: "rewritten", edited: "edited", replaced: "replaced",
  reasoning_stripped: "reasoning stripped", media_stripped: "media stripped", appended: "appended", rewrite: "rewritten here", summary: "summary",
};

function verdictText(d) {
  const det = d.detail || {};
  if (d.verdict !== "dropped" || !CAUSES[det.cause]) return VERDICTS[d.verdict] || esc(d.verdict);
  const [words, sentence] = CAUSES[det.cause];
  const also = (det.causes || []).filter((c) => c !== det.cause && CAUSES[c]);
  return `History dropped (${words}): ${sentence}` +
    also.map((c) => `<div class="also" data-cause="${esc(c)}">Also ${CAUSES[c][0]}: ${CAUSES[c][1]}</div>`).join("");
}

function lostText(lost) {
  const rows = Object.entries(lost || {}).map(([k, l]) => `${k.replace(/_/g, " ")}: ${l.messages} ${k === "media" ? "part" : "message"}${l.messages === 1 ? "" : "s"}${k === "media" ? "" : `, ${l.chars} characters`}`);
  return rows.length ? rows.join("; ") : null;
}

function summaryText(s) {
  if (!s) return null;
  const by = { marker: "by its harness's marker", carries_reply: "it carries the text of a reply it replaced", structure: "by structure: one message where a run of turns was removed" }[s.recognised_by] || s.recognised_by;
  return `message ${s.at} (${s.role})${s.harness ? `, written by ${s.harness}` : ""}; recognised ${by}`;
}

/** Facts in words: like `evidence`, but strings read as prose (no visible whitespace). */
function facts(e) {
  return `<dl class="evidence facts">${Object.entries(e).filter(([, v]) => v != null).map(([k, v]) => {
    const shown = typeof v === "object" ? `<code>${esc(JSON.stringify(v))}</code>` : typeof v === "string" ? esc(v) : `<b>${esc(v)}</b>`;
    return `<dt>${esc(k.replace(/_/g, " "))}</dt><dd data-fact="${esc(k)}">${shown}</dd>`;
  }).join("")}</dl>`;
}

async function diffPage(id) {
  const d = await getJson(`/ui/api/turns/${id}/diff`);
  const v = view();
  const det = d.detail || {};
  let known = "";
  if (d.verdict === "dropped" || d.verdict === "by_design") {
    known = facts({
      cause: d.verdict === "dropped" ? det.cause : null, causes: (det.causes || []).length ? det.causes.join(", ") : null,
      lost: lostText(det.lost), summary: summaryText(det.summary), summary_excerpt: det.summary?.excerpt ? `“${det.summary.excerpt}…”` : null,
      reasoning_rule: det.reasoning_rule || null,
      first_differing_message: det.first_differing_message, removed_messages: det.removed_messages, rewritten_messages: det.rewritten_messages,
      user_turns_lost: det.user_turns_lost, messages_before: det.messages_before, messages_after: det.messages_after, kept_latest_reply: det.kept_latest_reply,
    });
  }
  if (d.verdict === "prefix_break") known = evidence({ message: det.message, character: det.char, role: det.role, change: det.change });
  const changes = d.changes.map((ch) => `<h2>Message ${ch.message}${ch.at != null && ch.at !== ch.message ? ` (now ${ch.at})` : ""} (${esc(ch.role)}): first difference at character ${ch.diff.at_char}</h2>${charDiff(ch.diff)}`).join("");
  const tools = d.tools ? `<h2>Tools: ${esc(d.tools.change)}</h2>${evidence({ before: d.tools.before, after: d.tools.after })}` : "";
  // The edit behind each earlier message (by its index) and each request message (by where it went).
  const edits = det.edits || [], byOld = {}, byNew = {};
  for (const e of edits) { byOld[e.message] = e; if (e.at != null) byNew[e.at] = e; }
  const label = (m, side) => {
    if (m.status === "kept") return "";
    let text = STATUS_LABELS[m.status] || m.status;
    const e = side === "before" ? byOld[m.index] : byNew[m.index];
    if (e && side === "after" && m.status === "rewrite") text = `${e.edit.replace(/_/g, " ")} here`;
    if (m.status === "summary") text = det.summary?.harness ? `summary by ${det.summary.harness}` : "summary";
    else if (e && side === "before" && e.edit === "removed") text += ` (${e.chars_before} characters)`;
    else if (e && (e.edit === "truncated" || e.edit === "cleared" || e.edit === "rewritten")) text += ` (${e.chars_before} → ${e.chars_after} characters${side === "after" ? `, was message ${e.message}` : ""})`;
    else if (e && e.edit === "reasoning_stripped") text += ` (${e.chars_before} characters of reasoning${e.required === false ? ", dropped by the template anyway" : ""})`;
    else if (e && e.edit === "media_stripped") text += ` (${e.chars_before} → ${e.chars_after} parts)`;
    return `<span class="status ${m.status}">${esc(text)}</span>`;
  };
  const struck = (s) => s === "dropped" || s === "cleared";
  const list = (msgs, side) => msgs.map((m) => {
    const body = `${esc(m.text)}${m.truncated ? "…" : ""}`;
    return `<div class="msg ${m.status}" data-status="${m.status}" data-index="${m.index}"><span class="role">${m.index} · ${esc(m.role)}</span>${label(m, side)}<pre>${struck(m.status) ? `<del>${body}</del>` : body}</pre></div>`;
  }).join("");
  const counts = (msgs, ss) => msgs.filter((m) => ss.includes(m.status)).length;
  const tally = [
    [counts(d.after, ["appended"]), "appended"], [counts(d.before, ["dropped"]), "dropped"], [counts(d.before, ["cleared"]), "cleared"],
    [counts(d.before, ["truncated"]), "truncated"], [counts(d.before, ["rewritten", "edited"]), "rewritten"],
    [counts(d.before, ["reasoning_stripped"]), "reasoning stripped"], [counts(d.before, ["media_stripped"]), "media stripped"],
    [counts(d.after, ["summary"]), "summary"], [counts(d.before, ["kept"]), "kept"],
  ].filter(([n, what]) => n || ["appended", "dropped", "rewritten", "kept"].includes(what)).map(([n, what]) => `${n} ${what}`).join(" · ");
  const same = d.previous_turn != null && d.previous_conversation === d.conversation;
  const continues = d.previous_turn == null ? "" : same
    ? ` · continues the same conversation after turn #${d.previous_turn}${d.verdict === "dropped" || d.verdict === "by_design" ? " (the harness edited its history)" : ""}`
    : ` · compared with turn ${d.previous_turn} of <a href="#/c/${d.previous_conversation}">conversation ${d.previous_conversation}</a>`;
  v.innerHTML = `<h1>Turn ${d.turn}: what its request changed</h1>
    <p id="turn-of" data-conversation="${d.conversation}" data-previous-conversation="${d.previous_conversation ?? ""}"><a href="#/c/${d.conversation}?turn=${d.turn}">conversation ${d.conversation}, turn ${d.index}</a> · ${esc(relation(d.relation))}${continues}</p>
    <div class="card"><div class="verdict" id="verdict" data-verdict="${d.verdict}"${det.cause ? ` data-cause="${esc(det.cause)}"` : ""}>${verdictText(d)}</div>
    <p class="muted">${tally}</p>${known}</div>
    ${tools}<div id="changes">${changes}</div>
    <p class="muted">Inserted text is green, removed text red and struck through; · is a space, → a tab, ↵ a newline; dashed outlines mark what looks like a timestamp or an id. In the previous history, messages the request no longer carries (dropped) or carries emptied (cleared) are struck through.</p>
    <div class="cols"><div><h2>Previous history (${d.before.length})</h2><div id="before">${list(d.before, "before")}</div></div>
    <div><h2>This request (${d.after.length})</h2><div id="after">${list(d.after, "after")}</div></div></div>`;
}

// ---- findings, replays ---------------------------------------------------------------------------
async function findingsPage(params) {
  const kind = params.get("kind") || "";
  const list = await getJson(`/api/findings?limit=200${kind ? "&kind=" + encodeURIComponent(kind) : ""}`);
  view().innerHTML = `<h1>Findings</h1><div class="chips"><a class="chip" href="#/findings">all</a>${KINDS.map((k) => `<a class="chip" href="#/findings?kind=${k}">${k}</a>`).join("")}</div>
    <div id="findings">${list.map(findingCard).join("") || '<p class="muted">No findings.</p>'}</div>`;
  state.onFinding = () => route();
}

async function replaysPage(params) {
  const open = params.get("open");
  if (open) {
    view().innerHTML = `<h1>Replay ${esc(open)}</h1><p><a href="#/replays">← all replays</a> · <a href="/ui/replays/${esc(open)}/report" target="_blank">open alone</a></p>
      <iframe class="report" src="/ui/replays/${esc(open)}/report"></iframe>`;
    return;
  }
  const list = await getJson("/api/replays");
  view().innerHTML = `<h1>Replays</h1><p class="muted">Runs stored by <code>ctxscope replay --admin URL</code> or started from a conversation page.</p>
    <table><thead><tr><th>id</th><th>conversation</th><th>targets</th><th>summary</th><th>finished</th></tr></thead><tbody>
    ${list.map((r) => `<tr><td><a href="#/replays?open=${r.id}">${r.id}</a></td><td><a href="#/c/${r.conversation}">${r.conversation}</a></td><td>${esc(r.targets.join(", "))}</td><td>${esc(r.summary)}</td><td>${time(r.finished_unix_ms)}</td></tr>`).join("") || '<tr><td colspan="5" class="muted">No replays.</td></tr>'}
    </tbody></table>`;
}

// ---- routing and live updates --------------------------------------------------------------------
async function route() {
  state.onTurn = state.onFinding = null;
  const [path, query] = (location.hash.slice(1) || "/").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  try {
    if (parts[0] === "c" && parts[1]) await conversationPage(parts[1], params);
    else if (parts[0] === "t" && parts[2] === "diff") await diffPage(parts[1]);
    else if (parts[0] === "findings") await findingsPage(params);
    else if (parts[0] === "replays") await replaysPage(params);
    else await conversationsPage(params);
    document.body.dataset.ready = location.hash || "#/";
  } catch (e) {
    view().innerHTML = `<p class="error">${esc(e.message)}</p>`;
    document.body.dataset.ready = "error";
  }
}

function live() {
  const badge = document.getElementById("live");
  const source = new EventSource("/ui/api/live");
  source.onopen = () => { badge.textContent = "live"; badge.classList.add("on"); };
  source.onerror = () => { badge.textContent = "live: reconnecting"; badge.classList.remove("on"); };
  source.addEventListener("turn", (e) => { const t = JSON.parse(e.data); state.onTurn?.(t); });
  source.addEventListener("finding", (e) => { const f = JSON.parse(e.data); state.onFinding?.(f); });
}

window.addEventListener("hashchange", route);
route();
// `?static` leaves live updates off (a page that keeps a stream open never finishes loading for
// headless `--dump-dom` runs).
if (!new URLSearchParams(location.search).has("static")) live();
