// The tandem dashboard: reads the process's metric snapshots from events (server-sent
// events over fetch, so that the API key can travel as a bearer header), keeps the last
// minutes of them, and draws the panels of panels.json: rates, ratios and percentiles over
// a chosen window.
//
// Every figure on the page comes from an expression in a small language (web.Expr in Go),
// which is also the figure's data-expr attribute (the browser test evaluates the same
// expressions on /metrics and compares):
//   sum:SEL+SEL…        the sum of the matching series' values in the latest snapshot
//   max:SEL, avg:SEL    the largest and the mean of the matching series' values
//   count:SEL           how many series match
//   rate:SEL+SEL…       the increase of their sum per second over the window
//   ratio:SELS/SELS     the increase of the first sum over the increase of the second
//   quantile:Q:SEL      the Q-quantile of the matching histograms' buckets added over the
//                       window, interpolated as Prometheus's histogram_quantile does
// SEL is name or name{label="value",…}; name_count and name_sum are a histogram's count
// and sum. A role="…" matcher on a family without a role label joins
// tandem_router:worker_info on the worker label. A figure with no matching series, or
// with nothing in its window, is empty ("—").
'use strict';
(() => {
  const HISTORY_MS = 10 * 60 * 1000; // snapshots kept
  const VIEW_MS = 5 * 60 * 1000; // time the charts span
  const KEY_STORE = 'tandem.dashboard.key';
  const COLORS = ['#0072B2', '#E69F00', '#009E73', '#CC79A7', '#D55E00', '#56B4E9', '#000000', '#999933'];
  const SLA_COLOR = '#cf222e';

  // ---- expressions ----

  const OPS = ['sum', 'max', 'avg', 'count', 'rate', 'ratio', 'quantile'];
  const INSTANT = new Set(['sum', 'max', 'avg', 'count']);

  // split cuts text at sep outside quoted strings.
  function split(text, sep) {
    const out = [];
    let cur = '', quoted = false;
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (quoted && c === '\\') { cur += c + text[++i]; continue; }
      if (c === '"') quoted = !quoted;
      if (!quoted && c === sep) { out.push(cur); cur = ''; continue; }
      cur += c;
    }
    out.push(cur);
    return out;
  }

  function parseSel(text) {
    const b = text.indexOf('{');
    const sel = { text, name: b < 0 ? text : text.slice(0, b), m: [] };
    if (b >= 0) {
      const re = /\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?/gy;
      const body = text.slice(b + 1, text.lastIndexOf('}'));
      re.lastIndex = 0;
      let m;
      while (re.lastIndex < body.length && (m = re.exec(body))) sel.m.push([m[1], m[2].replace(/\\(.)/g, '$1')]);
    }
    return sel;
  }

  const parsed = new Map();
  function parse(text) {
    let ex = parsed.get(text);
    if (ex) return ex;
    const c = text.indexOf(':');
    const op = text.slice(0, c);
    if (!OPS.includes(op)) throw new Error('bad expression ' + text);
    let rest = text.slice(c + 1);
    ex = { text, op };
    if (op === 'quantile') {
      const c2 = rest.indexOf(':');
      ex.q = Number(rest.slice(0, c2));
      rest = rest.slice(c2 + 1);
    }
    if (op === 'ratio') {
      const [num, den] = split(rest, '/');
      ex.sels = split(num, '+').map(parseSel);
      ex.den = split(den, '+').map(parseSel);
    } else {
      ex.sels = split(rest, '+').map(parseSel);
    }
    parsed.set(text, ex);
    return ex;
  }

  const quote = (v) => '"' + String(v).replace(/[\\"]/g, '\\$&') + '"';

  const num = (x) => (x === null || x === undefined ? NaN : x);

  // rolesOf maps worker names to roles, from tandem_router:worker_info.
  function rolesOf(snap) {
    if (snap._roles) return snap._roles;
    const roles = new Map();
    const f = snap.metrics['tandem_router:worker_info'];
    if (f) {
      const w = f.labels.indexOf('worker'), r = f.labels.indexOf('role');
      for (const s of f.series) roles.set(s.l[w], s.l[r]);
    }
    snap._roles = roles;
    return roles;
  }

  // match returns the family, the part (v or sum) and the series sel matches.
  function match(snap, sel) {
    let fam = snap.metrics[sel.name], part = 'v';
    if (!fam) {
      for (const [suffix, p] of [['_count', 'v'], ['_sum', 'sum']]) {
        const base = snap.metrics[sel.name.slice(0, -suffix.length)];
        if (sel.name.endsWith(suffix) && base && base.type === 'histogram') { fam = base; part = p; break; }
      }
    }
    if (!fam) return null;
    const idx = sel.m.map(([l, v]) => [fam.labels.indexOf(l), l, v]);
    const wi = fam.labels.indexOf('worker');
    const roles = idx.some(([i, l]) => i < 0 && l === 'role') ? rolesOf(snap) : null;
    const list = fam.series.filter((s) => idx.every(([i, l, v]) => {
      if (i >= 0) return s.l[i] === v;
      if (l === 'role' && roles && wi >= 0) return (roles.get(s.l[wi]) || '') === v;
      return v === '';
    }));
    return { fam, part, list };
  }

  const valueOf = (s, part) => num(part === 'sum' ? (s.sum || 0) : s.v);

  // sumOf is the sum of the series sels match in snap, NaN if none does.
  function sumOf(snap, sels) {
    let any = false, t = 0;
    for (const sel of sels) {
      const m = match(snap, sel);
      if (!m) continue;
      for (const s of m.list) { any = true; t += valueOf(s, m.part); }
    }
    return any ? t : NaN;
  }

  // bucketsOf adds the cumulative buckets (and the count, last) of the histograms sel
  // matches; null if none does.
  function bucketsOf(snap, sel) {
    const m = match(snap, sel);
    if (!m || m.fam.type !== 'histogram' || m.list.length === 0) return null;
    const out = new Array(m.fam.le.length + 1).fill(0);
    for (const s of m.list) {
      s.b.forEach((c, i) => { out[i] += num(c); });
      out[out.length - 1] += num(s.v);
    }
    return out;
  }

  function instant(snap, ex) {
    if (ex.op === 'sum') return sumOf(snap, ex.sels);
    const vals = [];
    for (const sel of ex.sels) {
      const m = match(snap, sel);
      if (m) for (const s of m.list) vals.push(valueOf(s, m.part));
    }
    if (vals.length === 0) return NaN;
    if (ex.op === 'count') return vals.length;
    if (ex.op === 'max') return Math.max(...vals);
    return vals.reduce((a, b) => a + b, 0) / vals.length;
  }

  // quantile is Prometheus's bucketQuantile over cumulative counts cum (the last is +Inf).
  function quantile(q, bounds, cum) {
    if (!cum) return NaN;
    const n = cum[cum.length - 1];
    if (!(n > 0)) return NaN;
    let rank = q * n;
    let b = 0;
    while (b < cum.length - 1 && cum[b] < rank) b++;
    if (b === cum.length - 1) return bounds[bounds.length - 1];
    if (b === 0 && bounds[0] <= 0) return bounds[0];
    let start = 0, count = cum[b];
    const end = bounds[b];
    if (b > 0) { start = bounds[b - 1]; count -= cum[b - 1]; rank -= cum[b - 1]; }
    return start + (end - start) * (rank / count);
  }

  // ---- history ----

  // A frame keeps, per snapshot, what windowed expressions need: 'S'+selector → its sum,
  // 'B'+selector → its buckets, 'I'+expression → an instant value drawn on a chart.
  const hist = { frames: [], keys: new Set(), bounds: new Map(), start: null, windowMs: 30000 };

  function needKeys(ex) {
    if (INSTANT.has(ex.op)) { hist.keys.add('I' + ex.text); return; }
    for (const sel of ex.sels) hist.keys.add((ex.op === 'quantile' ? 'B' : 'S') + sel.text);
    for (const sel of ex.den || []) hist.keys.add('S' + sel.text);
  }

  function frameOf(snap) {
    const v = new Map();
    for (const key of hist.keys) {
      const body = key.slice(1);
      if (key[0] === 'I') v.set(key, instant(snap, parse(body)));
      else if (key[0] === 'S') v.set(key, sumOf(snap, [parseSel(body)]));
      else {
        const sel = parseSel(body);
        v.set(key, bucketsOf(snap, sel));
        const f = match(snap, sel);
        if (f && f.fam.le) hist.bounds.set(sel.name, f.fam.le.map(num));
      }
    }
    return { t: snap.t, v };
  }

  // base is the index of the window's first frame for frame i: the last one at least a
  // window older, else the oldest kept.
  function base(i) {
    const fr = hist.frames;
    if (!isFinite(hist.windowMs)) return 0;
    const target = fr[i].t - hist.windowMs;
    let lo = 0, hi = i;
    if (fr[0].t > target) return 0;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (fr[mid].t <= target) lo = mid; else hi = mid - 1; }
    return lo;
  }

  // delta is the increase of the sum of sels from frame j to frame i: NaN when nothing
  // matches at i; a series missing at j had not started (0).
  function delta(sels, i, j) {
    let any = false, d = 0;
    for (const sel of sels) {
      const now = hist.frames[i].v.get('S' + sel.text);
      if (now === undefined || Number.isNaN(now)) continue;
      const then = hist.frames[j].v.get('S' + sel.text);
      any = true;
      d += now - (then === undefined || Number.isNaN(then) ? 0 : then);
    }
    return any ? d : NaN;
  }

  // derive evaluates ex at frame i.
  function derive(ex, i) {
    const fr = hist.frames;
    if (INSTANT.has(ex.op)) return num(fr[i].v.get('I' + ex.text));
    const j = base(i);
    if (j === i) return NaN;
    if (ex.op === 'rate') return delta(ex.sels, i, j) / ((fr[i].t - fr[j].t) / 1000);
    if (ex.op === 'ratio') {
      const d = delta(ex.den, i, j);
      return d > 0 ? delta(ex.sels, i, j) / d : NaN;
    }
    const key = 'B' + ex.sels[0].text;
    const now = fr[i].v.get(key);
    if (!now) return NaN;
    const then = fr[j].v.get(key);
    const cum = then ? now.map((c, k) => c - then[k]) : now;
    return quantile(ex.q, hist.bounds.get(ex.sels[0].name), cum);
  }

  // ---- formatting ----

  function fmt(v, unit) {
    if (!isFinite(v)) return '—';
    const a = Math.abs(v);
    let s;
    if (a === 0) s = '0';
    else if (a >= 1000 || Number.isInteger(v)) s = Math.round(v).toLocaleString('en-US');
    else if (a >= 100) s = v.toFixed(0);
    else if (a >= 10) s = v.toFixed(1);
    else if (a >= 1) s = v.toFixed(2);
    else s = v.toPrecision(2);
    return unit ? s + ' ' + unit : s;
  }

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k) e.append(k);
    return e;
  }

  // ---- charts ----

  class Chart {
    // opts: unit (of the y axis), scale (from the expressions' unit), sla ('ttft', 'itl'),
    // series [{label, expr, color, dash}], dynamic {family, label, make(value, i)}.
    constructor(panel, opts) {
      this.opts = opts;
      this.series = [];
      this.canvas = el('canvas', { role: 'img', 'aria-label': opts.title || '' });
      this.legend = el('div', { class: 'legend' });
      panel.append(this.canvas, this.legend);
      for (const s of opts.series || []) this.add(s);
      this.seen = new Set();
    }

    add(s) {
      const ex = parse(s.expr);
      needKeys(ex);
      const sw = el('span', { class: 'sw' + (s.dash ? ' dash' : '') });
      sw.style.borderTopColor = s.color;
      const val = el('span');
      this.legend.append(el('span', { 'data-expr': s.expr }, sw, el('span', { text: s.label + ': ' }), val));
      this.series.push({ ...s, ex, vals: hist.frames.map((_, i) => derive(ex, i)), val });
    }

    // discover adds the series of label values seen for the first time.
    discover(snap) {
      const d = this.opts.dynamic;
      if (!d) return;
      const f = snap.metrics[d.family];
      if (!f) return;
      const li = f.labels.indexOf(d.label);
      for (const s of f.series) {
        const v = s.l[li];
        if (this.seen.has(v)) continue;
        this.seen.add(v);
        this.add({ ...fill(d.series, v), color: COLORS[this.series.length % COLORS.length] });
      }
    }

    push() {
      const i = hist.frames.length - 1;
      for (const s of this.series) s.vals.push(derive(s.ex, i));
    }

    recompute() {
      for (const s of this.series) s.vals = hist.frames.map((_, i) => derive(s.ex, i));
    }

    trim(k) {
      for (const s of this.series) s.vals.splice(0, k);
    }

    draw(snap) {
      const c = this.canvas, o = this.opts, scale = o.scale || 1;
      const dpr = window.devicePixelRatio || 1;
      const w = c.clientWidth, h = c.clientHeight;
      if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
        c.width = Math.round(w * dpr);
        c.height = Math.round(h * dpr);
      }
      const g = c.getContext('2d');
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, w, h);
      const L = 58, R = 10, T = 10, B = 34;
      const fr = hist.frames;
      if (fr.length === 0) return;
      // The span grows with the history, from a minute to VIEW_MS, so a new page fills it.
      const now = fr[fr.length - 1].t;
      const span = Math.min(VIEW_MS, Math.max(60000, Math.ceil((now - fr[0].t) / 60000) * 60000));
      const from = now - span;
      let first = 0;
      while (first < fr.length && fr[first].t < from) first++;
      let max = 0, points = 0, rawMax = -Infinity;
      for (const s of this.series) {
        for (let i = first; i < s.vals.length; i++) {
          const v = s.vals[i];
          if (isFinite(v)) { points++; rawMax = Math.max(rawMax, v); max = Math.max(max, v * scale); }
        }
      }
      const sla = o.sla && snap ? snap.sla[o.sla + '_s'] * scale : NaN;
      if (isFinite(sla)) max = Math.max(max, sla * 1.15);
      const step = niceStep(max > 0 ? max : 1);
      const top = Math.max(step, Math.ceil((max > 0 ? max : 1) / step) * step);
      const x = (t) => L + ((t - from) / span) * (w - L - R);
      const y = (v) => T + (1 - v / top) * (h - T - B);
      // Axes, grid and their units.
      g.font = '11px system-ui, sans-serif';
      g.strokeStyle = '#d0d7de';
      g.fillStyle = '#57606a';
      g.lineWidth = 1;
      g.textAlign = 'right';
      g.textBaseline = 'middle';
      for (let v = 0; v <= top + step / 2; v += step) {
        g.beginPath(); g.moveTo(L, y(v)); g.lineTo(w - R, y(v)); g.stroke();
        g.fillText(fmt(v, ''), L - 4, y(v));
      }
      g.textAlign = 'center';
      g.textBaseline = 'top';
      const tick = span <= 60000 ? 10 : span <= 180000 ? 30 : 60;
      for (let s = 0; s <= span / 1000; s += tick) g.fillText(s === 0 ? 'now' : s % 60 ? '−' + s + ' s' : '−' + s / 60 + ' min', x(now - s * 1000), h - B + 4);
      g.fillText('time', L + (w - L - R) / 2, h - 14);
      g.save();
      g.translate(12, T + (h - T - B) / 2);
      g.rotate(-Math.PI / 2);
      g.fillText(o.unit, 0, -6);
      g.restore();
      // The SLA line.
      if (isFinite(sla)) {
        g.strokeStyle = SLA_COLOR;
        g.setLineDash([6, 4]);
        g.lineWidth = 1.5;
        g.beginPath(); g.moveTo(L, y(sla)); g.lineTo(w - R, y(sla)); g.stroke();
        g.setLineDash([]);
        g.fillStyle = SLA_COLOR;
        g.textAlign = 'left';
        g.textBaseline = 'bottom';
        g.fillText('SLA ' + fmt(sla, o.unit), L + 4, y(sla) - 2);
      }
      // The series, at most one point per pixel column (the newest always drawn).
      const stride = Math.max(1, Math.ceil((fr.length - first) / Math.max(1, w - L - R)));
      const idx = [];
      for (let i = first; i < fr.length; i += stride) idx.push(i);
      if (idx.length && idx[idx.length - 1] !== fr.length - 1) idx.push(fr.length - 1);
      for (const s of this.series) {
        g.strokeStyle = s.color;
        g.lineWidth = s.dash ? 1.5 : 2;
        g.setLineDash(s.dash ? [5, 3] : []);
        g.beginPath();
        let pen = false;
        for (const i of idx) {
          const v = s.vals[i];
          if (!isFinite(v)) { pen = false; continue; }
          const px = x(fr[i].t), py = y(v * scale);
          if (pen) g.lineTo(px, py); else g.moveTo(px, py);
          pen = true;
        }
        g.stroke();
        g.setLineDash([]);
        const last = s.vals[s.vals.length - 1];
        s.val.textContent = isFinite(last) ? fmt(last * scale, o.unit) : 'no data';
      }
      if (points === 0) {
        g.fillStyle = '#57606a';
        g.textAlign = 'center';
        g.textBaseline = 'middle';
        g.fillText('no data yet', L + (w - L - R) / 2, T + (h - T - B) / 2);
      }
      c.dataset.points = String(points);
      c.dataset.max = points ? String(rawMax) : '';
      c.setAttribute('aria-label', (o.title || '') + ' (' + o.unit + '): ' +
        this.series.map((s) => s.label + ' ' + s.val.textContent).join(', '));
    }
  }

  function niceStep(max) {
    const raw = max / 4, p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (raw <= m * p) return m * p;
    return 10 * p;
  }

  // ---- readings (the figures under a chart) ----

  class Readings {
    // spec: cols [names], rows [{label, cells: [{expr, scale, unit}]}], dynamic {family,
    // label, row(value)}.
    constructor(panel, spec) {
      this.spec = spec;
      this.cells = [];
      this.seen = new Set();
      this.body = el('tbody');
      const head = el('tr', {}, el('th', { text: spec.head || '' }), ...spec.cols.map((c) => el('th', { text: c })));
      panel.append(el('table', { class: 'readings' }, el('thead', {}, head), this.body));
      for (const r of spec.rows || []) this.addRow(r);
    }

    addRow(r) {
      const tr = el('tr', {}, el('td', { text: r.label }));
      for (const c of r.cells) {
        const td = el('td', { 'data-expr': c.expr });
        const ex = parse(c.expr);
        if (!INSTANT.has(ex.op)) needKeys(ex);
        tr.append(td);
        this.cells.push({ ...c, ex, td });
      }
      this.body.append(tr);
    }

    discover(snap) {
      const d = this.spec.dynamic;
      if (!d) return;
      const f = snap.metrics[d.family];
      if (!f) return;
      const li = f.labels.indexOf(d.label);
      for (const s of f.series) {
        const v = s.l[li];
        if (!this.seen.has(v)) { this.seen.add(v); this.addRow(fill(d.row, v)); }
      }
    }

    update(snap) {
      const i = hist.frames.length - 1;
      for (const c of this.cells) {
        const v = INSTANT.has(c.ex.op) ? instant(snap, c.ex) : derive(c.ex, i);
        c.td.dataset.value = isFinite(v) ? String(v) : '';
        c.td.classList.toggle('empty', !isFinite(v));
        c.td.textContent = fmt(v * (c.scale || 1), c.unit);
      }
    }
  }

  // ---- the worker table (router) ----

  const LOAD = 'tandem_router:worker_load';
  const WORKER_COLS = [
    { name: 'Running', q: ['running'] },
    { name: 'Waiting', q: ['waiting'] },
    { name: 'In flight', q: ['inflight'] },
    { name: 'Load (blocks)', q: ['prefill_blocks', 'decode_blocks'] },
    { name: 'KV use, device (%)', q: ['kv_usage'], scale: 100 },
    { name: 'Index blocks', q: ['index_blocks'] },
    { name: 'Migrations away', family: 'tandem_router:worker_migrations_total' },
  ];

  class Workers {
    constructor(panel) {
      this.rows = new Map(); // name → {tr, cells, health, gone}
      this.sortCol = -1;
      this.filter = el('input', { type: 'search', placeholder: 'filter by name', 'aria-label': 'filter workers by name' });
      this.summary = el('span', { class: 'meta' });
      this.filter.addEventListener('input', () => this.arrange());
      const heads = ['Worker', 'Role', 'Model', 'Health', ...WORKER_COLS.map((c) => c.name)].map((n, i) => {
        const th = el('th', { text: n, scope: 'col', title: 'sort' });
        th.addEventListener('click', () => { this.sortCol = this.sortCol === i ? -1 : i; this.arrange(); });
        return th;
      });
      this.body = el('tbody');
      panel.append(el('div', { class: 'toolbar' }, this.filter, this.summary),
        el('div', { class: 'scroll' }, el('table', { id: 'workers' }, el('thead', {}, el('tr', {}, ...heads)), this.body)),
        el('p', { class: 'note', text: 'Names are the workers\' node names as the router knows them. A worker whose load reports stop turns unhealthy, then gone when the router removes it; gone rows keep their last figures.' }));
    }

    update(snap) {
      const info = snap.metrics['tandem_router:worker_info'];
      const load = new Map(); // worker → quantity → value
      const lf = snap.metrics[LOAD];
      if (lf) {
        const wi = lf.labels.indexOf('worker'), qi = lf.labels.indexOf('quantity');
        for (const s of lf.series) {
          if (!load.has(s.l[wi])) load.set(s.l[wi], new Map());
          load.get(s.l[wi]).set(s.l[qi], num(s.v));
        }
      }
      const mig = new Map();
      const mf = snap.metrics['tandem_router:worker_migrations_total'];
      if (mf) for (const s of mf.series) mig.set(s.l[mf.labels.indexOf('worker')], num(s.v));
      const present = new Set();
      if (info) {
        const [wi, ri, mi] = ['worker', 'role', 'model'].map((l) => info.labels.indexOf(l));
        for (const s of info.series) {
          const name = s.l[wi];
          present.add(name);
          const row = this.row(name);
          row.role.textContent = s.l[ri];
          row.model.textContent = s.l[mi];
          const q = load.get(name) || new Map();
          this.setHealth(row, q.get('healthy') === 1 ? 'healthy' : 'unhealthy', snap.t);
          WORKER_COLS.forEach((c, k) => {
            let v = NaN;
            if (c.family) v = mig.has(name) ? mig.get(name) : NaN;
            else for (const qq of c.q) if (q.has(qq)) v = (isFinite(v) ? v : 0) + q.get(qq);
            const td = row.cells[k];
            td.dataset.value = isFinite(v) ? String(v) : '';
            td.textContent = fmt(v * (c.scale || 1), '');
          });
        }
      }
      const mi = WORKER_COLS.findIndex((c) => c.family);
      for (const [name, row] of this.rows) {
        if (present.has(name)) continue;
        if (row.health !== 'gone') { this.setHealth(row, 'gone', snap.t); row.goneAt = snap.t; }
        // A failed worker's requests migrate as the router removes it: its counter lives on.
        if (mig.has(name)) {
          row.cells[mi].dataset.value = String(mig.get(name));
          row.cells[mi].textContent = fmt(mig.get(name), '');
        }
        if (snap.t - row.goneAt > HISTORY_MS) { row.tr.remove(); this.rows.delete(name); }
      }
      const count = { healthy: 0, unhealthy: 0, gone: 0 };
      for (const row of this.rows.values()) count[row.health]++;
      this.summary.textContent = `${present.size} registered: ${count.healthy} healthy, ${count.unhealthy} unhealthy; ${count.gone} gone`;
      this.arrange();
    }

    row(name) {
      let row = this.rows.get(name);
      if (row) return row;
      const tr = el('tr', { 'data-worker': name });
      const sel = (q) => 'sum:' + q.map((qq) => `${LOAD}{worker=${quote(name)},quantity=${quote(qq)}}`).join('+');
      row = { tr, health: '', name: el('td', { text: name }), role: el('td'), model: el('td'), healthCell: el('td', { class: 'health' }) };
      row.cells = WORKER_COLS.map((c) => el('td', { 'data-expr': c.family ? `sum:${c.family}{worker=${quote(name)}}` : sel(c.q) }));
      tr.append(row.name, row.role, row.model, row.healthCell, ...row.cells);
      this.rows.set(name, row);
      this.body.append(tr);
      return row;
    }

    setHealth(row, health, t) {
      if (row.health === health) return;
      row.health = health;
      row.tr.className = health;
      row.tr.dataset.health = health;
      row.healthCell.textContent = health === 'gone' ? 'gone since ' + new Date(t).toLocaleTimeString() : health;
    }

    arrange() {
      const f = this.filter.value.trim().toLowerCase();
      const rows = [...this.rows.entries()];
      const col = this.sortCol;
      const key = (r) => (col < 4 ? [r[1].name, r[1].role, r[1].model, r[1].healthCell][col].textContent : Number(r[1].cells[col - 4].dataset.value || -1));
      rows.sort((a, b) => {
        if (col > 0) {
          const ka = key(a), kb = key(b);
          if (ka !== kb) return col >= 4 ? kb - ka : (ka < kb ? -1 : 1);
        }
        return a[0].localeCompare(b[0], 'en', { numeric: true });
      });
      let prev = null;
      for (const [name, r] of rows) {
        r.tr.hidden = f !== '' && !name.toLowerCase().includes(f);
        if (prev ? prev.nextSibling !== r.tr : this.body.firstChild !== r.tr) {
          if (prev) prev.after(r.tr); else this.body.prepend(r.tr);
        }
        prev = r.tr;
      }
    }
  }

  // ---- panels ----

  // fill puts a label value into a template of panels.json: escaped inside expressions'
  // quoted strings, as it is in labels.
  function fill(tpl, v) {
    const out = {};
    for (const [k, x] of Object.entries(tpl)) {
      if (k === 'expr') out[k] = x.split('{value}').join(quote(v).slice(1, -1));
      else if (k === 'label') out[k] = x.split('{value}').join(v);
      else if (k === 'cells') out[k] = x.map((c) => fill(c, v));
      else out[k] = x;
    }
    return out;
  }

  // ---- the page ----

  const state = { charts: [], readings: [], workers: null, snap: null, count: 0, arrived: 0, period: 0.25, drawQueued: false, startTime: null };

  function build(panels) {
    const main = document.getElementById('panels');
    for (const p of panels) {
      const sec = el('section', { class: 'panel' + (p.wide ? ' wide' : ''), 'data-panel': p.id, 'aria-labelledby': 'h-' + p.id }, el('h2', { id: 'h-' + p.id, text: p.title }));
      main.append(sec);
      if (p.chart) state.charts.push(new Chart(sec, { ...p.chart, title: p.title }));
      if (p.readings) state.readings.push(new Readings(sec, p.readings));
      if (p.extra) state.readings.push(new Readings(sec, p.extra));
      if (p.note) sec.append(el('p', { class: 'note', text: p.note }));
      if (p.workers) state.workers = new Workers(sec);
    }
  }

  function onSnapshot(snap) {
    const t0 = performance.now();
    const start = snap.metrics.process_start_time_seconds;
    const st = start && start.series.length ? start.series[0].v : null;
    if (state.startTime !== null && st !== state.startTime) { // a new process: its counters restarted
      hist.frames = [];
      for (const c of state.charts) c.recompute();
    }
    state.startTime = st;
    state.snap = snap;
    state.count++;
    state.arrived = Date.now();
    state.period = snap.period_s || state.period;
    for (const c of state.charts) c.discover(snap);
    for (const r of state.readings) r.discover(snap);
    hist.frames.push(frameOf(snap));
    // Missing keys of frames before a key was added read as not started.
    for (const c of state.charts) c.push();
    const old = hist.frames.findIndex((f) => f.t >= snap.t - HISTORY_MS);
    if (old > 50) {
      hist.frames.splice(0, old);
      for (const c of state.charts) c.trim(old);
    }
    for (const r of state.readings) r.update(snap);
    if (state.workers) state.workers.update(snap);
    document.getElementById('title').textContent = (snap.kind === 'router' ? 'tandem-router' : 'tandem') + (snap.name ? ' — ' + snap.name : '');
    document.title = document.getElementById('title').textContent;
    document.getElementById('sla').textContent = `SLA: TTFT ${fmt(snap.sla.ttft_s * 1000, 'ms')}, ITL ${fmt(snap.sla.itl_s * 1000, 'ms')}`;
    document.getElementById('updated').textContent = 'updated ' + new Date(snap.t).toLocaleTimeString();
    const err = document.getElementById('error');
    err.hidden = !snap.error;
    err.textContent = snap.error ? 'The server\'s metrics are incomplete: ' + snap.error : '';
    document.body.dataset.snapshots = String(state.count);
    document.body.dataset.last = String(snap.t);
    setStatus('live', 'live');
    // What a snapshot costs this page, for whoever wonders whether it keeps up.
    document.body.dataset.handleMs = (performance.now() - t0).toFixed(1);
    if (!state.drawQueued) {
      state.drawQueued = true;
      requestAnimationFrame(() => {
        const t1 = performance.now();
        state.drawQueued = false;
        for (const c of state.charts) c.draw(state.snap);
        document.body.dataset.drawMs = (performance.now() - t1).toFixed(1);
      });
    }
  }

  function setStatus(cls, text) {
    const s = document.getElementById('status');
    s.className = 'status ' + cls;
    s.textContent = text;
    document.body.dataset.status = cls;
  }

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  function askKey(message) {
    const form = document.getElementById('keyform');
    form.hidden = false;
    document.getElementById('keyerror').textContent = message || '';
    setStatus('down', 'API key needed');
    return new Promise((resolve) => {
      form.onsubmit = (e) => {
        e.preventDefault();
        sessionStorage.setItem(KEY_STORE, document.getElementById('key').value.trim());
        document.getElementById('key').value = '';
        form.hidden = true;
        resolve();
      };
    });
  }

  async function stream(keyRequired) {
    let backoff = 1000;
    for (;;) {
      if (keyRequired && !sessionStorage.getItem(KEY_STORE)) await askKey();
      const key = sessionStorage.getItem(KEY_STORE);
      let res;
      try {
        res = await fetch('events', { cache: 'no-store', headers: key ? { Authorization: 'Bearer ' + key } : {} });
      } catch (e) {
        setStatus('down', 'disconnected; retrying');
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 10000);
        continue;
      }
      if (res.status === 401) {
        sessionStorage.removeItem(KEY_STORE);
        keyRequired = true;
        await askKey('The server refused that key.');
        continue;
      }
      if (!res.ok) {
        let msg = res.status + ' ' + res.statusText;
        try { msg = (await res.json()).error.message; } catch (e) { /* not JSON */ }
        setStatus('down', msg);
        await sleep(5000);
        continue;
      }
      backoff = 1000;
      let ended = '';
      try {
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let k;
          while ((k = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, k);
            buf = buf.slice(k + 2);
            let ev = 'message', data = '';
            for (const line of block.split('\n')) {
              if (line.startsWith('event: ')) ev = line.slice(7);
              else if (line.startsWith('data: ')) data += line.slice(6);
            }
            if (ev === 'snapshot') onSnapshot(JSON.parse(data));
            else if (ev === 'end') ended = JSON.parse(data).reason;
          }
        }
      } catch (e) { /* the connection dropped: reconnect */ }
      setStatus('down', ended ? ended + '; reconnecting' : 'stream ended; reconnecting');
      await sleep(backoff);
    }
  }

  async function main() {
    const w = new URLSearchParams(location.search).get('window');
    const sel = document.getElementById('window');
    if (w && [...sel.options].some((o) => o.value === w)) sel.value = w;
    const setWindow = () => {
      hist.windowMs = sel.value === 'all' ? Infinity : Number(sel.value) * 1000;
      for (const c of state.charts) c.recompute();
      if (state.snap) {
        for (const r of state.readings) r.update(state.snap);
        for (const c of state.charts) c.draw(state.snap);
      }
    };
    sel.addEventListener('change', setWindow);
    hist.windowMs = sel.value === 'all' ? Infinity : Number(sel.value) * 1000;
    let cfg, panels;
    for (let backoff = 1000; !panels; backoff = Math.min(backoff * 2, 10000)) {
      try {
        const [c, p] = await Promise.all(['config.json', 'panels.json'].map((u) => fetch(u, { cache: 'no-store' })));
        if (c.ok && p.ok) [cfg, panels] = [await c.json(), await p.json()];
      } catch (e) { /* retry */ }
      if (!panels) { setStatus('down', 'cannot reach the server; retrying'); await sleep(backoff); }
    }
    build(panels[cfg.kind]);
    window.addEventListener('resize', () => { for (const c of state.charts) c.draw(state.snap); });
    setInterval(() => {
      if (state.count && document.body.dataset.status === 'live' && Date.now() - state.arrived > 3 * state.period * 1000 + 1000) setStatus('stale', 'no data for ' + Math.round((Date.now() - state.arrived) / 1000) + ' s');
    }, 1000);
    stream(cfg.key_required);
  }

  main();
})();
