#!/usr/bin/env node
// Reads the per-round result files that scripts/bench wrote (benchmarks/results/raw/), and
// writes the summary: benchmarks/results/summary.json (every figure as min / median / max
// over the rounds, the ratios and the targets of issues 6, 14, 15, 16 and 18), a table on stdout,
// and, when gnuplot is there, benchmarks/results/summary.png: a grid with a panel for each kind
// of figure that was measured (task lifecycle, inbox, topic fan-out, idle sessions, sink,
// cluster), so that any subset from scripts/bench --only plots what it ran; none when nothing
// plottable was measured.
//
//   node benchmarks/summary.js [--raw DIR] [--out DIR] [--no-plot]
//
// A figure's value in one round is that program's median for the round (scripts/bench runs
// each program with one run per round, so it is the run's value). A ratio is taken within
// a round, between programs that ran back to back, then summarised like a figure.
'use strict';

const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');

const here = __dirname;
const args = process.argv.slice(2);
let rawDir = path.join(here, 'results', 'raw');
let outDir = path.join(here, 'results');
let plot = true;
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--raw') rawDir = args[++i];
  else if (args[i] === '--out') outDir = args[++i];
  else if (args[i] === '--no-plot') plot = false;
  else {
    console.error(`summary.js: unknown argument ${args[i]}`);
    process.exit(2);
  }
}

// ----- reading the round files --------------------------------------------------------

// raw/<program>.r<round>.json
function readRounds() {
  const rounds = new Map(); // round -> Map(program -> json)
  for (const f of fs.readdirSync(rawDir)) {
    const m = /^(.+)\.r(\d+)\.json$/.exec(f);
    if (!m) continue;
    const round = Number(m[2]);
    if (!rounds.has(round)) rounds.set(round, new Map());
    rounds.get(round).set(m[1], JSON.parse(fs.readFileSync(path.join(rawDir, f), 'utf8')));
  }
  return [...rounds.entries()].sort((a, b) => a[0] - b[0]).map(([, v]) => v);
}

const med = (s) => (s && typeof s === 'object' ? s.median : s);

// Each extractor maps one program's file of one round to { key: value }.
const extract = {
  ceiling(j) {
    const out = {};
    for (const m of j.modes) {
      const key = m.key === 'threads' ? `threads${m.threads}` : m.key;
      out[`ceiling.${key}`] = m.tasks_per_s.median;
    }
    return out;
  },
  lifecycle(prefix, j) {
    const out = {};
    for (const [slots, s] of Object.entries(j.throughput_tasks_per_s)) {
      out[`${prefix}.tasks_per_s.slots${slots}`] = med(s);
    }
    out[`${prefix}.latency.p50_ms`] = med(j.latency.p50_ms);
    out[`${prefix}.latency.p99_ms`] = med(j.latency.p99_ms);
    out[`${prefix}.latency.p999_ms`] = med(j.latency.p999_ms);
    return out;
  },
  messaging(prefix, j) {
    const out = {};
    if (j.inbox) {
      if (typeof j.inbox.recipients === 'number') out[`${prefix}.inbox.recipients`] = j.inbox.recipients;
      out[`${prefix}.inbox.max_msgs_per_s`] = med(j.inbox.max_msgs_per_s);
      for (const l of j.inbox.latency) {
        const at = `${prefix}.inbox.at${l.offered_per_s}`;
        out[`${at}.achieved_per_s`] = med(l.achieved_per_s);
        out[`${at}.p50_ms`] = med(l.p50_ms);
        out[`${at}.p99_ms`] = med(l.p99_ms);
        out[`${at}.p999_ms`] = med(l.p999_ms);
      }
    }
    for (const f of j.fanout || []) {
      const at = `${prefix}.fanout${f.subscribers}`;
      out[`${at}.published_per_s`] = med(f.throughput.published_per_s);
      out[`${at}.delivered_per_s`] = med(f.throughput.delivered_per_s);
      out[`${at}.latency_offered_events_per_s`] = f.latency.offered_events_per_s;
      out[`${at}.p50_ms`] = med(f.latency.p50_ms);
      out[`${at}.p99_ms`] = med(f.latency.p99_ms);
    }
    return out;
  },
  sessions(prefix, j) {
    const out = { [`${prefix}.sessions`]: j.sessions };
    for (const k of ['rss_mib_before', 'rss_mib_after', 'rss_kib_per_session', 'cpu_percent_of_core',
      'nats_cpu_percent_of_core', 'connect_per_s', 'heartbeats_per_s', 'heartbeat_rtt_p50_ms',
      'heartbeat_rtt_p99_ms']) {
      if (j[k] !== undefined && j[k] !== null) out[`${prefix}.${k}`] = med(j[k]);
    }
    // the connect rate of the last tenth of the sessions: does connecting slow down as they pile up?
    const tenths = j.connect_per_s_by_tenth;
    if (Array.isArray(tenths) && tenths.length) out[`${prefix}.connect_per_s_last_tenth`] = med(tenths[tenths.length - 1]);
    return out;
  },
  // amp-bench-cluster: per number of amp-servers, rates and their ratio to the first count
  // (one server) measured in the same run; the failover run's gaps and tallies.
  cluster(j) {
    const out = {};
    for (const [n, v] of Object.entries(j.scale || {})) {
      const at = `cluster.servers${n}`;
      out[`${at}.tasks_per_s`] = med(v.tasks_per_s);
      out[`${at}.tasks_ratio`] = v.tasks_ratio;
      out[`${at}.messages_per_s`] = med(v.messages_per_s);
      out[`${at}.messages_ratio`] = v.messages_ratio;
      out[`${at}.busiest_amp_server_cpu_us_per_task`] = med(v.per_task.busiest_amp_server_cpu_us);
      out[`${at}.amp_servers_cpu_us_per_task`] = med(v.per_task.amp_servers_cpu_us);
      out[`${at}.nats_servers_cpu_us_per_task`] = med(v.per_task.nats_servers_cpu_us);
      out[`${at}.paced.busiest_amp_server_cpu_us_per_task`] = med(v.per_task_paced.busiest_amp_server_cpu_us);
      out[`${at}.paced.amp_servers_cpu_us_per_task`] = med(v.per_task_paced.amp_servers_cpu_us);
    }
    if (j.failover) {
      for (const k of ['node_gap_s', 'server_gap_s', 'submitted', 'completed_once', 'completed_twice', 'failed', 'lost']) {
        out[`cluster.failover.${k}`] = j.failover[k];
      }
    }
    return out;
  },
  // amp-bench-sink: per target and batch, the sink's rows/s, the plain client's, the raw
  // cnats drain's (explicit acks, and AckPolicy all), the ratios taken within the run, and
  // the CPU per message of each side; the lag at 5,000 events/s.
  sink(j) {
    const out = {};
    if (j.raw_drain_ceiling_msgs_per_s) out['sink.raw_drain_ceiling_msgs_per_s'] = med(j.raw_drain_ceiling_msgs_per_s);
    for (const [target, batches] of Object.entries(j.targets || {})) {
      for (const [batch, v] of Object.entries(batches)) {
        const at = `sink.${target}.batch${batch}`;
        out[`${at}.rows_per_s`] = med(v.sink_rows_per_s);
        out[`${at}.baseline_rows_per_s`] = med(v.baseline_rows_per_s);
        out[`${at}.vs_baseline`] = med(v.ratio);
        out[`${at}.raw_drain_msgs_per_s`] = med(v.raw_drain_msgs_per_s);
        out[`${at}.vs_raw_drain`] = med(v.sink_vs_raw_drain);
        if (v.raw_drain_ack_all_msgs_per_s) {
          out[`${at}.raw_drain_ack_all_msgs_per_s`] = med(v.raw_drain_ack_all_msgs_per_s);
        }
        for (const [what, us] of Object.entries(v.cpu_us_per_msg || {})) {
          out[`${at}.cpu_us_per_msg.${what}`] = med(us);
        }
      }
    }
    if (j.lag) {
      out['sink.lag.offered_per_s'] = j.lag.offered_per_s;
      out['sink.lag.achieved_per_s'] = j.lag.achieved_per_s;
      for (const k of ['committed_to_acked', 'stored_to_acked']) {
        for (const p of ['p50_ms', 'p99_ms', 'max_ms']) {
          const v = j.lag[k] && j.lag[k][p];
          if (typeof v === 'number') out[`sink.lag.${k}.${p}`] = v;
        }
      }
    }
    return out;
  },
  peer(prefix, j) {
    const out = {};
    for (const [k, v] of Object.entries(j.figures)) out[`${prefix}.${k}`] = v.median;
    return out;
  },
  // benchmarks/peer/natsjs.js: its figures, and the offered rate of its publish -> consumer
  // latency (parameters.latency.offered_msgs_per_s), to compare with amp's inbox at that rate.
  natsjs(j) {
    const out = extract.peer('natsjs', j);
    const rate = j.parameters && j.parameters.latency && j.parameters.latency.offered_msgs_per_s;
    if (typeof rate === 'number') out['natsjs.latency_offered_msgs_per_s'] = rate;
    return out;
  },
};

const programs = {
  ceiling: (j) => extract.ceiling(j),
  // amp-bench-library writes {"<backend>": {...}} for each backend it ran.
  'library-jetstream': (j) => extract.lifecycle('library.jetstream', j.jetstream),
  'library-memory': (j) => extract.lifecycle('library.memory', j.memory),
  'tasks-jetstream': (j) => extract.lifecycle('server.jetstream', j),
  'tasks-memory': (j) => extract.lifecycle('server.memory', j),
  'messaging-jetstream': (j) => extract.messaging('server.jetstream', j),
  'messaging-memory': (j) => extract.messaging('server.memory', j),
  // One sender to 8 recipients in turn (sends to one recipient are stored one at a time).
  'messaging8-jetstream': (j) => extract.messaging('server.jetstream.to8', j),
  'sessions-jetstream': (j) => extract.sessions('server.jetstream.idle', j),
  'sessions-memory': (j) => extract.sessions('server.memory.idle', j),
  cluster: (j) => extract.cluster(j),
  sink: (j) => extract.sink(j),
  'peer-bullmq': (j) => extract.peer('bullmq', j),
  'peer-natsjs': (j) => extract.natsjs(j),
};

// ----- ratios and targets ---------------------------------------------------------------

// [key, label, numerator, denominator, when]; each taken within a round (when(round's figures),
// if given, must hold too).
const ratios = [
  ['server.jetstream.vs_ceiling.slots64', 'amp-server (JetStream, 64 slots) / batched raw ceiling',
    'server.jetstream.tasks_per_s.slots64', 'ceiling.batched'],
  ['server.jetstream.vs_ceiling.slots8', 'amp-server (JetStream, 8 slots) / batched raw ceiling',
    'server.jetstream.tasks_per_s.slots8', 'ceiling.batched'],
  ['server.jetstream.vs_serial_ceiling.slots1', 'amp-server (JetStream, 1 slot) / raw one at a time',
    'server.jetstream.tasks_per_s.slots1', 'ceiling.serial'],
  ['library.jetstream.vs_ceiling.slots64', 'amp library (JetStream, 64 slots) / batched raw ceiling',
    'library.jetstream.tasks_per_s.slots64', 'ceiling.batched'],
  ['server.jetstream.vs_library.slots64', 'amp-server / amp library (JetStream, 64 slots): the gateway\'s cost',
    'server.jetstream.tasks_per_s.slots64', 'library.jetstream.tasks_per_s.slots64'],
  // the raw reference at the same offered load (nats.js publish -> consume() callback)
  ['server.jetstream.inbox.at5000.p99_vs_natsjs', 'inbox p99 at 5,000/s: amp-server (JetStream, 1 to 1) / raw nats.js',
    'server.jetstream.inbox.at5000.p99_ms', 'natsjs.latency_p99', (r) => r['natsjs.latency_offered_msgs_per_s'] === 5000],
];
for (const mode of ['aof', 'off']) {
  for (const c of [1, 8, 64]) {
    ratios.push([`server.jetstream.vs_bullmq_${mode}.c${c}`,
      `amp-server (JetStream, ${c} slots) / BullMQ ${mode} (concurrency ${c}, adding while processing)`,
      `server.jetstream.tasks_per_s.slots${c}`, `bullmq.${mode}.throughput_during_c${c}`]);
  }
  ratios.push([`server.memory.vs_bullmq_${mode}.c64`,
    `amp-server (memory, 64 slots) / BullMQ ${mode} (concurrency 64, adding while processing)`,
    'server.memory.tasks_per_s.slots64', `bullmq.${mode}.throughput_during_c64`]);
  ratios.push([`server.jetstream.p99_vs_bullmq_${mode}`,
    `submit-to-result p99 at 1,000/s: amp-server (JetStream) / BullMQ ${mode}`,
    'server.jetstream.latency.p99_ms', `bullmq.${mode}.latency_p99`]);
}

// [label, key (of a figure or ratio), test, issue, when]: the medians over the rounds are
// judged; when(figures), if given, returns why the figure was measured under other conditions
// than the target's (it is then not judged), or null.
const atLeast = (key, n, what) => (f) => (f[key] && f[key].median < n ? `${f[key].median.toLocaleString('en-US')} ${what}` : null);
const exactly = (key, n, what) => (f) => (f[key] && f[key].median !== n ? `${f[key].median.toLocaleString('en-US')} ${what}` : null);
const tenThousandSessions = atLeast('server.jetstream.idle.sessions', 10000, 'sessions');
const targets = [
  ['amp-server >= 0.7x the batched raw ceiling (64 slots)', 'server.jetstream.vs_ceiling.slots64', (v) => v >= 0.7],
  ['amp-server >= 1.5x BullMQ with AOF (64 slots vs concurrency 64)', 'server.jetstream.vs_bullmq_aof.c64', (v) => v >= 1.5],
  ['amp-server >= 1.5x BullMQ with AOF (8 slots vs concurrency 8)', 'server.jetstream.vs_bullmq_aof.c8', (v) => v >= 1.5],
  ['submit-to-result p99 at 1,000 tasks/s below BullMQ AOF\'s', 'server.jetstream.p99_vs_bullmq_aof', (v) => v < 1],
  ['submit-to-result p99 at 1,000 tasks/s below BullMQ off\'s', 'server.jetstream.p99_vs_bullmq_off', (v) => v < 1],
  ['inbox p99 < 5 ms at 5,000 msgs/s (JetStream, one sender to one recipient)', 'server.jetstream.inbox.at5000.p99_ms', (v) => v < 5],
  ['inbox p99 < 5 ms at 5,000 msgs/s (JetStream, one sender to 8 recipients)', 'server.jetstream.to8.inbox.at5000.p99_ms', (v) => v < 5],
  ['inbox p99 < 5 ms at 5,000 msgs/s (memory, one to one)', 'server.memory.inbox.at5000.p99_ms', (v) => v < 5],
  ['idle sessions (10,000 unless --quick) in < 1 GiB resident (JetStream)', 'server.jetstream.idle.rss_mib_after', (v) => v < 1024],
  ['idle sessions (10,000) in < 1 GiB resident (memory)', 'server.memory.idle.rss_mib_after', (v) => v < 1024],
].map((t) => [...t, 6]).concat([
  ['amp-server >= 1.0x BullMQ with AOF (JetStream, 64 slots vs concurrency 64)', 'server.jetstream.vs_bullmq_aof.c64', (v) => v >= 1.0],
  ['amp-server >= 0.7x the batched raw ceiling (JetStream, 64 slots)', 'server.jetstream.vs_ceiling.slots64', (v) => v >= 0.7],
  ['amp-server >= 1.0x BullMQ with AOF (JetStream, 8 slots vs concurrency 8)', 'server.jetstream.vs_bullmq_aof.c8', (v) => v >= 1.0],
  ['amp-server >= 1.0x raw one at a time (JetStream, 1 slot)', 'server.jetstream.vs_serial_ceiling.slots1', (v) => v >= 1.0],
  ['submit-to-result p99 at 1,000 tasks/s <= BullMQ AOF\'s', 'server.jetstream.p99_vs_bullmq_aof', (v) => v <= 1],
  ['amp-server (memory) >= 1.5x BullMQ with AOF (64 slots vs concurrency 64)', 'server.memory.vs_bullmq_aof.c64', (v) => v >= 1.5],
].map((t) => [...t, 14])).concat([
  ['failover: nothing lost (SIGKILL of a NATS node and of an amp-server)', 'cluster.failover.lost', (v) => v === 0],
  ['failover: no task completed twice', 'cluster.failover.completed_twice', (v) => v === 0],
].map((t) => [...t, 16])).concat([
  ['sink into PostgreSQL >= 0.7x a plain client (batch 256)', 'sink.postgres.batch256.vs_baseline', (v) => v >= 0.7],
  ['sink into SQLite >= 0.7x a plain client (batch 256)', 'sink.sqlite.batch256.vs_baseline', (v) => v >= 0.7],
  ['sink committed-to-acked p99 <= 100 ms at 5,000 events/s (PostgreSQL)', 'sink.lag.committed_to_acked.p99_ms', (v) => v <= 100],
].map((t) => [...t, 18])).concat([
  ['inbox one to one >= 20,000 msgs/s (JetStream)', 'server.jetstream.inbox.max_msgs_per_s', (v) => v >= 20000,
    exactly('server.jetstream.inbox.recipients', 1, 'recipients')],
  ['inbox p99 <= 5 ms at 5,000 msgs/s (JetStream, one to one)', 'server.jetstream.inbox.at5000.p99_ms', (v) => v <= 5,
    exactly('server.jetstream.inbox.recipients', 1, 'recipients')],
  ['inbox p99 at 5,000 msgs/s <= 2x raw nats.js\'s (JetStream, one to one)', 'server.jetstream.inbox.at5000.p99_vs_natsjs',
    (v) => v <= 2, exactly('server.jetstream.inbox.recipients', 1, 'recipients')],
  ['fan-out 1->1,000 >= 90,000 delivered events/s (JetStream)', 'server.jetstream.fanout1000.delivered_per_s', (v) => v >= 90000],
  ['fan-out 1->100 at 100 events/s: delivery p99 <= 5 ms (JetStream)', 'server.jetstream.fanout100.p99_ms', (v) => v <= 5,
    exactly('server.jetstream.fanout100.latency_offered_events_per_s', 100, 'events/s')],
  ['10,000 idle sessions: amp-server CPU <= 5% of a core (JetStream)', 'server.jetstream.idle.cpu_percent_of_core', (v) => v <= 5,
    tenThousandSessions],
  ['10,000 idle sessions: nats-server CPU <= 5% of a core (JetStream)', 'server.jetstream.idle.nats_cpu_percent_of_core',
    (v) => v <= 5, tenThousandSessions],
  ['10,000 idle sessions: connects >= 2,000/s (JetStream)', 'server.jetstream.idle.connect_per_s', (v) => v >= 2000,
    tenThousandSessions],
  ['10,000 idle sessions: connects >= 2,000/s in the last tenth (JetStream)', 'server.jetstream.idle.connect_per_s_last_tenth',
    (v) => v >= 2000, tenThousandSessions],
  ['10,000 idle sessions: heartbeat p99 <= 5 ms (JetStream)', 'server.jetstream.idle.heartbeat_rtt_p99_ms', (v) => v <= 5,
    tenThousandSessions],
  ['10,000 idle sessions: <= 20 KiB resident per session (JetStream)', 'server.jetstream.idle.rss_kib_per_session',
    (v) => v <= 20, tenThousandSessions],
  ['inbox one to one >= 50,000 msgs/s (memory transport)', 'server.memory.inbox.max_msgs_per_s', (v) => v >= 50000,
    exactly('server.memory.inbox.recipients', 1, 'recipients')],
].map(([label, key, test, when]) => [label, key, test, 15, when]));
const issues = [...new Set(targets.map((t) => t[3]))].sort((a, b) => a - b);

// ----- summarising ------------------------------------------------------------------------

function summarize(values) {
  const v = [...values].sort((a, b) => a - b);
  return { min: v[0], median: v[Math.floor(v.length / 2)], max: v[v.length - 1], runs: values };
}

const rounds = readRounds();
if (rounds.length === 0) {
  console.error(`summary.js: no round files in ${rawDir}`);
  process.exit(1);
}
const perRound = rounds.map((files) => {
  const flat = {};
  for (const [program, json] of files) {
    if (!programs[program]) continue;
    Object.assign(flat, programs[program](json));
  }
  for (const [key, , num, den, when] of ratios) {
    if (flat[num] !== undefined && flat[den] && (!when || when(flat))) flat[key] = flat[num] / flat[den];
  }
  return flat;
});
const keys = [...new Set(perRound.flatMap((r) => Object.keys(r)))].sort();
const figures = {};
for (const k of keys) {
  const vals = perRound.map((r) => r[k]).filter((v) => typeof v === 'number' && Number.isFinite(v));
  if (vals.length) figures[k] = summarize(vals);
}
const targetResults = targets.map(([label, key, test, issue, when]) => {
  const f = figures[key];
  const other = f && when ? when(figures) : null;
  const t = { issue, target: label, key, median: f ? f.median : null, met: f && !other ? test(f.median) : null };
  if (other) t.not_judged = `measured with ${other}`;
  return t;
});

const first = rounds[0];
const anyOf = (name) => first.get(name) || null;
const summary = {
  benchmark: 'scripts/bench',
  written: new Date().toISOString(),
  rounds: rounds.length,
  // not every program writes these two: the first file that does tells (--only may leave out ceiling)
  quick: Boolean((anyOf('tasks-jetstream') || {}).quick ?? (anyOf('ceiling') || {}).quick ??
    [...first.values()].map((j) => j.quick).find((x) => typeof x === 'boolean')),
  programs: [...first.keys()].sort(),
  machine: (anyOf('ceiling') || {}).machine || (anyOf('peer-bullmq') || {}).machine ||
    [...first.values()].map((j) => j.machine).find(Boolean) || null,
  versions: {
    nats_server: (anyOf('ceiling') || {}).nats_server_version,
    cnats: (anyOf('ceiling') || {}).cnats,
    ...((anyOf('peer-bullmq') || {}).versions || {}),
    ...((anyOf('peer-natsjs') || {}).versions || {}),
  },
  figures,
  ratios: Object.fromEntries(ratios.filter(([k]) => figures[k]).map(([k, label]) => [k, { label, ...figures[k] }])),
  targets: targetResults,
};
fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, 'summary.json'), JSON.stringify(summary, null, 2) + '\n');

// ----- the table --------------------------------------------------------------------------

const fmt = (v) => (v === undefined || v === null ? '-' : Math.abs(v) >= 100 ? Math.round(v).toLocaleString('en-US') : v.toFixed(2));
const row = (label, key) => {
  const f = figures[key];
  if (!f) return;
  console.log(`${label.padEnd(64)} ${fmt(f.min).padStart(10)} ${fmt(f.median).padStart(10)} ${fmt(f.max).padStart(10)}`);
};
console.log(`\nSummary over ${rounds.length} round(s)${summary.quick ? ' (--quick)' : ''}: min / median / max`);
console.log(`${'figure'.padEnd(64)} ${'min'.padStart(10)} ${'median'.padStart(10)} ${'max'.padStart(10)}`);
const section = (t) => console.log(`-- ${t}`);
section('task lifecycle, tasks/s');
row('raw cnats ceiling, batched 4x64', 'ceiling.batched');
row('raw cnats, one at a time', 'ceiling.serial');
for (const backend of ['jetstream', 'memory']) {
  for (const s of [1, 8, 64]) row(`amp-server (${backend}), ${s} slots`, `server.${backend}.tasks_per_s.slots${s}`);
  for (const s of [1, 8, 64]) row(`amp library (${backend}), ${s} slots`, `library.${backend}.tasks_per_s.slots${s}`);
}
for (const mode of ['off', 'aof']) {
  for (const c of [1, 8, 64]) row(`BullMQ ${mode}, concurrency ${c} (adding while processing)`, `bullmq.${mode}.throughput_during_c${c}`);
}
section('submit-to-result latency at 1,000 tasks/s, ms');
for (const backend of ['jetstream', 'memory']) {
  for (const p of ['p50', 'p99', 'p999']) row(`amp-server (${backend}) ${p}`, `server.${backend}.latency.${p}_ms`);
  for (const p of ['p50', 'p99']) row(`amp library (${backend}) ${p}`, `library.${backend}.latency.${p}_ms`);
}
for (const mode of ['off', 'aof']) {
  for (const p of ['p50', 'p99', 'p999']) row(`BullMQ ${mode} ${p}`, `bullmq.${mode}.latency_${p}`);
}
section('inbox and topics');
const inboxLabel = { jetstream: 'jetstream', 'jetstream.to8': 'jetstream, to 8 recipients', memory: 'memory' };
for (const backend of ['jetstream', 'jetstream.to8', 'memory']) {
  const label = inboxLabel[backend];
  row(`amp-server (${label}) inbox max msgs/s`, `server.${backend}.inbox.max_msgs_per_s`);
  for (const at of [1000, 5000, 10000]) {
    row(`amp-server (${label}) inbox achieved msgs/s at ${at}/s`, `server.${backend}.inbox.at${at}.achieved_per_s`);
    for (const p of ['p50', 'p99', 'p999']) row(`amp-server (${label}) inbox ${p} ms at ${at}/s`, `server.${backend}.inbox.at${at}.${p}_ms`);
  }
  for (const n of [100, 1000]) {
    const at = `server.${backend}.fanout${n}`;
    row(`amp-server (${backend}) fan-out 1->${n}: published events/s`, `${at}.published_per_s`);
    row(`amp-server (${backend}) fan-out 1->${n}: delivered events/s`, `${at}.delivered_per_s`);
    const rate = figures[`${at}.latency_offered_events_per_s`];
    const r = rate ? ` at ${fmt(rate.median)} events/s` : '';
    row(`amp-server (${backend}) fan-out 1->${n}: delivery p50 ms${r}`, `${at}.p50_ms`);
    row(`amp-server (${backend}) fan-out 1->${n}: delivery p99 ms${r}`, `${at}.p99_ms`);
  }
}
row('nats.js publish (window 256) + consume() + ack together, msgs/s', 'natsjs.publish_consume');
const natsRate = figures['natsjs.latency_offered_msgs_per_s'];
for (const p of ['p50', 'p99', 'p999']) {
  row(`nats.js publish -> consumer ${p} ms at ${natsRate ? fmt(natsRate.median) : '5,000'}/s`, `natsjs.latency_${p}`);
}
section('idle sessions');
for (const backend of ['jetstream', 'memory']) {
  for (const k of ['sessions', 'rss_mib_before', 'rss_mib_after', 'rss_kib_per_session', 'cpu_percent_of_core',
    'nats_cpu_percent_of_core', 'connect_per_s', 'connect_per_s_last_tenth', 'heartbeats_per_s', 'heartbeat_rtt_p99_ms']) {
    row(`amp-server (${backend}) idle sessions: ${k}`, `server.${backend}.idle.${k}`);
  }
}
section('several amp-servers on a 3-node JetStream cluster (R3), same clients');
for (const n of [1, 2, 3]) {
  const at = `cluster.servers${n}`;
  row(`${n} server(s): tasks/s`, `${at}.tasks_per_s`);
  row(`${n} server(s): tasks/s / one server's`, `${at}.tasks_ratio`);
  row(`${n} server(s): inbox msgs/s`, `${at}.messages_per_s`);
  row(`${n} server(s): inbox msgs/s / one server's`, `${at}.messages_ratio`);
  row(`${n} server(s): busiest amp-server CPU us per task`, `${at}.busiest_amp_server_cpu_us_per_task`);
  row(`${n} server(s): all amp-servers CPU us per task`, `${at}.amp_servers_cpu_us_per_task`);
  row(`${n} server(s): nats-servers CPU us per task`, `${at}.nats_servers_cpu_us_per_task`);
  row(`${n} server(s): busiest amp-server CPU us per task, paced`, `${at}.paced.busiest_amp_server_cpu_us_per_task`);
}
for (const k of ['node_gap_s', 'server_gap_s', 'submitted', 'completed_once', 'completed_twice', 'failed', 'lost']) {
  row(`failover: ${k}`, `cluster.failover.${k}`);
}
section('sink (amp-bench-sink): rows/s, and ratios within each run');
for (const target of ['postgres', 'sqlite']) {
  for (const b of [1, 16, 256]) {
    const at = `sink.${target}.batch${b}`;
    row(`sink into ${target}, batch ${b}: rows/s`, `${at}.rows_per_s`);
    row(`plain client into ${target}, batch ${b}: rows/s`, `${at}.baseline_rows_per_s`);
    row(`sink / plain client (${target}, batch ${b})`, `${at}.vs_baseline`);
    row(`raw cnats drain, fetch ${b}: msgs/s`, `${at}.raw_drain_msgs_per_s`);
    row(`sink / raw cnats drain (${target}, batch ${b})`, `${at}.vs_raw_drain`);
  }
}
row('raw cnats drain, fetch 4096 (JetStream\'s own ceiling): msgs/s', 'sink.raw_drain_ceiling_msgs_per_s');
for (const k of ['committed_to_acked', 'stored_to_acked']) {
  for (const p of ['p50_ms', 'p99_ms', 'max_ms']) row(`sink lag at 5,000 events/s, ${k.replace(/_/g, '-')} ${p}`, `sink.lag.${k}.${p}`);
}
section('ratios');
for (const [key, label] of ratios) row(label, key);
for (const issue of issues) {
  section(`targets (issue ${issue})`);
  for (const t of targetResults.filter((x) => x.issue === issue)) {
    const verdict = t.not_judged ? `not judged: ${t.not_judged}` : t.met === null ? 'not measured' : t.met ? 'met' : 'MISSED';
    console.log(`${t.target.padEnd(64)} ${fmt(t.median).padStart(10)} ${verdict.padStart(21)}`);
  }
}

// ----- the plot ---------------------------------------------------------------------------

function has(cmd) {
  try {
    execFileSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

// A compact number for a bar's label: 2.9k, 45k, 226, 18.6, 4.30, 0.58.
function compact(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (a >= 1e4) return `${Math.round(v / 1e3)}k`;
  if (a >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  if (a >= 100) return `${Math.round(v)}`;
  if (a >= 10) return v.toFixed(1);
  if (a >= 1) return v.toFixed(2);
  return String(Number(v.toPrecision(2)));
}
// A gnuplot string ("\n" stays a line break).
const q = (s) => `"${String(s).replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')}"`;
const color = { blue: '#4477aa', cyan: '#66ccee', red: '#ee6677', green: '#228833', purple: '#aa3377', grey: '#999999' };
const escapeRe = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
// The numbers N of the figures named `${before}N${after}`, ascending.
function numbersIn(before, after) {
  const re = new RegExp(`^${escapeRe(before)}(\\d+)${escapeRe(after)}$`);
  return Object.keys(figures).map((k) => re.exec(k)).filter(Boolean).map((m) => Number(m[1])).sort((a, b) => a - b);
}
const medianOf = (k) => (figures[k] ? figures[k].median : undefined);
const rateLabel = (v) => (v >= 1000 && v % 1000 === 0 ? `${v / 1000}k` : Number.isInteger(v) ? String(v) : compact(v));

// The panels, each a set of bars: categories along x, series side by side in a category.
//   { title, log, rotate (x labels; default true),
//     cats: [{ label, mark (optional: a target, drawn as a dashed line over the category) }],
//     series: [{ name (null: no legend), color, keys: [a figure's key or null, one per category] }] }
// Categories and series without a figure are left out, and a panel without any entirely.
function panelSpecs() {
  const specs = [];
  // task lifecycle (issues 6 and 14)
  const bars = [
    ['raw ceiling (batched)', 'ceiling.batched'],
    ['raw one at a time', 'ceiling.serial'],
    ['amp-server JS 64', 'server.jetstream.tasks_per_s.slots64'],
    ['amp-server JS 8', 'server.jetstream.tasks_per_s.slots8'],
    ['amp-server mem 64', 'server.memory.tasks_per_s.slots64'],
    ['amp lib JS 64', 'library.jetstream.tasks_per_s.slots64'],
    ['amp lib mem 64', 'library.memory.tasks_per_s.slots64'],
    ['BullMQ AOF c64', 'bullmq.aof.throughput_during_c64'],
    ['BullMQ off c64', 'bullmq.off.throughput_during_c64'],
    ['BullMQ AOF c8', 'bullmq.aof.throughput_during_c8'],
  ];
  specs.push({
    title: 'task lifecycle throughput (tasks/s)',
    cats: bars.map(([label]) => ({ label })),
    series: [{ name: null, color: color.blue, keys: bars.map(([, k]) => k) }],
  });
  const lat = [
    ['amp-server JS', 'server.jetstream.latency.p50_ms', 'server.jetstream.latency.p99_ms'],
    ['amp-server mem', 'server.memory.latency.p50_ms', 'server.memory.latency.p99_ms'],
    ['amp lib JS', 'library.jetstream.latency.p50_ms', 'library.jetstream.latency.p99_ms'],
    ['BullMQ AOF', 'bullmq.aof.latency_p50', 'bullmq.aof.latency_p99'],
    ['BullMQ off', 'bullmq.off.latency_p50', 'bullmq.off.latency_p99'],
  ];
  specs.push({
    title: 'submit-to-result latency at 1,000 tasks/s (ms, log scale)',
    log: true,
    cats: lat.map(([label]) => ({ label })),
    series: [
      { name: 'p50', color: color.cyan, keys: lat.map(([, p50]) => p50) },
      { name: 'p99', color: color.red, keys: lat.map(([, , p99]) => p99) },
    ],
  });

  // inbox (issues 6 and 15): one sender to 1 or K recipients; raw nats.js beside it
  const inboxes = [['server.jetstream', 'JS', 1], ['server.jetstream.to8', 'JS', 8], ['server.memory', 'mem', 1]]
    .map(([p, name, k]) => [p, name, medianOf(`${p}.inbox.recipients`) ?? k]);
  const inboxTarget = { 'server.jetstream': 20000, 'server.memory': 50000 };
  specs.push({
    title: 'inbox: max msgs/s, one sender',
    cats: [...inboxes.map(([p, name, r]) => ({ label: `amp ${name} 1->${r}`, mark: r === 1 ? inboxTarget[p] : undefined })),
      { label: 'nats.js pub+consume' }],
    series: [
      { name: 'amp-server inbox', color: color.blue, keys: [...inboxes.map(([p]) => `${p}.inbox.max_msgs_per_s`), null] },
      { name: 'raw nats.js: publish + consume()', color: color.grey, keys: [...inboxes.map(() => null), 'natsjs.publish_consume'] },
    ],
  });
  const inboxLat = [];
  for (const [p, name, r] of inboxes) {
    for (const rate of numbersIn(`${p}.inbox.at`, '.p50_ms')) {
      const got = medianOf(`${p}.inbox.at${rate}.achieved_per_s`);
      const short = got !== undefined && got < 0.95 * rate ? ` (got ${compact(got)})` : '';
      inboxLat.push({ label: `${name} 1->${r} at ${rateLabel(rate)}/s${short}`, mark: rate === 5000 ? 5 : undefined,
        p50: `${p}.inbox.at${rate}.p50_ms`, p99: `${p}.inbox.at${rate}.p99_ms` });
    }
  }
  const natsRate = medianOf('natsjs.latency_offered_msgs_per_s');
  inboxLat.push({ label: `nats.js at ${natsRate ? rateLabel(natsRate) : '5k'}/s`, p50: 'natsjs.latency_p50', p99: 'natsjs.latency_p99' });
  specs.push({
    title: 'inbox: send -> push latency by offered rate (ms, log scale)',
    log: true,
    cats: inboxLat,
    series: [
      { name: 'p50', color: color.cyan, keys: inboxLat.map((c) => c.p50) },
      { name: 'p99', color: color.red, keys: inboxLat.map((c) => c.p99) },
    ],
  });

  // topic fan-out (issues 6 and 15): one publisher, N subscribers
  const fan = [];
  for (const [p, name] of [['server.jetstream', 'JS'], ['server.memory', 'mem']]) {
    for (const n of numbersIn(`${p}.fanout`, '.delivered_per_s')) fan.push({ p, name, n, at: `${p}.fanout${n}` });
  }
  specs.push({
    title: 'topic fan-out: delivered events/s, publishes pipelined',
    cats: fan.map(({ p, name, n }) => ({ label: `${name} 1->${n}`, mark: p === 'server.jetstream' && n === 1000 ? 90000 : undefined })),
    series: [{ name: null, color: color.blue, keys: fan.map(({ at }) => `${at}.delivered_per_s`) }],
  });
  const fanLat = fan.map(({ p, name, n, at }) => {
    const rate = medianOf(`${at}.latency_offered_events_per_s`);
    return { label: `${name} 1->${n}${rate ? ` at ${rateLabel(rate)}/s` : ''}`,
      mark: p === 'server.jetstream' && n === 100 && rate === 100 ? 5 : undefined, at };
  });
  specs.push({
    title: 'topic fan-out: publish -> event latency (ms, log scale)',
    log: true,
    cats: fanLat,
    series: [
      { name: 'p50', color: color.cyan, keys: fanLat.map(({ at }) => `${at}.p50_ms`) },
      { name: 'p99', color: color.red, keys: fanLat.map(({ at }) => `${at}.p99_ms`) },
    ],
  });

  // idle sessions (issues 6 and 15)
  const idle = [['server.jetstream.idle', 'JetStream', color.blue], ['server.memory.idle', 'memory', color.green]];
  specs.push({
    title: 'idle sessions: connects/s while they are made',
    cats: idle.map(([p, name]) => {
      const n = medianOf(`${p}.sessions`);
      return { label: `${name}${n ? `, ${n.toLocaleString('en-US')} sessions` : ''}`, mark: p === 'server.jetstream.idle' ? 2000 : undefined };
    }),
    series: [
      { name: 'all sessions', color: color.blue, keys: idle.map(([p]) => `${p}.connect_per_s`) },
      { name: 'last tenth', color: color.cyan, keys: idle.map(([p]) => `${p}.connect_per_s_last_tenth`) },
    ],
  });
  const rest = [
    ['amp-server CPU %', 'cpu_percent_of_core', 5],
    ['nats-server CPU %', 'nats_cpu_percent_of_core', 5],
    ['KiB per session', 'rss_kib_per_session', 20],
    ['heartbeat p99 ms', 'heartbeat_rtt_p99_ms', 5],
  ];
  specs.push({
    title: 'idle sessions heartbeating; CPU in % of a core (log scale; dashes: JetStream targets)',
    log: true,
    rotate: false,
    cats: rest.map(([label, , mark]) => ({ label, mark })),
    series: idle.map(([p, name, c]) => ({ name, color: c, keys: rest.map(([, k]) => `${p}.${k}`) })),
  });

  // sink (issue 18): rows/s of the sink, a plain client and a raw drain; their ratios; the lag
  const targetName = { postgres: 'PostgreSQL', sqlite: 'SQLite' };
  const sink = [];
  for (const t of ['postgres', 'sqlite']) {
    for (const b of numbersIn(`sink.${t}.batch`, '.rows_per_s')) sink.push({ label: `${targetName[t]}, batch ${b}`, b, at: `sink.${t}.batch${b}` });
  }
  specs.push({
    title: 'sink: rows/s (log scale); raw drain: msgs/s, fetch = batch',
    log: true,
    cats: [...sink, { label: 'raw drain, fetch 4096' }],
    series: [
      { name: 'sink', color: color.blue, keys: [...sink.map(({ at }) => `${at}.rows_per_s`), null] },
      { name: 'plain client', color: color.cyan, keys: [...sink.map(({ at }) => `${at}.baseline_rows_per_s`), null] },
      { name: 'raw cnats drain', color: color.grey, keys: [...sink.map(({ at }) => `${at}.raw_drain_msgs_per_s`), 'sink.raw_drain_ceiling_msgs_per_s'] },
    ],
  });
  specs.push({
    title: 'sink: ratios within each run (dashes: >= 0.7x the plain client)',
    cats: sink.map(({ label, b }) => ({ label, mark: b === 256 ? 0.7 : undefined })),
    series: [
      { name: 'sink / plain client', color: color.blue, keys: sink.map(({ at }) => `${at}.vs_baseline`) },
      { name: 'sink / raw drain', color: color.grey, keys: sink.map(({ at }) => `${at}.vs_raw_drain`) },
    ],
  });
  const lagRate = medianOf('sink.lag.offered_per_s');
  const lags = [['committed -> acked', 'committed_to_acked', 100], ['stored -> acked', 'stored_to_acked']];
  specs.push({
    title: `sink lag${lagRate ? ` at ${lagRate.toLocaleString('en-US')} events/s` : ''} (ms, log scale)`,
    log: true,
    rotate: false,
    cats: lags.map(([label, , mark]) => ({ label, mark })),
    series: [['p50', color.cyan], ['p99', color.red], ['max', color.purple]].map(([p, c]) => ({
      name: p, color: c, keys: lags.map(([, k]) => `sink.lag.${k}.${p}_ms`),
    })),
  });

  // several amp-servers on a 3-node R3 cluster (issue 16)
  const servers = numbersIn('cluster.servers', '.tasks_per_s');
  specs.push({
    title: 'amp-servers on a 3-node R3 JetStream cluster',
    rotate: false,
    cats: servers.map((n) => ({ label: `${n} amp-server${n === 1 ? '' : 's'}` })),
    series: [
      { name: 'tasks/s', color: color.blue, keys: servers.map((n) => `cluster.servers${n}.tasks_per_s`) },
      { name: 'inbox msgs/s', color: color.green, keys: servers.map((n) => `cluster.servers${n}.messages_per_s`) },
    ],
  });
  return specs;
}

// A panel's bars with their x positions, or null when none of its figures was measured.
function buildPanel(spec) {
  const ok = (k) => Boolean(k && figures[k] && (!spec.log || figures[k].median > 0));
  const series = spec.series.filter((s) => s.keys.some(ok)).map((s) => ({ ...s, rows: [] }));
  const cats = spec.cats.map((c, i) => ({ ...c, i })).filter((c) => series.some((s) => ok(s.keys[c.i])));
  if (!cats.length) return null;
  const perCat = cats.map((c) => series.filter((s) => ok(s.keys[c.i])));
  const width = 0.8 / Math.max(...perCat.map((s) => s.length));
  let lo = Infinity;
  let hi = -Infinity;
  cats.forEach((c, x) => {
    perCat[x].forEach((s, j) => {
      const f = figures[s.keys[c.i]];
      const pos = x + (j - (perCat[x].length - 1) / 2) * width;
      s.rows.push([pos, f.median, f.min, f.max, compact(f.median)]);
      lo = Math.min(lo, spec.log ? Math.min(f.median, f.min > 0 ? f.min : f.median) : f.min);
      hi = Math.max(hi, f.max);
    });
    if (c.mark !== undefined) {
      lo = Math.min(lo, c.mark);
      hi = Math.max(hi, c.mark);
    }
  });
  // room above the bars for their labels and the key
  const keyed = series.length > 1 || cats.some((c) => c.mark !== undefined);
  if (spec.log) {
    lo = 10 ** Math.floor(Math.log10(lo) - 0.3); // the shortest bar stays visible
    hi = 10 ** (Math.log10(hi) + (Math.log10(hi) - Math.log10(lo)) * (keyed ? 0.35 : 0.15));
    for (const s of series) for (const r of s.rows) r[2] = Math.max(r[2], lo); // a min of 0 on a log scale
  } else {
    lo = Math.min(0, lo);
    hi = hi > 0 ? hi * (keyed ? 1.3 : 1.12) : 1;
  }
  return { ...spec, series, cats, width, lo, hi, keyed };
}

if (plot && has('gnuplot')) {
  const png = path.join(outDir, 'summary.png');
  const dat = path.join(outDir, 'summary.dat');
  const panels = panelSpecs().map(buildPanel).filter(Boolean);
  if (!panels.length) {
    // a PNG from an earlier summary in the same folder would not show these rounds
    const stale = [png, dat].filter((f) => fs.existsSync(f));
    for (const f of stale) fs.unlinkSync(f);
    console.log(`\nplot: none of the figures measured has a panel, no PNG written${stale.length ? ` (removed the earlier ${stale.map((f) => path.basename(f)).join(' and ')})` : ''}`);
  } else {
    let text = '';
    let index = 0;
    const commands = [];
    for (const p of panels) {
      const plots = [];
      for (const s of p.series) {
        text += `# ${p.title}: ${s.name || 'median'}; x median min max label\n`;
        text += s.rows.map((r) => `${r.slice(0, 4).join(' ')} ${q(r[4])}`).join('\n') + '\n\n\n';
        plots.push(`'${dat}' index ${index} using 1:2:3:4:(${p.width}) with boxerrorbars lc rgb "${s.color}" ${s.name ? `title ${q(s.name)}` : 'notitle'}`);
        plots.push(`'${dat}' index ${index} using 1:4:5 with labels offset 0,0.6 font ",7" notitle`);
        index++;
      }
      const marks = p.cats.map((c, x) => (c.mark === undefined ? null
        : `set arrow from ${x - 0.45}, first ${c.mark} to ${x + 0.45}, first ${c.mark} nohead dt 2 lw 1.5 lc rgb "black" front`))
        .filter(Boolean);
      if (marks.length) plots.push('NaN with lines dt 2 lw 1.5 lc rgb "black" title "target"');
      const rotate = p.rotate === false ? 'norotate center' : 'rotate by -30 left';
      commands.push(`set title ${q(p.title)}
unset arrow
${p.log ? 'set logscale y' : 'unset logscale y'}
set format y ${p.hi >= 10000 && (!p.log || p.lo >= 1) ? '"%.0s%c"' : '"%g"'}
set yrange [${p.lo}:${p.hi}]
set xrange [-0.6:${p.cats.length - 0.4}]
set xtics (${p.cats.map((c, x) => `${q(c.label.replace(/%/g, '%%'))} ${x}`).join(', ')}) ${rotate} nomirror
${p.keyed ? 'set key top left horizontal samplen 2 font ",8"' : 'unset key'}
${marks.join('\n')}
plot ${plots.join(', \\\n  ')}`);
    }
    fs.writeFileSync(dat, text);
    const n = panels.length;
    const cols = n <= 3 ? n : n === 4 ? 2 : n <= 9 ? 3 : 4;
    const rows = Math.ceil(n / cols);
    const script = `set terminal pngcairo noenhanced size ${640 * cols},${470 * rows + 40} font ",10"
set output '${png}'
set multiplot layout ${rows},${cols} title "amp benchmarks (${rounds.length} round(s)${summary.quick ? ', quick' : ''}; medians, error bars min-max${panels.some((p) => p.cats.some((c) => c.mark !== undefined)) ? '; dashed: targets' : ''})" font ",12"
set style fill solid 0.8 border -1
set grid ytics
${commands.join('\n')}
unset multiplot
`;
    execFileSync('gnuplot', [], { input: script });
    console.log(`\nplot: ${png} (${n} panel${n === 1 ? '' : 's'})`);
  }
}
console.log(`summary: ${path.join(outDir, 'summary.json')}`);
