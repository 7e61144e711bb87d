// dubbo-cp operator dashboard: read-only view over the debug/admin JSON endpoints.
// All server-provided strings go through textContent/setAttribute: names come from
// untrusted registrations, so nothing from JSON ever reaches innerHTML.
'use strict';

const RULE_KINDS = ['TagRoute', 'ConditionRoute', 'DynamicConfig', 'AuthenticationPolicy', 'AuthorizationPolicy', 'ServiceEntry'];
const TOKEN_KEY = 'dubbo-cp-token';
const FAST_MS = 1000;
const SLOW_MS = 5000; // background tabs poll less so they do not load the control plane
const TIMEOUT_MS = 10000; // a hung request must not stall the setTimeout chain forever
const CLIENT_ROWS = 500;
const SERVICE_ROWS = 100;

const ENDPOINTS = {
  digest: '/debug/digest',
  // Each kind's source, and the backing store's own row (ZooKeeper: ensemble, session, errors).
  sources: '/debug/sources',
  mappings: '/debug/mappings',
  applications: '/debug/applications',
  // At most CLIENT_ROWS streams per poll (a large fleet would be megabytes a second); the
  // server counts them all, and "stale only" asks it for the stale ones.
  clients: () => `/debug/clients?limit=${CLIENT_ROWS}${$('#stale-only').checked ? '&stale=true' : ''}`,
  // xDS streams a page at a time; "stale or NACKing only" asks the server for those alone.
  xds: () => `/debug/xds?limit=${CLIENT_ROWS}&offset=${xdsOffset}${$('#xds-stale-only').checked ? '&stale=true' : ''}`,
  // The split of the service last submitted in the form, computed by the server from what it
  // serves; nothing until one is.
  split: () => splitAsked,
  // A page of the services xDS serves, with their endpoints; the filter is the server's. Every
  // SLOW_MS (the server reads every service for it), at once when the filter or page moves.
  services: () => {
    if (last.xds && last.xds.enabled === false) return null;
    if (!servicesForced && Date.now() - servicesFetched < SLOW_MS) return null;
    servicesForced = false;
    const q = $('#service-search').value.trim();
    return `/debug/services?limit=${SERVICE_ROWS}&offset=${servicesOffset}${q ? `&q=${encodeURIComponent(q)}` : ''}`;
  },
  ...Object.fromEntries(RULE_KINDS.map((k) => [k, `/api/v1/rules/${k}`])),
  canaries: '/debug/canaries',
  // Objects the watch skipped and rules-directory files that failed, with their errors.
  ruleErrors: '/debug/rules',
};
// Endpoints a control plane may not have (404): their section is hidden, not an error.
const OPTIONAL = new Set(['canaries']);
// Endpoints whose 400 or 404 carries a reason to show in their own section (the split of a name
// that resolves to nothing, a header without a colon).
const EXPLAINED = new Set(['split']);

const HINTS = { 401: 'send an admin token', 403: 'token is not an admin' };

const $ = (sel, root = document) => root.querySelector(sel);
const last = {}; // latest good payload per endpoint; filters re-render from it without refetching
let timer = null;
let inFlight = false;
let xdsOffset = 0;
let servicesOffset = 0;
let servicesFetched = 0;
let servicesForced = true;
let splitAsked = null; // the split path last submitted
let again = false; // a poll was requested while one was running

// ---------- token ----------

function getToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch { return ''; }
}

function setToken(value) {
  try {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch { /* storage disabled: nothing we can do */ }
}

// `#token=XYZ` lets an operator open a ready link; the fragment never reaches the server.
function takeTokenFromFragment() {
  const m = /^#token=(.+)$/.exec(location.hash);
  if (!m) return false;
  let tok = m[1];
  try { tok = decodeURIComponent(tok); } catch { /* keep raw */ }
  setToken(tok);
  // Drop it from the address bar and history so it is not shared by copy/paste.
  history.replaceState(null, '', location.pathname + location.search);
  return true;
}

function initToken() {
  const input = $('#token');
  const showState = () => {
    input.placeholder = getToken() ? 'token set' : 'admin token';
    input.title = getToken() ? 'Enter a new token, or save empty to clear it' : 'Admin bearer token';
  };
  $('#token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    setToken(input.value.trim());
    input.value = ''; // keep the secret out of the DOM once stored
    showState();
    poll();
  });
  showState();
}

// ---------- fetching ----------

class HttpError extends Error {
  constructor(status, hint) { super(`${status}: ${hint}`); this.status = status; }
}

async function fetchJson(path) {
  const headers = { Accept: 'application/json' };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  let res;
  try {
    res = await fetch(path, { headers, cache: 'no-store', signal: AbortSignal.timeout(TIMEOUT_MS) });
  } catch (e) {
    throw new Error(`${path}: ${e.name === 'TimeoutError' ? 'timed out' : 'network error'}`);
  }
  if (!res.ok) {
    const err = new HttpError(res.status, HINTS[res.status] || `${res.statusText || 'error'} (${path})`);
    try { err.detail = (await res.json()).error; } catch { /* no JSON body */ }
    throw err;
  }
  try { return await res.json(); } catch { throw new Error(`${path}: invalid JSON`); }
}

async function poll() {
  clearTimeout(timer);
  timer = null;
  if (inFlight) { again = true; return; }
  inFlight = true;
  // Each path once: some endpoints decide per poll whether they are due.
  const paths = Object.fromEntries(Object.keys(ENDPOINTS).map((n) => [n, typeof ENDPOINTS[n] === 'function' ? ENDPOINTS[n]() : ENDPOINTS[n]]));
  const names = Object.keys(paths).filter((n) => paths[n] !== null);
  // allSettled: one failing endpoint should not blank the sections that did load.
  const results = await Promise.allSettled(names.map((n) => fetchJson(paths[n])));
  let error = null;
  results.forEach((r, i) => {
    if (r.status === 'fulfilled') {
      last[names[i]] = r.value;
      // Only an answer waits out the interval: a failed fetch is tried at the next poll.
      if (names[i] === 'services') servicesFetched = Date.now();
    }
    else if (OPTIONAL.has(names[i]) && r.reason && r.reason.status === 404) last[names[i]] = null;
    else if (EXPLAINED.has(names[i]) && r.reason && [400, 404].includes(r.reason.status)) last[names[i]] = { error: r.reason.detail };
    else error = error || r.reason;
  });
  try { render(); } catch (e) { console.error(e); error = error || e; }
  setStatus(error);
  if (!error) document.body.dataset.loaded = 'true';
  inFlight = false;
  timer = setTimeout(poll, again ? 0 : document.hidden ? SLOW_MS : FAST_MS);
  again = false;
}

function setStatus(err) {
  const s = $('#status');
  s.textContent = err ? err.message : `updated ${new Date().toTimeString().slice(0, 8)}`;
  s.classList.toggle('error', Boolean(err));
}

// ---------- DOM helpers ----------

function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text != null) node.textContent = text;
  return node;
}

// Only touch the DOM when a value changed, so selections and hover survive polls.
function setAttr(node, name, value) {
  if (value == null || value === '') node.removeAttribute(name);
  else if (node.getAttribute(name) !== String(value)) node.setAttribute(name, value);
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

// Keyed in-place update of parent's children: reuses nodes by key, reorders, removes leftovers.
function reconcile(parent, items, keyOf, make, update) {
  const old = new Map(Array.from(parent.children, (c) => [c.itemKey, c]));
  let cursor = parent.firstElementChild;
  for (const item of items) {
    const key = keyOf(item);
    let node = old.get(key);
    if (node) old.delete(key);
    else { node = make(item); node.itemKey = key; }
    update(node, item);
    if (node === cursor) cursor = cursor.nextElementSibling;
    else parent.insertBefore(node, cursor);
  }
  old.forEach((n) => n.remove());
}

// Cell value: plain value, or {text, title, cls}. null/undefined renders as a dash.
function setCell(td, v) {
  const c = v !== null && typeof v === 'object' ? v : { text: v };
  setText(td, c.text == null ? '–' : String(c.text));
  setAttr(td, 'title', c.title);
  setAttr(td, 'class', c.cls);
}

// rowSpec(item) -> {key, cls, data: {name: value}, cells: [...]}
function syncRows(section, items, rowSpec) {
  const specs = items.map(rowSpec);
  reconcile($('tbody', section), specs, (s) => s.key, () => el('tr'), (tr, s) => {
    setAttr(tr, 'class', s.cls);
    for (const [k, v] of Object.entries(s.data)) setAttr(tr, `data-${k}`, v);
    while (tr.cells.length < s.cells.length) tr.insertCell();
    s.cells.forEach((v, i) => setCell(tr.cells[i], v));
  });
  $('.empty', section).hidden = specs.length > 0;
}

const keyStr = (parts) => parts.map((p) => String(p ?? '')).join('\u0000');
const sortBy = (arr, keyOf) => [...(arr || [])].sort((a, b) => {
  const ka = keyStr(keyOf(a));
  const kb = keyStr(keyOf(b));
  return ka < kb ? -1 : ka > kb ? 1 : 0;
});
const mono = (text, title) => ({ text, title, cls: 'mono' });
const num = (text, extra = '') => ({ text, cls: `num mono ${extra}`.trim() });
const fmtTime = (iso) => (iso ? String(iso).replace('T', ' ').replace(/\.\d+/, '') : null);
// xDS versions are when they were published, in Unix milliseconds (or one past the previous
// version): shown as that time (UTC, to the millisecond), the number itself in the title.
const fmtVersion = (v) => {
  const n = Number(v);
  if (v == null || v === '' || !Number.isFinite(n) || n < 1e12) return v ?? null;
  return new Date(n).toISOString().replace('T', ' ').replace('Z', '');
};
const version = (v, extra = '') => ({ text: fmtVersion(v), title: v ?? null, cls: `num mono ${extra}`.trim() });

// ---------- sections ----------

function render() {
  if (last.digest) renderDigest(last.digest);
  if (last.sources) renderSources(last.sources);
  if (last.mappings) renderMappings();
  if (last.applications) renderApplications(last.applications);
  for (const kind of RULE_KINDS) if (last[kind]) renderRules(kind, last[kind]);
  if (last.ruleErrors) renderRuleErrors(last.ruleErrors);
  if (last.clients) renderClients();
  if (last.xds) renderXdsClients();
  renderSplit();
  if (last.services) renderServices();
  renderCanaries();
}

function renderDigest(d) {
  setText($('#replica'), d.replica ?? '–');
  setText($('#computed-at'), fmtTime(d.computedAt) ?? '–');
  $('#computed-at').title = d.computedAt ?? '';
  // Kinds served over xDS only have no discovery-stream encoding to digest.
  const xdsOnly = (d.xdsKinds || []).map((k) => ({ ...k, digest: k.digest || null }));
  syncRows($('#kinds'), [...(d.kinds || []), ...xdsOnly], (k) => ({
    key: k.kind,
    cls: 'kind',
    data: { kind: k.kind },
    cells: [k.kind, num(k.objects), num(k.revision), k.digest == null
      ? { text: 'xDS only', title: 'served over xDS only: no discovery-stream encoding to digest', cls: 'mono' }
      : mono(String(k.digest).slice(0, 12), k.digest)],
  }));
}

function renderSources(sources) {
  // The store's row first, then each kind; a node the store could not read is a row of its own.
  const rows = [];
  for (const s of [...sources].sort((a, b) => (a.detail ? 0 : 1) - (b.detail ? 0 : 1))) {
    rows.push({ key: keyStr(['source', s.kind]), kind: s.kind, state: s.state, condition: s.condition, bad: s.state !== 'synced' && s.state !== 'connected' });
    const unreadable = (s.detail && s.detail.unreadable) || {};
    for (const [path, error] of Object.entries(unreadable).sort()) {
      rows.push({ key: keyStr(['node', s.kind, path]), kind: path, state: 'unreadable', condition: error, bad: true });
    }
  }
  syncRows($('#sources'), rows, (r) => ({
    key: r.key,
    cls: r.bad ? 'source stale' : 'source',
    data: { source: r.kind, state: r.state },
    cells: [mono(r.kind), r.state, mono(r.condition ?? null)],
  }));
  setText($('#sources-count'), `${sources.length}`);
}

function renderMappings() {
  const q = $('#mapping-search').value.trim().toLowerCase();
  const all = sortBy(last.mappings, (m) => [m.namespace, m.interfaceName]);
  const matches = (m) => [m.interfaceName, ...(m.applicationNames || [])]
    .some((s) => String(s ?? '').toLowerCase().includes(q));
  const shown = q ? all.filter(matches) : all;
  syncRows($('#mappings'), shown, (m) => ({
    key: keyStr([m.namespace, m.interfaceName]),
    cls: 'mapping',
    data: { namespace: m.namespace, interface: m.interfaceName },
    cells: [m.namespace, mono(m.interfaceName), [...(m.applicationNames || [])].sort().join(', ')],
  }));
  setText($('#mappings-count'), q ? `${shown.length} of ${all.length}` : `${all.length}`);
}

function renderApplications(apps) {
  const rows = sortBy(apps, (a) => [a.application, a.namespace]);
  syncRows($('#applications'), rows, (a) => ({
    key: keyStr([a.namespace, a.application]),
    cls: 'application',
    data: { namespace: a.namespace, application: a.application },
    cells: [a.application, a.namespace, { text: (a.interfaces || []).length, cls: 'num mono', title: (a.interfaces || []).join('\n') }],
  }));
  setText($('#applications-count'), `${rows.length}`);
}

function initRules() {
  const host = $('#rules');
  for (const kind of RULE_KINDS) {
    const d = el('details', { class: 'rule-kind', 'data-kind': kind });
    const summary = el('summary');
    summary.append(el('span', { class: 'rule-kind-name' }, kind), el('span', { class: 'count mono' }));
    d.append(summary, el('div', { class: 'rule-list' }));
    host.append(d);
  }
}

function renderRules(kind, list) {
  const d = $(`#rules details[data-kind="${kind}"]`);
  const items = sortBy(list.items, (r) => [r.metadata?.namespace, r.metadata?.name]);
  setText($('.count', d), `${items.length} rule${items.length === 1 ? '' : 's'} · rev ${list.revision ?? '–'}`);
  const nameOf = (r) => [r.metadata?.namespace, r.metadata?.name].filter((x) => x != null).join('/');
  reconcile($('.rule-list', d), items, (r) => keyStr([r.metadata?.namespace, r.metadata?.name]), (r) => {
    const box = el('div', { class: 'rule', 'data-namespace': r.metadata?.namespace ?? '', 'data-name': r.metadata?.name ?? '' });
    box.append(el('h3', { class: 'mono' }), el('pre'));
    return box;
  }, (box, r) => {
    setText($('h3', box), nameOf(r) || '(unnamed)');
    setText($('pre', box), JSON.stringify(r.spec ?? null, null, 2));
  });
}

function renderRuleErrors(report) {
  const invalid = sortBy(report.invalid, (r) => [r.kind, r.namespace, r.name]).map((r) => ({
    key: keyStr(['object', r.kind, r.namespace, r.name]),
    kind: r.kind,
    what: [r.namespace, r.name].filter((x) => x).join('/'),
    error: r.error,
  }));
  const files = Object.entries(report.files || {}).sort().map(([file, error]) => ({
    key: keyStr(['file', file]),
    kind: 'file',
    what: file,
    error,
  }));
  const rows = [...invalid, ...files];
  syncRows($('#rule-errors'), rows, (r) => ({
    key: r.key,
    cls: 'rule-error stale',
    data: { kind: r.kind },
    cells: [r.kind, mono(r.what), mono(r.error)],
  }));
  setText($('#rule-errors-count'), `${rows.length}`);
}

function renderClients() {
  const staleOnly = $('#stale-only').checked;
  const clients = [...(last.clients.clients || [])].sort((a, b) => Number(a.id) - Number(b.id));
  const rows = clients.flatMap((c) => (c.kinds || []).map((k) => ({ c, k })));
  const staleRows = rows.filter((r) => !r.k.synced);
  const staleClients = new Set(staleRows.map((r) => r.c.id)).size;
  const shown = staleOnly ? staleRows : rows;
  // Repeated per-client cells are dimmed so each client's block reads as one group.
  shown.forEach((r, i) => { r.rep = i > 0 && shown[i - 1].c === r.c; });
  syncRows($('#clients'), shown, ({ c, k, rep }) => {
    const dim = rep ? 'rep' : '';
    return {
      key: keyStr([c.id, k.kind]),
      cls: k.synced ? 'client' : 'client stale',
      data: { 'client-id': c.id, kind: k.kind },
      cells: [
        num(c.id, dim),
        { text: c.identity, title: c.identity, cls: `mono ${dim}`.trim() },
        { text: c.namespace, cls: dim },
        { text: c.peer, cls: `mono ${dim}`.trim() },
        { text: fmtTime(c.connectedSince), title: c.connectedSince, cls: `mono ${dim}`.trim() },
        k.kind,
        num(k.sent),
        num(k.acked),
        num(k.current),
        num(k.lagSeconds == null ? null : Number(k.lagSeconds).toFixed(1), k.lagSeconds >= 10 ? 'bad' : ''),
        { text: k.synced ? 'yes' : 'no', cls: k.synced ? 'ok' : 'bad' },
      ],
    };
  });
  const total = last.clients.total ?? clients.length;
  const stale = last.clients.stale ?? staleClients;
  const cut = last.clients.truncated ? ` · first ${clients.length} shown` : '';
  setText($('#clients-count'), `${total} connected · ${stale} stale${cut}`);
}

// One row per client and type: what it subscribed to, the versions sent and acknowledged, its
// last rejection, and why it is not in step.
function renderXdsClients() {
  const x = last.xds;
  const section = $('#xds-clients');
  section.hidden = x.enabled === false;
  if (x.enabled === false) return;
  const rows = (x.clients || []).flatMap((c, i) => {
    const types = c.types && c.types.length ? c.types : [null];
    return types.map((t, j) => ({ c, t, i, rep: j > 0 }));
  });
  syncRows(section, rows, ({ c, t, i, rep }) => {
    const dim = rep ? 'rep' : '';
    const stale = (c.stale || []).length > 0;
    const nack = t && t.nack;
    const shown = t ? (t.subscribed || []) : [];
    const names = t ? (t.wildcard ? `* (${t.names})` : `${t.names}`) : null;
    return {
      key: keyStr([x.offset, i, c.node_id, c.connected_since, t && t.type]),
      cls: stale ? 'xds-client stale' : 'xds-client',
      data: { node: c.node_id, type: t ? t.type : '' },
      cells: [
        { text: c.node_id, title: c.node_id, cls: `mono ${dim}`.trim() },
        { text: c.namespace, cls: dim },
        { text: c.identity, cls: `mono ${dim}`.trim() },
        { text: c.protocol, cls: dim },
        { text: fmtTime(c.connected_since), title: c.connected_since, cls: `mono ${dim}`.trim() },
        t ? t.type : null,
        { text: names, title: shown.join('\n') + (t && t.names > shown.length ? `\n… ${t.names - shown.length} more` : ''), cls: 'num mono' },
        version(t && t.sent),
        version(t && t.acked, t && t.sent !== t.acked ? 'bad' : ''),
        num(t && t.lag_seconds != null ? Number(t.lag_seconds).toFixed(1) : null, t && t.lag_seconds >= 10 ? 'bad' : ''),
        t && t.not_found_count
          ? { text: `${t.not_found.join(', ')}${t.not_found_count > t.not_found.length ? ` (+${t.not_found_count - t.not_found.length})` : ''}`, title: 'subscribed, but resolves to nothing: the client is told it does not exist', cls: 'mono bad not-found' }
          : null,
        { text: nack ? `${fmtVersion(nack.version)}: ${nack.message}` : null, title: nack ? `version ${nack.version}: ${nack.message}` : null, cls: nack ? 'mono bad' : 'mono' },
        { text: stale ? 'no' : 'yes', title: (c.stale || []).join('\n'), cls: stale ? 'bad' : 'ok' },
      ],
    };
  });
  const from = x.offset + 1;
  const to = x.offset + (x.clients || []).length;
  const page = x.matched > (x.clients || []).length ? ` · ${from}-${to} of ${x.matched} shown` : '';
  setText($('#xds-clients-count'), `${x.total} connected · ${x.stale} stale${page}`);
  $('#xds-prev').disabled = x.offset === 0;
  $('#xds-next').disabled = !x.truncated;
}

// One row per endpoint, grouped by service (a service without endpoints has a row of its own).
function renderServices() {
  const x = last.services;
  const section = $('#services');
  section.hidden = !last.xds || last.xds.enabled === false;
  const rows = (x.services || []).flatMap((s) => {
    const endpoints = s.endpoints && s.endpoints.length ? s.endpoints : [null];
    return endpoints.map((e, j) => ({ s, e, rep: j > 0 }));
  });
  syncRows(section, rows, ({ s, e, rep }) => {
    const dim = rep ? 'rep' : '';
    const port = e && Object.keys(e.ports || {}).length
      ? Object.entries(e.ports).map(([n, p]) => `${n}:${p}`).join(',')
      : null;
    return {
      key: keyStr([s.namespace, s.name, e && e.address, port]),
      cls: e && e.state === 'held' ? 'service-endpoint stale' : 'service-endpoint',
      data: { service: s.name, namespace: s.namespace, address: e ? e.address : '' },
      cells: [
        { text: s.name, title: [...(s.hosts || []), s.endpointCount > (s.endpoints || []).length ? `first ${s.endpoints.length} of ${s.endpointCount} endpoints` : ''].join('\n').trim(), cls: `mono ${dim}`.trim() },
        { text: s.namespace, cls: dim },
        { text: s.application, cls: dim },
        { text: s.source, title: (s.ports || []).join('\n'), cls: dim },
        { text: e ? e.address + (port ? ` (${port})` : '') : null, cls: 'mono', title: e ? Object.entries(e.labels || {}).map(([k, v]) => `${k}=${v}`).join('\n') : null },
        num(e && e.weight),
        e && e.tag,
        { text: e && e.locality, cls: 'mono' },
        e ? { text: e.state, cls: e.state === 'held' ? 'bad' : 'ok' } : null,
      ],
    };
  });
  const shown = (x.services || []).length;
  const page = x.truncated || x.offset > 0 ? ` · ${x.offset + 1}-${x.offset + shown} shown` : '';
  setText($('#services-count'), `${x.matched}${page}`);
  $('#services-prev').disabled = x.offset === 0;
  $('#services-next').disabled = !x.truncated;
}

function splitPath() {
  const service = $('#split-service').value.trim();
  if (!service) return null;
  const q = new URLSearchParams({ service, namespace: $('#split-namespace').value.trim() || 'default' });
  const header = $('#split-header').value.trim();
  if (header) q.append('header', header);
  return `/debug/xds/split?${q}`;
}

// One bar per endpoint, as wide as its share of calls, in the order the server gives them.
function renderSplit() {
  const section = $('#split');
  section.hidden = !last.xds || last.xds.enabled === false;
  const named = splitAsked !== null;
  const answer = named ? last.split : null;
  const split = answer && answer.split;
  setText($('#split-route'), answer && answer.error ? answer.error
    : split ? `route ${split.route}: ${split.matched} · version of ${fmtVersion(split.version)}${(split.notes || []).map((n) => ` · ${n}`).join('')}` : '');
  $('#split-route').classList.toggle('error', Boolean(answer && answer.error));
  const rows = split ? split.endpoints : [];
  reconcile($('.split-bars', section), rows, (e) => keyStr([e.cluster, e.address]), () => {
    const row = el('div', { class: 'split-row' });
    const bar = el('div', { class: 'split-bar' });
    bar.append(el('div', { class: 'split-fill' }));
    row.append(el('span', { class: 'split-who mono' }), bar, el('span', { class: 'split-share num mono' }));
    return row;
  }, (row, e) => {
    setAttr(row, 'data-address', e.address);
    setAttr(row, 'data-share', e.share.toFixed(1));
    setText($('.split-who', row), e.address);
    row.title = `${e.cluster}\n${e.locality}`;
    $('.split-fill', row).style.width = `${Math.max(0, Math.min(100, e.share))}%`;
    setText($('.split-share', row), `${e.share.toFixed(1)}%`);
  });
  $('.empty', section).hidden = named;
}

const SVG = 'http://www.w3.org/2000/svg';

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

// The weight of one run over time: a step line, a dot per analysis step coloured by its
// metric results (hover for the values), the dashed line at maxWeight.
function weightChart(c) {
  const W = 600;
  const H = 120;
  const pad = { l: 30, r: 8, t: 8, b: 16 };
  const chart = svg('svg', { class: 'weight-chart', viewBox: `0 0 ${W} ${H}`, role: 'img' });
  const steps = c.history || [];
  const times = steps.map((s) => Date.parse(s.time)).filter((t) => !Number.isNaN(t));
  const t0 = times.length ? Math.min(...times) : 0;
  const t1 = times.length ? Math.max(...times) : 1;
  const x = (t) => pad.l + ((t - t0) / Math.max(t1 - t0, 1)) * (W - pad.l - pad.r);
  const y = (w) => H - pad.b - (w / 100) * (H - pad.t - pad.b);
  // The run's phases as bands along the time axis, each from its first step to the next
  // phase's: a Blue/Green run reads analysis, switch, promotion; an A/B run its iterations.
  const bands = [];
  steps.forEach((s) => {
    const t = Date.parse(s.time);
    if (Number.isNaN(t)) return;
    const open = bands[bands.length - 1];
    if (open && open.phase === s.phase) { open.to = t; return; }
    if (open) open.to = t;
    bands.push({ phase: s.phase, from: t, to: t });
  });
  for (const band of bands) {
    const x0 = x(band.from);
    const rect = svg('rect', { class: `phase-band ${band.phase}`, 'data-phase': band.phase, x: x0, y: pad.t, width: Math.max(x(band.to) - x0, 2), height: H - pad.t - pad.b });
    const title = svg('title');
    title.textContent = band.phase;
    rect.append(title);
    chart.append(rect);
    if (x(band.to) - x0 > 70) {
      const label = svg('text', { class: 'phase-label', x: x0 + 3, y: pad.t + 9 });
      label.textContent = band.phase;
      chart.append(label);
    }
  }
  chart.append(svg('line', { class: 'axis', x1: pad.l, x2: W - pad.r, y1: y(0), y2: y(0) }));
  chart.append(svg('line', { class: 'max', x1: pad.l, x2: W - pad.r, y1: y(c.maxWeight), y2: y(c.maxWeight) }));
  for (const w of [0, 50, 100]) {
    const label = svg('text', { x: 2, y: y(w) + 3 });
    label.textContent = `${w}%`;
    chart.append(label);
  }
  let points = '';
  let prev = null;
  steps.forEach((s) => {
    const px = x(Date.parse(s.time));
    if (prev !== null) points += ` ${px},${y(prev)}`;
    points += ` ${px},${y(s.weight)}`;
    prev = s.weight;
  });
  chart.append(svg('polyline', { class: 'line', points: points.trim() }));
  steps.forEach((s) => {
    const metrics = s.metrics || [];
    const ok = metrics.length ? String(metrics.every((m) => m.ok)) : '';
    const dot = svg('circle', { class: 'step', cx: x(Date.parse(s.time)), cy: y(s.weight), r: 4, 'data-weight': s.weight, 'data-ok': ok });
    const title = svg('title');
    title.textContent = `${s.time} ${s.phase} weight ${s.weight}%` + metrics.map((m) => `\n${m.name}: ${m.value ?? 'no data'}${m.ok ? '' : ' FAILED'}${m.message ? ` (${m.message})` : ''}`).join('');
    dot.append(title);
    chart.append(dot);
  });
  return chart;
}

// What the strategy does, as the CLI's `canary status` says it.
function strategyText(c) {
  const of = c.wantedIterations ? ` · iteration ${c.iterations} of ${c.wantedIterations}` : '';
  if (c.strategy === 'A/B') {
    const matches = (c.match || []).map((m) => Object.entries(m.headers || {}).map(([name, v]) => {
      const [how, text] = v.exact != null ? ['=', v.exact] : v.prefix != null ? [' prefix ', v.prefix] : v.suffix != null ? [' suffix ', v.suffix] : [' regex ', v.regex];
      return `${name}${how}${text}`;
    }).join(' & '));
    return `A/B${of} · canary gets calls with ${matches.join(' or ')}`;
  }
  if (c.strategy === 'Blue/Green') return `Blue/Green${of} · test traffic only, then every call at once`;
  const sticky = c.affinityHeader ? ` · each caller kept by header ${c.affinityHeader}` : '';
  return `${c.strategy || 'Canary'} · weight steps to ${c.maxWeight}%${sticky}`;
}

function renderCanaries() {
  const section = $('#canaries');
  if (!last.canaries) { section.hidden = true; return; }
  section.hidden = false;
  const list = sortBy(last.canaries.canaries || [], (c) => [c.namespace, c.name]);
  reconcile($('.canary-list', section), list, (c) => keyStr([c.namespace, c.name]), () => el('div', { class: 'canary' }), (div, c) => {
    setAttr(div, 'data-namespace', c.namespace);
    setAttr(div, 'data-name', c.name);
    // Rebuilt only when the canary changed: a chart is a few dozen nodes.
    const sig = JSON.stringify(c);
    if (div.sig === sig) return;
    div.sig = sig;
    div.replaceChildren();
    const h = el('h3', {}, `${c.namespace}/${c.name} → ${c.target}`);
    h.append(el('span', { class: `phase ${c.phase || 'Initializing'}` }, `${c.phase || 'Initializing'} · weight ${c.weight}% of ${c.maxWeight}% · failed checks ${c.failedChecks}/${c.threshold}`));
    setAttr(div, 'data-strategy', c.strategy || 'Canary');
    div.append(h, el('p', { class: 'strategy' }, strategyText(c)), weightChart(c));
    const lastStep = [...(c.history || [])].reverse().find((s) => (s.metrics || []).length);
    if (lastStep) {
      div.append(el('p', { class: 'results' }, lastStep.metrics.map((m) => `${m.name} ${m.value ?? 'no data'} ${m.ok ? 'ok' : 'FAILED'}`).join(' · ')));
    }
  });
  $('.empty', section).hidden = list.length > 0;
  setText($('#canaries-count'), `${list.length}${last.canaries.truncated ? '+' : ''}`);
}

// ---------- start ----------

takeTokenFromFragment();
initToken();
initRules();
$('#mapping-search').addEventListener('input', () => last.mappings && renderMappings());
$('#stale-only').addEventListener('change', () => {
  if (last.clients) renderClients();
  poll(); // the server filters the stale ones
});
$('#xds-stale-only').addEventListener('change', () => { xdsOffset = 0; poll(); });
$('#service-search').addEventListener('input', () => { servicesOffset = 0; servicesForced = true; poll(); });
$('#services-prev').addEventListener('click', () => { servicesOffset = Math.max(0, servicesOffset - SERVICE_ROWS); servicesForced = true; poll(); });
$('#services-next').addEventListener('click', () => { servicesOffset += SERVICE_ROWS; servicesForced = true; poll(); });
$('#split-form').addEventListener('submit', (e) => { e.preventDefault(); splitAsked = splitPath(); last.split = null; poll(); });
$('#xds-prev').addEventListener('click', () => { xdsOffset = Math.max(0, xdsOffset - CLIENT_ROWS); poll(); });
$('#xds-next').addEventListener('click', () => { xdsOffset += CLIENT_ROWS; poll(); });
// Coming back to the tab should show fresh data at once instead of after the slow interval.
document.addEventListener('visibilitychange', () => { if (!document.hidden) poll(); });
// A pasted `#token=` link in an already open tab is a same-document navigation.
window.addEventListener('hashchange', () => { if (takeTokenFromFragment()) poll(); });
poll();
