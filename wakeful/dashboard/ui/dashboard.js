// wakeful dashboard: renders the control plane's snapshots from /ui/events.
// Everything that comes from the server goes into the page with textContent or setAttribute.
'use strict';

const SVG_NS = 'http://www.w3.org/2000/svg';
const FIELDS = ['desired', 'live', 'ready', 'suspended', 'leased', 'overflow', 'waiters'];
const charts = new Map(); // app name -> {root, update}

// ---- small DOM helpers -------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined && v !== false) node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function fill(section, ...children) {
  document.querySelector(`#${section} > .body`).replaceChildren(...children);
}

const empty = (text) => el('p', { class: 'empty' }, text);
const str = (v) => (v === null || v === undefined ? '' : String(v));
const num = (v) => (Number.isFinite(v) ? v : 0);
const token = (v) => str(v).toLowerCase().replace(/[^a-z0-9_-]/g, '');

// ---- formatting --------------------------------------------------------------------------

function age(seconds) {
  const s = Math.max(0, Math.floor(num(seconds)));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

function clock(at) {
  const d = new Date(num(at) * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, '0')).join(':');
}

function amount(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return '–';
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (a >= 100) return String(Math.round(v));
  if (a >= 10) return v.toFixed(1).replace(/\.0$/, '');
  return v.toFixed(2).replace(/\.?0+$/, '');
}

// ---- charts ------------------------------------------------------------------------------

const W = 300;
const LANE = 24;

// One row: a label, a sparkline (one or two series) and the latest value and the maximum.
function sparkRow(label, unit, keys) {
  const box = svg('svg', {
    viewBox: `0 0 ${W} ${LANE}`, preserveAspectRatio: 'none', class: 'spark', 'aria-hidden': 'true',
  });
  box.append(svg('line', { x1: 0, y1: LANE - 0.5, x2: W, y2: LANE - 0.5, class: 'axis' }));
  const paths = keys.map((k, i) => {
    const area = svg('path', { class: `area s${i}` });
    const line = svg('path', { class: `line s${i}` });
    box.append(area, line);
    return { key: k, area, line };
  });
  const latest = el('span', { class: 'latest' });
  const max = el('span', { class: 'max' });
  const legend = keys.length > 1
    ? el('span', { class: 'keys' }, ...keys.map((k, i) => el('span', { class: `key s${i}` }, k.replace(/_ms$/, ''))))
    : null;
  const row = el('div', { class: 'spark-row' },
    el('div', { class: 'spark-head' },
      el('span', { class: 'label' }, label), legend, el('span', { class: 'values' }, latest, max)),
    box);

  function update(series) {
    const all = keys.flatMap((k) => (Array.isArray(series[k]) ? series[k] : []));
    const top = Math.max(0, ...all.filter(Number.isFinite));
    const scale = top > 0 ? top : 1;
    for (const p of paths) {
      const values = Array.isArray(series[p.key]) ? series[p.key] : [];
      const step = W / Math.max(1, values.length - 1);
      let line = '';
      let area = '';
      let run = [];
      const flush = () => {
        if (!run.length) return;
        if (run.length === 1) run.push([run[0][0] + Math.min(step / 2, 2), run[0][1]]);
        line += run.map(([x, y], i) => `${i ? 'L' : 'M'}${x.toFixed(1)} ${y.toFixed(1)}`).join('');
        area += `M${run[0][0].toFixed(1)} ${LANE}` + run.map(([x, y]) => `L${x.toFixed(1)} ${y.toFixed(1)}`).join('')
          + `L${run[run.length - 1][0].toFixed(1)} ${LANE}Z`;
        run = [];
      };
      values.forEach((v, i) => {
        if (Number.isFinite(v)) run.push([i * step, LANE - 1 - (v / scale) * (LANE - 3)]);
        else flush();
      });
      flush();
      p.line.setAttribute('d', line || 'M0 0');
      p.area.setAttribute('d', area || 'M0 0');
      p.line.classList.toggle('none', !line);
    }
    const lastOf = (k) => {
      const v = Array.isArray(series[k]) ? series[k] : [];
      for (let i = v.length - 1; i >= 0; i--) if (Number.isFinite(v[i])) return v[i];
      return null;
    };
    latest.textContent = keys.map((k) => amount(lastOf(k))).join(' / ') + unit;
    max.textContent = all.some(Number.isFinite) ? ` · max ${amount(top)}` : ' · no data';
  }
  return { row, update };
}

function makeChart() {
  const rows = [
    sparkRow('requests', '/s', ['requests_per_s']),
    sparkRow('latency', ' ms', ['p50_ms', 'p99_ms']),
    sparkRow('waiters', '', ['waiters']),
  ];
  const span = el('span', { class: 'span' });
  const root = el('figure', { class: 'chart' }, ...rows.map((r) => r.row), el('figcaption', {}, span));
  return {
    root,
    update(series) {
      const s = series || {};
      for (const r of rows) r.update(s);
      const n = Math.max(...['requests_per_s', 'p50_ms', 'p99_ms', 'waiters'].map((k) => (s[k] || []).length));
      const minutes = Math.round((n * num(s.step)) / 60);
      span.textContent = minutes ? `last ${minutes} min` : '';
    },
  };
}

// ---- sections ----------------------------------------------------------------------------

function poolCounts(pool, withHooks) {
  return el('dl', { class: withHooks ? 'counts' : 'counts small' },
    ...FIELDS.map((f) => el('div', { class: `count c-${f}` },
      el('dt', {}, f),
      el('dd', withHooks ? { 'data-field': f } : {}, String(num(pool[f]))))));
}

function wakeLine(wakes, at) {
  // How its waiting requests woke it: a thaw of a suspended sandbox, or a start.
  if (!wakes || typeof wakes !== 'object') return null;
  const last = wakes.last_kind
    ? ` · last: ${str(wakes.last_kind)}, ${num(wakes.last_ms)} ms, ${age(at - num(wakes.last_at))} ago` : '';
  return el('p', { class: 'wakes muted', 'data-wakes': '' },
    `woke it: ${num(wakes.thaw)} thaw · ${num(wakes.start)} start${last}`);
}

function certLine(certs, at) {
  // Its names' certificates from ACME: state, time left, and why the last attempt failed.
  if (!Array.isArray(certs) || !certs.length) return null;
  return el('ul', { class: 'certs' }, ...certs.map((c) => el('li', { 'data-cert': str(c.name) },
    el('span', { class: `state st-${token(c.state)}` }, str(c.state)),
    ` ${str(c.name)}`,
    c.not_after ? el('span', { class: 'muted' }, ` · expires in ${age(num(c.not_after) - at)}`) : null,
    c.error ? el('span', { class: 'cert-error' }, ` · ${str(c.error)}`) : null)));
}

function trafficLine(split, tags) {
  // The app's split (`v7 90% · v8 10%`) and tags (`beta → v8`), when it has any.
  const shares = Object.entries(split || {}).map(([v, share]) => `${str(v)} ${num(share)}%`);
  const named = Object.entries(tags || {}).map(([tag, v]) => `${str(tag)} → ${str(v)}`);
  if (!shares.length && !named.length) return null;
  return el('p', { class: 'traffic' },
    shares.length ? el('span', { class: 'split' }, `split ${shares.join(' · ')}`) : null,
    named.length ? el('span', { class: 'tags muted' }, ` tags ${named.join(', ')}`) : null);
}

function renderApps(apps, total, at) {
  if (!apps.length) {
    charts.clear();
    return fill('apps', empty('no apps deployed'));
  }
  const seen = new Set();
  const cards = apps.map((app) => {
    const name = str(app.app);
    seen.add(name);
    const pools = Array.isArray(app.pools) ? app.pools : [];
    const active = pools.find((p) => app.version !== null && p.version === app.version) || pools[0] || null;
    let chart = charts.get(name);
    if (!chart) charts.set(name, (chart = makeChart()));
    chart.update(app.series);
    const others = pools.filter((p) => p !== active);
    return el('article', { class: 'app', 'data-app': name },
      el('header', {},
        el('h3', {}, name),
        el('span', { class: 'badge' }, app.version === null || app.version === undefined ? 'no version' : str(app.version)),
        active ? el('span', { class: `state st-${token(active.state)}` }, str(active.state)) : null,
        el('span', { class: 'hosts' }, (app.hosts || []).map(str).join(' · '))),
      active ? poolCounts(active, true) : el('p', { class: 'empty' }, 'no pools'),
      trafficLine(app.split, app.tags),
      wakeLine(app.wakes, at),
      certLine(app.certs, at),
      chart.root,
      others.length ? el('ul', { class: 'other-pools' }, ...others.map((p) => el('li', { 'data-pool': str(p.pool) },
        el('span', { class: 'pool-name' }, str(p.pool)),
        el('span', { class: `state st-${token(p.state)}` }, str(p.state)),
        poolCounts(p, false)))) : null);
  });
  for (const name of [...charts.keys()]) if (!seen.has(name)) charts.delete(name);
  const more = num(total) > apps.length
    ? el('p', { class: 'muted' }, `showing ${apps.length} of ${num(total)} apps (busiest first)`) : null;
  fill('apps', el('div', { class: 'cards' }, ...cards), ...(more ? [more] : []));
}

function renderRollouts(rollouts, at) {
  if (!rollouts.length) return fill('rollouts', empty('no rollouts'));
  fill('rollouts', el('ul', { class: 'rollouts' }, ...rollouts.map((r) => {
    const target = Math.max(0, num(r.target_ready));
    const ready = Math.max(0, num(r.ready));
    return el('li', { 'data-rollout': `${str(r.app)}/${str(r.version)}`, class: `phase-${token(r.phase)}` },
      el('div', { class: 'line1' },
        el('strong', {}, str(r.app)), ' → ', el('span', { class: 'badge' }, str(r.version)),
        el('span', { class: `state st-${token(r.phase)}` }, str(r.phase)),
        el('span', { class: 'muted when' }, r.started_at ? `started ${age(at - r.started_at)} ago` : '')),
      el('div', { class: 'progress' },
        el('progress', { max: Math.max(1, target), value: Math.min(ready, Math.max(1, target)) }),
        el('span', { class: 'ratio' }, `${ready}/${target} ready`)),
      r.message ? el('p', { class: 'message' }, str(r.message)) : null);
  })));
}

function renderSandboxes(sandboxes, total, at) {
  if (!sandboxes.length) return fill('sandboxes', empty('no sandboxes'));
  const groups = new Map();
  for (const s of sandboxes) {
    const node = s.node === null || s.node === undefined ? '' : str(s.node);
    if (!groups.has(node)) groups.set(node, []);
    groups.get(node).push(s);
  }
  const names = [...groups.keys()].sort((a, b) => (a === '') - (b === '') || a.localeCompare(b));
  const parts = names.map((node) => el('div', { class: 'node-group', 'data-group': node },
    el('h3', {}, node || 'unscheduled', el('span', { class: 'muted' }, ` · ${groups.get(node).length}`)),
    el('ul', { class: 'sandboxes' }, ...groups.get(node).map((s) => {
      const status = str(s.status);
      return el('li', { 'data-sandbox': str(s.id), class: `st-${token(status)}${s.ready ? ' ready' : ''}` },
        el('span', { class: 'dot', 'aria-hidden': 'true' }),
        el('span', { class: 'id' }, str(s.id)),
        el('span', { class: 'meta' },
          status === 'running' && !s.ready ? el('span', { class: 'not-ready' }, 'not ready') : null,
          el('span', { class: 'state-age' }, `${status} · ${s.created_at ? age(at - num(s.created_at)) : '—'}`)));
    }))));
  if (num(total) > sandboxes.length) {
    parts.push(el('p', { class: 'muted' }, `showing ${sandboxes.length} of ${num(total)} sandboxes`));
  }
  fill('sandboxes', ...parts);
}

function renderEvents(events) {
  if (!events.length) return fill('events', empty('no scaling events yet'));
  fill('events', el('ol', { class: 'events' }, ...events.map((e) => el('li', { 'data-kind': str(e.kind) },
    el('time', { datetime: new Date(num(e.at) * 1000).toISOString() }, clock(e.at)),
    el('span', { class: 'app-name' }, str(e.app)),
    el('span', { class: 'change' }, `${str(e.from)} → ${str(e.to)}`),
    el('span', { class: 'reason' }, str(e.reason))))));
}

function renderNodes(nodes) {
  if (!nodes.length) return fill('nodes', empty('no nodes'));
  const yes = (cls, text) => el('span', { class: `state ${cls}` }, text);
  const rows = nodes.map((n) => el('tr', { 'data-node': str(n.name) },
    el('th', { scope: 'row' }, str(n.name)),
    el('td', {}, n.registered ? yes('st-running', 'registered') : yes('st-dead', 'gone')),
    el('td', {}, n.evacuating ? yes('st-draining', 'draining')
      : n.cordoned ? yes('st-draining', 'cordoned') : yes('st-ok', 'schedulable')),
    el('td', { class: 'n' }, String(num(n.sandboxes))),
    el('td', {}, n.reachable === null || n.reachable === undefined ? el('span', { class: 'muted' }, '—')
      : n.reachable ? yes('st-running', 'reachable') : yes('st-dead', 'unreachable'))));
  fill('nodes', el('div', { class: 'scroll' }, el('table', {},
    el('thead', {}, el('tr', {}, ...['node', 'state', 'scheduling', 'sandboxes', 'tunnel'].map((h) => el('th', { scope: 'col' }, h)))),
    el('tbody', {}, ...rows))));
}

// ---- logs: the chosen app's newest lines, asked for every few seconds -------------------

const LOGS_EVERY = 3000;
let logsTimer = null;

function offerApps(apps) {
  const select = document.getElementById('logs-app');
  const names = apps.map((app) => str(app.app));
  const chosen = select.value;
  const have = [...select.options].slice(1).map((o) => o.value);
  if (names.join('\n') === have.join('\n')) return;
  const options = names.map((name) => el('option', { value: name }, name));
  select.replaceChildren(el('option', { value: '' }, 'choose an app'), ...options);
  select.value = names.includes(chosen) ? chosen : '';
}

function logPane(title, lines, note) {
  return el('div', { class: 'log' },
    el('h3', {}, title),
    lines.length ? el('pre', {}, lines.map(str).join('\n')) : el('p', { class: 'empty' }, note));
}

async function showLogs() {
  clearTimeout(logsTimer);
  const app = document.getElementById('logs-app').value;
  if (!app) return fill('logs', empty('choose an app to see its newest lines and its access log'));
  let data = null;
  try {
    const answer = await fetch(`/ui/logs?app=${encodeURIComponent(app)}`, { credentials: 'same-origin', cache: 'no-store' });
    if (answer.ok) data = await answer.json();
  } catch {
    data = null;
  }
  if (document.getElementById('logs-app').value !== app) return; // chosen again meanwhile
  if (data) {
    const list = (v) => (Array.isArray(v) ? v : []);
    fill('logs',
      logPane('Output', list(data.output), 'no output yet'),
      logPane('Access log', list(data.access), 'no requests logged (access_log = true in wakeful.toml)'));
  }
  logsTimer = setTimeout(showLogs, LOGS_EVERY);
}

document.getElementById('logs-app').addEventListener('change', showLogs);

function render(snap) {
  const at = num(snap.at);
  const list = (v) => (Array.isArray(v) ? v : []);
  renderApps(list(snap.apps), snap.apps_total, at);
  offerApps(list(snap.apps));
  renderRollouts(list(snap.rollouts), at);
  renderNodes(list(snap.nodes));
  renderSandboxes(list(snap.sandboxes), snap.sandboxes_total, at);
  renderEvents(list(snap.events));
  document.getElementById('updated').textContent = at ? `updated ${clock(at)}` : '';
}

// ---- the event stream --------------------------------------------------------------------

let source = null;
let delay = 2000;

function setConn(live) {
  const conn = document.getElementById('conn');
  conn.textContent = live ? 'live' : 'reconnecting…';
  conn.dataset.state = live ? 'live' : 'down';
  document.body.classList.toggle('stale', !live); // the figures shown may be out of date
}

function connect() {
  const es = new EventSource('/ui/events');
  source = es;
  es.addEventListener('open', () => {
    if (source !== es) return;
    delay = 2000;
    setConn(true);
  });
  es.addEventListener('snapshot', (event) => {
    if (source !== es) return;
    let snap;
    try {
      snap = JSON.parse(event.data);
    } catch (err) {
      console.error('bad snapshot', err);
      return;
    }
    render(snap);
  });
  es.addEventListener('error', () => {
    if (source !== es) return;
    setConn(false);
    // EventSource retries by itself after a network error, but not after a non-200 answer.
    if (es.readyState === EventSource.CLOSED) recover(es);
  });
}

async function recover(es) {
  es.close();
  source = null;
  let status = 0;
  try {
    const answer = await fetch('/ui/session', { credentials: 'same-origin', cache: 'no-store' });
    status = answer.status;
  } catch {
    status = 0; // network failure: try again later
  }
  if (status === 401) {
    location.assign('/ui');
    return;
  }
  setTimeout(connect, delay);
  delay = Math.min(delay * 2, 10000);
}

connect();
