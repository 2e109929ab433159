#!/usr/bin/env node
// Reads the per-round result files that scripts/bench wrote (benchmarks/results/raw/), and
// writes the summary: benchmarks/results/summary.json (every figure as min / median / max
// over the rounds, the ratios and the targets of issues 6, 14, 16 and 18), a table on stdout, and, when
// gnuplot is there, benchmarks/results/summary.png.
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
  'peer-natsjs': (j) => extract.peer('natsjs', j),
};

// ----- ratios and targets ---------------------------------------------------------------

// [key, label, numerator, denominator]; each taken within a round.
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

// [label, key (of a figure or ratio), test, issue]: the medians over the rounds are judged.
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
].map((t) => [...t, 18]));

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
  for (const [key, , num, den] of ratios) {
    if (flat[num] !== undefined && flat[den]) flat[key] = flat[num] / flat[den];
  }
  return flat;
});
const keys = [...new Set(perRound.flatMap((r) => Object.keys(r)))].sort();
const figures = {};
for (const k of keys) {
  const vals = perRound.map((r) => r[k]).filter((v) => typeof v === 'number' && Number.isFinite(v));
  if (vals.length) figures[k] = summarize(vals);
}
const targetResults = targets.map(([label, key, test, issue]) => {
  const f = figures[key];
  return { issue, target: label, key, median: f ? f.median : null, met: f ? test(f.median) : null };
});

const first = rounds[0];
const anyOf = (name) => first.get(name) || null;
const summary = {
  benchmark: 'scripts/bench',
  written: new Date().toISOString(),
  rounds: rounds.length,
  quick: Boolean((anyOf('tasks-jetstream') || {}).quick ?? (anyOf('ceiling') || {}).quick),
  programs: [...first.keys()].sort(),
  machine: (anyOf('ceiling') || {}).machine || (anyOf('peer-bullmq') || {}).machine || null,
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
for (const p of ['p50', 'p99', 'p999']) row(`nats.js publish -> consumer ${p} ms at 5,000/s`, `natsjs.latency_${p}`);
section('idle sessions');
for (const backend of ['jetstream', 'memory']) {
  for (const k of ['sessions', 'rss_mib_before', 'rss_mib_after', 'rss_kib_per_session', 'cpu_percent_of_core',
    'nats_cpu_percent_of_core', 'connect_per_s', 'heartbeats_per_s', 'heartbeat_rtt_p99_ms']) {
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
for (const issue of [6, 14, 16, 18]) {
  section(`targets (issue ${issue})`);
  for (const t of targetResults.filter((x) => x.issue === issue)) {
    const verdict = t.met === null ? 'not measured' : t.met ? 'met' : 'MISSED';
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

if (plot && has('gnuplot')) {
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
  ].filter(([, k]) => figures[k]);
  const lat = [
    ['amp-server JS', 'server.jetstream.latency'],
    ['amp-server mem', 'server.memory.latency'],
    ['amp lib JS', 'library.jetstream.latency'],
  ].filter(([, k]) => figures[`${k}.p50_ms`]);
  const latPeer = [['BullMQ AOF', 'bullmq.aof.latency'], ['BullMQ off', 'bullmq.off.latency']].filter(([, k]) => figures[`${k}_p50`]);
  const dat = path.join(outDir, 'summary.dat');
  let text = '# throughput: x label median min max\n';
  bars.forEach(([label, k], i) => {
    text += `${i} "${label}" ${figures[k].median} ${figures[k].min} ${figures[k].max}\n`;
  });
  text += '\n\n# latency: label p50 p99\n';
  for (const [label, k] of lat) text += `"${label}" ${figures[`${k}.p50_ms`].median} ${figures[`${k}.p99_ms`].median}\n`;
  for (const [label, k] of latPeer) text += `"${label}" ${figures[`${k}_p50`].median} ${figures[`${k}_p99`].median}\n`;
  fs.writeFileSync(dat, text);
  const png = path.join(outDir, 'summary.png');
  // A panel for each kind of figure measured (a subset from --only may have neither).
  const panels = [];
  if (bars.length) {
    panels.push(`set title "task lifecycle throughput (tasks/s)"
set yrange [0:*]
set xrange [-0.6:${bars.length - 0.4}]
plot '${dat}' index 0 using 1:3:4:5:(0.7):xtic(2) with boxerrorbars lc rgb "#4477aa" notitle`);
  }
  if (lat.length + latPeer.length) {
    panels.push(`set title "submit-to-result latency at 1,000 tasks/s (ms), log scale"
set autoscale x
set logscale y
set yrange [0.1:*]
set style data histograms
set style histogram clustered gap 1
set boxwidth 0.9 relative
plot '${dat}' index 1 using 2:xtic(1) title "p50" lc rgb "#66ccee", '' index 1 using 3 title "p99" lc rgb "#ee6677"`);
  }
  const script = `
set terminal pngcairo size ${700 * Math.max(1, panels.length)},560 font ",10"
set output '${png}'
set multiplot layout 1,${Math.max(1, panels.length)} title "amp benchmarks (${rounds.length} round(s)${summary.quick ? ', quick' : ''}; medians, error bars min-max)"
set style fill solid 0.8 border -1
set grid ytics
set xtics rotate by -35 left nomirror
${panels.join('\n')}
unset multiplot
`;
  if (panels.length) {
    execFileSync('gnuplot', [], { input: script });
    console.log(`\nplot: ${png}`);
  } else {
    console.log('\nplot: no task figures among those measured, nothing plotted');
  }
}
console.log(`summary: ${path.join(outDir, 'summary.json')}`);
