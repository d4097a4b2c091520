// energy-bpf agent web view: power over time, which code, compare.
// Charts are drawn here as SVG, with no library: a stacked area chart and a flamegraph are
// each a page of code, where a vendored charting library would outweigh the whole view
// and still leave the flamegraph to write. Data comes only from this agent's /api/v1/*.
'use strict';

const SVGNS = 'http://www.w3.org/2000/svg';
const $ = (id) => document.getElementById(id);
const token = new URLSearchParams(location.hash.slice(1)).get('token');
const COLOURS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
  '#7f7f7f', '#bcbd22', '#17becf', '#393b79', '#637939', '#8c6d31', '#843c39', '#7b4173',
  '#3182bd', '#e6550d', '#31a354', '#756bb1', '#636363'];
const state = { series: null, picked: null, row: null, a: null, b: null, zoom: null, flame: null };

async function api(path) {
  const headers = token ? { Authorization: 'Bearer ' + token } : {};
  const r = await fetch(path, { headers });
  if (!r.ok) throw new Error(r.status + ': ' + (await r.text()));
  return r.json();
}

function el(tag, attrs, parent) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function watts(w) {
  if (w >= 100) return w.toFixed(0);
  if (w >= 1) return w.toFixed(2);
  return w.toFixed(3);
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}

// ---- power over time ----------------------------------------------------------------

async function loadSeries() {
  const q = `range=${$('range').value}&by=${$('by').value}&top=${$('top').value}`;
  try {
    const s = await api('/api/v1/series?' + q);
    state.series = s;
    drawChart(s);
    drawRows(s);
    const badge = $('source');
    badge.textContent = s.estimated ? 'estimated' : 'measured';
    badge.className = s.estimated ? 'badge estimated' : 'badge';
    $('status').textContent = `${s.windows} windows`;
    document.body.dataset.loaded = 'series';
  } catch (e) {
    $('status').textContent = e.message;
  }
}

function drawChart(s) {
  const svg = $('chart');
  svg.replaceChildren();
  const W = +svg.getAttribute('width'), H = +svg.getAttribute('height');
  const L = 50, R = 10, T = 10, B = 24;
  const n = s.times_ms.length;
  if (n === 0) {
    el('text', { x: L, y: H / 2, class: 'axis' }, svg).textContent = 'waiting for the first window';
    return;
  }
  const t0 = s.times_ms[0], t1 = Math.max(s.times_ms[n - 1], t0 + 1);
  const cum = new Array(n).fill(0);
  const tops = s.series.map((row) => row.watts.map((w, i) => (cum[i] += w)));
  const ymax = Math.max(1e-9, ...cum) * 1.05;
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (w) => H - B - (w / ymax) * (H - T - B);
  for (let k = 0; k <= 4; k++) {
    const w = (ymax * k) / 4;
    el('line', { x1: L, x2: W - R, y1: y(w), y2: y(w), stroke: '#eee' }, svg);
    el('text', { x: L - 4, y: y(w) + 4, 'text-anchor': 'end', class: 'axis' }, svg).textContent = watts(w) + ' W';
  }
  [['start', t0], ['middle', (t0 + t1) / 2], ['end', t1]].forEach(([anchor, t]) => {
    el('text', { x: x(t), y: H - 6, 'text-anchor': anchor, class: 'axis' }, svg).textContent = clock(t);
  });
  s.series.forEach((row, k) => {
    const lower = tops[k].map((top, i) => top - row.watts[i]);
    let d = s.times_ms.map((t, i) => `${i ? 'L' : 'M'}${x(t).toFixed(1)},${y(tops[k][i]).toFixed(1)}`).join('');
    for (let i = n - 1; i >= 0; i--) d += `L${x(s.times_ms[i]).toFixed(1)},${y(lower[i]).toFixed(1)}`;
    const p = el('path', { d: d + 'Z', fill: COLOURS[k % COLOURS.length], 'fill-opacity': 0.8,
      class: 'area', 'data-name': row.name }, svg);
    el('title', {}, p).textContent = `${row.name}: mean ${watts(row.mean_w)} W`;
  });
  if (state.picked) {
    const [a, b] = state.picked;
    el('rect', { x: x(a), y: T, width: Math.max(1, x(b) - x(a)), height: H - T - B, class: 'brush' }, svg);
  }
  brush(svg, x, t0, t1, L, W - R);
}

function brush(svg, x, t0, t1, left, right) {
  const toTime = (px) => t0 + ((Math.min(Math.max(px, left), right) - left) / (right - left)) * (t1 - t0);
  let start = null;
  svg.onmousedown = (e) => { start = e.offsetX; };
  svg.onmouseup = (e) => {
    if (start === null) return;
    const [a, b] = [start, e.offsetX].sort((p, q) => p - q);
    start = null;
    if (b - a < 3) return;
    state.picked = [Math.round(toTime(a)), Math.round(toTime(b))];
    drawChart(state.series);
    if (state.row !== null) loadProfile();
  };
}

function drawRows(s) {
  const body = $('rows').tBodies[0];
  body.replaceChildren();
  const est = s.estimated ? ' (estimated)' : '';
  s.series.forEach((row, k) => {
    const tr = document.createElement('tr');
    // A process row by its pid; a container, pod or VM row by its name ([rest] is none).
    const pick = row.pid !== undefined ? { pid: row.pid, label: `process ${row.pid}` }
      : (s.by !== 'process' && row.name !== '[rest]')
        ? { by: s.by, name: row.name, label: `${s.by} ${row.name}` } : null;
    tr.className = pick ? 'row' : '';
    if (row.pid !== undefined) tr.dataset.pid = row.pid;
    if (pick && state.row && state.row.label === pick.label) tr.classList.add('picked');
    tr.dataset.name = row.name;
    tr.dataset.meanW = row.mean_w;
    const mean = (v) => v.reduce((a, b) => a + b, 0) / Math.max(1, v.length);
    const cells = [`<span class="swatch" style="background:${COLOURS[k % COLOURS.length]}"></span>`,
      '', watts(row.mean_w) + est, `${watts(mean(row.ci_lo))} – ${watts(mean(row.ci_hi))}`];
    cells.forEach((html, i) => {
      const td = document.createElement('td');
      if (i === 0) {
        const sw = document.createElement('span');
        sw.className = 'swatch';
        sw.style.background = COLOURS[k % COLOURS.length];
        td.appendChild(sw);
      } else {
        td.textContent = i === 1 ? row.name : html;
      }
      if (i >= 2) td.className = 'num';
      tr.appendChild(td);
    });
    if (pick) {
      tr.onclick = () => { state.row = pick; state.zoom = null; loadProfile(); drawRows(state.series); };
    }
    body.appendChild(tr);
  });
}

// ---- which code ---------------------------------------------------------------------

function pickedRange() {
  if (state.picked) return state.picked;
  const t = state.series ? state.series.times_ms : [];
  const to = t.length ? t[t.length - 1] : Date.now();
  const from = Math.max(t.length ? t[0] : to - 300000, to - 3600000);
  return [from, Math.max(to, from + 1000)];
}

// The picked row as query parameters, each key after `prefix`.
function rowQuery(prefix) {
  const r = state.row;
  if (!r) return '';
  if (r.pid !== undefined) return `&${prefix}row=${r.pid}`;
  return `&${prefix}by=${r.by}&${prefix}name=${encodeURIComponent(r.name)}`;
}

async function loadProfile() {
  const [from, to] = pickedRange();
  $('code').hidden = false;
  $('flame-title').textContent = `${state.row.label}, ${clock(from)} – ${clock(to)}`;
  $('flame-note').textContent = 'loading…';
  try {
    const p = await api(`/api/v1/profile?from=${from}&to=${to}${rowQuery('')}`);
    state.flame = { tree: tree(p.stacks.map(([s, v]) => [s, v, v])), unit: p.unit, estimated: p.estimated };
    const held = p.held_ms ? `; from the ${Math.round((p.held_ms[1] - p.held_ms[0]) / 1000)} s of stacks the agent holds in memory (older ranges: --record-dir)` : '';
    const part = p.files ? `; read ${p.files[0]} of the range's ${p.files[1]} recordings, spread over it (a request reads at most 16 MiB)` : '';
    $('flame-note').textContent = `${p.total.toPrecision(4)} ${p.unit}${p.estimated ? ' (estimated)' : ''} in ${p.stacks.length} stacks${held}${part}`;
    drawFlame($('flame'), state.flame.tree, state.flame.unit, null);
    document.body.dataset.loaded = 'profile';
  } catch (e) {
    $('flame-note').textContent = e.message;
  }
}

// A tree of frames from folded stacks: [stack, a, b] (a = b for a plain profile).
function tree(stacks) {
  const root = { name: 'all', a: 0, b: 0, self: 0, children: new Map(), depth: 0 };
  for (const [stack, a, b] of stacks) {
    let node = root;
    root.a += a;
    root.b += b;
    stack.split(';').forEach((name, i) => {
      let c = node.children.get(name);
      if (!c) {
        c = { name, a: 0, b: 0, self: 0, children: new Map(), depth: i + 1 };
        node.children.set(name, c);
      }
      c.a += a;
      c.b += b;
      node = c;
    });
    node.self += b;
  }
  return root;
}

function kind(name) {
  if (name.endsWith('_[k]')) return 'rgb(200,80,80)';
  if (name.endsWith('_[j]')) return 'rgb(90,180,90)';
  if (/\.py\b/.test(name)) return 'rgb(90,140,220)';
  let h = 0;
  for (const ch of name) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return `rgb(230,${100 + (h % 80)},${40 + (h % 30)})`;
}

// Draws `root` bottom-up (the root at the bottom, leaves on top), widths by `b`; `colour`
// gives a frame's fill (the kind palette when null).
function drawFlame(svg, root, unit, colour) {
  svg.replaceChildren();
  const W = +svg.getAttribute('width'), rowH = 17;
  const top = state.zoom && svg.id === 'flame' ? state.zoom : root;
  const total = top.b || 1;
  // Only frames wide enough to draw (half a pixel) set the height.
  let maxDepth = top.depth, hottest = null;
  const walk = (n) => {
    if (n !== root && (!hottest || n.self > hottest.self)) hottest = n;
    if ((n.b / total) * W < 0.5) return;
    maxDepth = Math.max(maxDepth, n.depth);
    n.children.forEach(walk);
  };
  walk(top);
  const H = (maxDepth - top.depth + 1) * rowH + 4;
  svg.setAttribute('height', H);
  const search = $('search').value.trim().toLowerCase();
  const draw = (n, x0) => {
    const w = (n.b / total) * W;
    if (w < 0.5) return;
    const g = el('g', { class: 'frame', 'data-name': n.name, 'data-depth': n.depth }, svg);
    if (search && n.name.toLowerCase().includes(search)) g.classList.add('match');
    const yy = H - (n.depth - top.depth + 1) * rowH;
    el('rect', { x: x0, y: yy, width: w, height: rowH - 1, fill: colour ? colour(n) : kind(n.name) }, g);
    const t = el('title', {}, g);
    t.textContent = `${n.name}: ${n.b.toPrecision(4)} ${unit} (${((100 * n.b) / total).toFixed(1)}%)`;
    if (w > 30) {
      const label = el('text', { x: x0 + 3, y: yy + 12 }, g);
      const chars = Math.floor((w - 6) / 7);
      label.textContent = n.name.length > chars ? n.name.slice(0, Math.max(0, chars - 1)) + '…' : n.name;
    }
    if (svg.id === 'flame') g.onclick = () => { state.zoom = n; drawFlame(svg, root, unit, colour); };
    let x = x0;
    [...n.children.values()].sort((p, q) => q.b - p.b).forEach((c) => { draw(c, x); x += (c.b / total) * W; });
  };
  draw(top, 0);
  svg.dataset.hottest = hottest ? hottest.name : '';
}

// ---- compare ------------------------------------------------------------------------

async function runDiff() {
  if (!state.a || !state.b) {
    $('diff-note').textContent = 'pick a range on the chart, then set A, then B';
    return;
  }
  const q = `a_from=${state.a[0]}&a_to=${state.a[1]}&b_from=${state.b[0]}&b_to=${state.b[1]}` +
    rowQuery('a_') + rowQuery('b_');
  $('diff-note').textContent = 'comparing…';
  try {
    const d = await api('/api/v1/diff?' + q);
    const sig = new Map(d.rows.map((r) => [r.name, r]));
    const root = tree(d.stacks);
    const colour = (n) => {
      const r = sig.get(n.name.replace(/_\[[ki]\]$/, ''));
      if (d.rows.length && (!r || !r.significant)) return 'rgb(200,200,200)';
      const change = r ? (r.delta_pct ?? 100) / 100 : (n.b - n.a) / Math.max(n.a, 1e-12);
      const s = Math.min(1, Math.abs(change) / 0.5);
      const fade = Math.round(220 - 150 * s);
      return change > 0 ? `rgb(230,${fade},${fade})` : `rgb(${fade},${fade},230)`;
    };
    drawFlame($('diff'), root, d.unit, colour);
    const body = $('diff-rows').tBodies[0];
    body.replaceChildren();
    for (const r of d.rows.slice(0, 20)) {
      const tr = document.createElement('tr');
      const pct = r.delta_pct === null ? 'new' : `${r.delta_pct > 0 ? '+' : ''}${r.delta_pct.toFixed(1)}%`;
      [r.name, watts(r.base_j), watts(r.new_j), pct, `[${watts(r.ci95[0])}, ${watts(r.ci95[1])}] ${d.unit}`,
        r.significant ? 'significant' : 'not significant'].forEach((v, i) => {
        const td = document.createElement('td');
        td.textContent = v;
        if (i === 3 && r.significant) td.className = r.delta_j > 0 ? 'sig-up' : 'sig-down';
        tr.appendChild(td);
      });
      body.appendChild(tr);
    }
    const sigNote = d.from === 'memory'
      ? 'no significance test: the agent keeps no recordings (--record-dir)'
      : 'grey is not significant';
    $('diff-note').textContent = `${d.unit}${d.estimated ? ', estimated' : ''}: red is more in B, blue less; ${sigNote}`;
    document.body.dataset.loaded = 'diff';
  } catch (e) {
    $('diff-note').textContent = e.message;
  }
}

// ---- wiring -------------------------------------------------------------------------

for (const id of ['range', 'by', 'top']) $(id).onchange = loadSeries;
$('search').oninput = () => state.flame && drawFlame($('flame'), state.flame.tree, state.flame.unit, null);
$('reset').onclick = () => { state.zoom = null; if (state.flame) drawFlame($('flame'), state.flame.tree, state.flame.unit, null); };
$('set-a').onclick = () => { state.a = pickedRange(); $('diff-note').textContent = `A: ${clock(state.a[0])} – ${clock(state.a[1])}`; };
$('set-b').onclick = () => { state.b = pickedRange(); $('diff-note').textContent = `B: ${clock(state.b[0])} – ${clock(state.b[1])}`; };
$('run-diff').onclick = runDiff;
loadSeries();
setInterval(loadSeries, 5000);
