#!/usr/bin/env node
'use strict';
// Peer benchmark: raw nats.js JetStream, the messaging reference, on a nats-server this
// script starts (`nats-server -js -a 127.0.0.1 -p PORT -sd TMPDIR`, a fresh one per run).
// Publish throughput to a work-queue stream (sync and pipelined), a pull consumer fetching
// and acking, consume(), publish and consume together, and end-to-end latency at a fixed
// offered load (publish -> the consumer receives). See README.md beside this file.

const path = require('node:path');
const os = require('node:os');
const lib = require('./lib');

const USAGE = `usage: node natsjs.js [--quick] [--runs N] [--out FILE]
  --quick     small counts, 1 run (well under a minute)
  --runs N    runs (default 3; --quick: 1)
  --out FILE  results JSON (default benchmarks/results/peer_natsjs.json)
environment: AMP_NATS_SERVER (nats-server binary; default /usr/sbin/nats-server, else PATH)`;

const opts = lib.parseArgs(process.argv.slice(2), {
  name: 'natsjs.js',
  defaultOut: path.join(__dirname, '..', 'results', 'peer_natsjs.json'),
  usage: USAGE,
});

let nats;
try {
  nats = require('nats');
} catch (err) {
  console.error(`natsjs.js: cannot load nats (${err.message}); run \`npm ci\` in ${__dirname}`);
  process.exit(1);
}
const { connect, AckPolicy, RetentionPolicy, StorageType } = nats;

// nats.js captures a stack trace (new Error()) for every request, to enrich a later timeout
// error; noAsyncTraces turns that off and changes nothing else. Used on the measured
// connections; 'publish (window, default options)' shows what it costs.
const CLIENT_OPTIONS = { noAsyncTraces: true };

const NATS = lib.findBinary('AMP_NATS_SERVER', 'nats-server', ['/usr/sbin/nats-server']);

const P = opts.quick
  ? {
    runs: opts.runs ?? 1,
    n: { publish_sync: 2000, publish_window: 10000, fetch1: 1000, fetch64: 4000, consume: 10000, pubsub: 10000 },
    latencyS: 2,
    latencyWarmupS: 0.5,
  }
  : {
    runs: opts.runs ?? 3,
    n: { publish_sync: 10000, publish_window: 50000, fetch1: 5000, fetch64: 20000, consume: 50000, pubsub: 50000 },
    latencyS: 10,
    latencyWarmupS: 1,
  };
P.window = 256;
P.latencyRate = 5000;

const encoder = new TextEncoder();
const decoder = new TextDecoder();
function payload(i) {
  return encoder.encode(JSON.stringify(lib.body(i)));
}
function seqOf(m) {
  return JSON.parse(decoder.decode(m.data)).seq;
}

async function startNats() {
  const dir = lib.makeTempDir('amp-peer-nats-');
  const port = await lib.freePort();
  const args = ['-js', '-a', '127.0.0.1', '-p', String(port), '-sd', dir];
  const server = await lib.startServer({
    name: 'nats-server',
    bin: NATS,
    args,
    dir,
    logFile: path.join(dir, 'nats.log'),
    ready: async () => {
      const info = await lib.tcpProbe(port, null);
      if (!info.startsWith('INFO')) throw new Error(`no INFO: ${JSON.stringify(info.slice(0, 40))}`);
      const nc = await connect({ servers: `127.0.0.1:${port}`, reconnect: false });
      try {
        const jsm = await nc.jetstreamManager();
        await jsm.getAccountInfo();
      } finally {
        await nc.close();
      }
    },
  });
  server.port = port;
  server.args = args;
  return server;
}

let streamCounter = 0;
// A fresh work-queue stream (file storage) for one measurement.
async function freshStream(jsm) {
  const name = `BENCH${++streamCounter}`;
  const subject = `bench${streamCounter}.in`;
  await jsm.streams.add({ name, subjects: [subject], retention: RetentionPolicy.Workqueue, storage: StorageType.File });
  return { name, subject };
}

async function addConsumer(jsm, stream) {
  await jsm.consumers.add(stream, { durable_name: 'w', ack_policy: AckPolicy.Explicit });
}

// Pipelined publish of n messages, at most `window` PubAcks outstanding.
function publishWindowed(js, subject, n, window, onAck) {
  return new Promise((resolve, reject) => {
    let sent = 0;
    let acked = 0;
    let failed = false;
    const pump = () => {
      while (sent - acked < window && sent < n) {
        const i = sent++;
        js.publish(subject, payload(i)).then(() => {
          acked++;
          if (onAck) onAck(i);
          if (acked === n) resolve();
          else pump();
        }, (err) => {
          if (!failed) {
            failed = true;
            reject(err);
          }
        });
      }
    };
    pump();
  });
}

async function waitEmpty(jsm, stream, what) {
  const t0 = lib.now();
  for (;;) {
    const info = await jsm.streams.info(stream);
    if (info.state.messages === 0) return lib.round(lib.now() - t0, 1);
    if (lib.now() - t0 > 5000) throw new Error(`${what}: ${info.state.messages} messages left in the stream`);
    await lib.sleep(10);
  }
}

function rate(n, ms) {
  return lib.round((n * 1000) / ms);
}

// ----- the measurements; each gets a fresh stream and deletes it afterwards.

async function publishSync(ctx, n) {
  const { jsm, js, server } = ctx;
  const s = await freshStream(jsm);
  const cpu = lib.cpuMeter(server.proc.pid);
  const t0 = lib.now();
  for (let i = 0; i < n; i++) await js.publish(s.subject, payload(i));
  const ms = lib.now() - t0;
  const c = cpu(n);
  const info = await jsm.streams.info(s.name);
  if (info.state.messages !== n) throw new Error(`publish sync: stream has ${info.state.messages}, expected ${n}`);
  await jsm.streams.delete(s.name);
  return { n, ms: lib.round(ms, 1), ops_per_s: rate(n, ms), ...c };
}

async function publishWindow(ctx, n) {
  const { jsm, js, server } = ctx;
  const s = await freshStream(jsm);
  const cpu = lib.cpuMeter(server.proc.pid);
  const t0 = lib.now();
  await publishWindowed(js, s.subject, n, P.window);
  const ms = lib.now() - t0;
  const c = cpu(n);
  const info = await jsm.streams.info(s.name);
  if (info.state.messages !== n) throw new Error(`publish window: stream has ${info.state.messages}, expected ${n}`);
  await jsm.streams.delete(s.name);
  return { n, window: P.window, ms: lib.round(ms, 1), ops_per_s: rate(n, ms), ...c };
}

// fetch(batch) + ack of every message; ack 'plain' (m.ack(): not confirmed) or 'confirmed'
// (m.ackAck(): waits for the server's reply; the acks of one batch are sent together and
// awaited together). The stream is prefilled (untimed) and must end empty.
async function fetchAck(ctx, n, batch, ackKind) {
  const { jsm, js, nc, server } = ctx;
  const s = await freshStream(jsm);
  await publishWindowed(js, s.subject, n, P.window);
  await addConsumer(jsm, s.name);
  const consumer = await js.consumers.get(s.name, 'w');
  const cpu = lib.cpuMeter(server.proc.pid);
  const t0 = lib.now();
  let got = 0;
  while (got < n) {
    // never ask for more than is left: a fetch not filled waits for its expiry
    const iter = await consumer.fetch({ max_messages: Math.min(batch, n - got), expires: 5000 });
    const confirms = [];
    let inBatch = 0;
    for await (const m of iter) {
      inBatch++;
      if (ackKind === 'plain') m.ack();
      else confirms.push(m.ackAck());
    }
    if (inBatch === 0) throw new Error(`fetch(${batch}): empty batch after ${got} of ${n}`);
    if (confirms.length) {
      const ok = await Promise.all(confirms);
      if (!ok.every(Boolean)) throw new Error(`fetch(${batch}): an ackAck was not confirmed`);
    }
    got += inBatch;
  }
  await nc.flush();
  const ms = lib.now() - t0;
  const c = cpu(n);
  const drainMs = await waitEmpty(jsm, s.name, `fetch(${batch})+${ackKind} ack`);
  await jsm.streams.delete(s.name);
  return { n, batch, ack: ackKind, ms: lib.round(ms, 1), ops_per_s: rate(n, ms), empty_after_ms: drainMs, ...c };
}

// consume() (nats.js's continuous pull, default options) with a plain ack of each message,
// on a prefilled stream.
async function consumeAck(ctx, n) {
  const { jsm, js, nc, server } = ctx;
  const s = await freshStream(jsm);
  await publishWindowed(js, s.subject, n, P.window);
  await addConsumer(jsm, s.name);
  const consumer = await js.consumers.get(s.name, 'w');
  const done = lib.deferred();
  let got = 0;
  const cpu = lib.cpuMeter(server.proc.pid);
  const t0 = lib.now();
  const msgs = await consumer.consume({
    callback: (m) => {
      m.ack();
      if (++got === n) done.resolve();
    },
  });
  await lib.withTimeout(done.promise, 60000, 'consume');
  await nc.flush();
  const ms = lib.now() - t0;
  const c = cpu(n);
  await msgs.close();
  const drainMs = await waitEmpty(jsm, s.name, 'consume');
  await jsm.streams.delete(s.name);
  return { n, ms: lib.round(ms, 1), ops_per_s: rate(n, ms), empty_after_ms: drainMs, ...c };
}

// Publish (window 256, connection 1) and consume() + ack (connection 2) at once: messages/s
// through the stream, from the first publish until the consumer has received them all.
async function pubsub(ctx, n) {
  const { jsm, js, server, js2, nc2 } = ctx;
  const s = await freshStream(jsm);
  await addConsumer(jsm, s.name);
  const consumer = await js2.consumers.get(s.name, 'w');
  const done = lib.deferred();
  let got = 0;
  const msgs = await consumer.consume({
    callback: (m) => {
      m.ack();
      if (++got === n) done.resolve();
    },
  });
  const cpu = lib.cpuMeter(server.proc.pid);
  const t0 = lib.now();
  await publishWindowed(js, s.subject, n, P.window);
  await lib.withTimeout(done.promise, 60000, 'publish+consume');
  await nc2.flush();
  const ms = lib.now() - t0;
  const c = cpu(n);
  await msgs.close();
  const drainMs = await waitEmpty(jsm, s.name, 'publish+consume');
  await jsm.streams.delete(s.name);
  return { n, window: P.window, ms: lib.round(ms, 1), ops_per_s: rate(n, ms), empty_after_ms: drainMs, ...c };
}

// End-to-end latency at a fixed offered load: js.publish() at `ratePerS` (open loop, one
// message at a time, never waiting for earlier PubAcks) on connection 1; consume() with a
// plain ack on connection 2. Latency = publish() call -> the consumer's callback; also
// publish() call -> PubAck. The first `warmupS` seconds are not counted.
async function latency(ctx, ratePerS, seconds, warmupS) {
  const { jsm, js, server, js2 } = ctx;
  const s = await freshStream(jsm);
  await addConsumer(jsm, s.name);
  const consumer = await js2.consumers.get(s.name, 'w');
  const warm = Math.round(ratePerS * warmupS);
  const n = warm + Math.round(ratePerS * seconds);
  const tPub = new Float64Array(n).fill(NaN);
  const tAck = new Float64Array(n).fill(NaN);
  const tRecv = new Float64Array(n).fill(NaN);
  const done = lib.deferred();
  let seen = 0; // receptions and PubAcks recorded, two per message
  const saw = () => {
    if (++seen === 2 * n) done.resolve();
  };
  const msgs = await consumer.consume({
    callback: (m) => {
      const t = lib.now();
      const seq = seqOf(m);
      m.ack();
      if (Number.isNaN(tRecv[seq])) {
        tRecv[seq] = t;
        saw();
      }
    },
  });
  const cpu = lib.cpuMeter(server.proc.pid);
  const loop = lib.loopDelayMeter();
  const pacing = await lib.paced(n, ratePerS, (i) => {
    const data = payload(i);
    tPub[i] = lib.now();
    js.publish(s.subject, data).then(() => {
      tAck[i] = lib.now();
      saw();
    }, (err) => done.reject(err));
  });
  await lib.withTimeout(done.promise, 60000, 'latency: waiting for the consumer and the PubAcks');
  const c = cpu(n);
  const loopDelay = loop();
  await msgs.close();
  await jsm.streams.delete(s.name);
  const e2e = lib.latencies(tPub, tRecv, warm);
  const ack = lib.latencies(tPub, tAck, warm);
  if (e2e.some(Number.isNaN) || ack.some(Number.isNaN)) throw new Error('latency: a message was not received or not acked');
  return {
    messages_counted: n - warm,
    warmup_messages: warm,
    offered_msgs_per_s: ratePerS,
    achieved_publish_rate: lib.round(((n - 1) * 1000) / pacing.elapsed_ms),
    max_publish_lag_ms: pacing.max_lag_ms,
    late_publishes: pacing.late_sends,
    e2e_p50_ms: lib.round(lib.percentile(e2e, 50), 3),
    e2e_p99_ms: lib.round(lib.percentile(e2e, 99), 3),
    e2e_p999_ms: lib.round(lib.percentile(e2e, 99.9), 3),
    e2e_max_ms: lib.round(e2e[e2e.length - 1], 3),
    puback_p50_ms: lib.round(lib.percentile(ack, 50), 3),
    puback_p99_ms: lib.round(lib.percentile(ack, 99), 3),
    puback_p999_ms: lib.round(lib.percentile(ack, 99.9), 3),
    ...c,
    ...loopDelay,
  };
}

const FIGURES = [
  ['publish_sync', 'publish (sync: await each PubAck)', 'msgs/s', (r) => r.publish_sync.ops_per_s, 0],
  ['publish_window', `publish (window ${P.window})`, 'msgs/s', (r) => r.publish_window.ops_per_s, 0],
  ['publish_window_default_options', `publish (window ${P.window}), nats.js default options (async traces on)`, 'msgs/s',
    (r) => r.publish_window_default_options.ops_per_s, 0],
  ['fetch1_ack', 'fetch(1) + ack', 'msgs/s', (r) => r.fetch1_ack.ops_per_s, 0],
  ['fetch1_ackack', 'fetch(1) + ackAck (confirmed)', 'msgs/s', (r) => r.fetch1_ackack.ops_per_s, 0],
  ['fetch64_ack', 'fetch(64) + ack', 'msgs/s', (r) => r.fetch64_ack.ops_per_s, 0],
  ['fetch64_ackack', 'fetch(64) + ackAck (batch confirmed together)', 'msgs/s', (r) => r.fetch64_ackack.ops_per_s, 0],
  ['consume_ack', 'consume() + ack', 'msgs/s', (r) => r.consume_ack.ops_per_s, 0],
  ['publish_consume', `publish (window ${P.window}) + consume() + ack, together`, 'msgs/s', (r) => r.publish_consume.ops_per_s, 0],
  ['latency_p50', `publish -> consumer p50 @${P.latencyRate}/s`, 'ms', (r) => r.latency.e2e_p50_ms, 3],
  ['latency_p99', 'publish -> consumer p99', 'ms', (r) => r.latency.e2e_p99_ms, 3],
  ['latency_p999', 'publish -> consumer p99.9', 'ms', (r) => r.latency.e2e_p999_ms, 3],
  ['puback_p50', 'publish -> PubAck p50', 'ms', (r) => r.latency.puback_p50_ms, 3],
  ['puback_p99', 'publish -> PubAck p99', 'ms', (r) => r.latency.puback_p99_ms, 3],
  ['latency_loop_delay_p99', 'node event-loop delay p99 during the latency test', 'ms', (r) => r.latency.loop_delay_p99_ms, 2],
  ['server_cpu_us_per_msg_publish_window', `nats-server CPU per message, publish (window ${P.window})`, 'us',
    (r) => r.publish_window.server_cpu_us_per_op, 1],
  ['client_cpu_us_per_msg_publish_window', `node CPU per message, publish (window ${P.window})`, 'us',
    (r) => r.publish_window.client_cpu_us_per_op, 1],
  ['server_cpu_us_per_msg_latency', `nats-server CPU per message @${P.latencyRate}/s`, 'us', (r) => r.latency.server_cpu_us_per_op, 1],
  ['client_cpu_us_per_msg_latency', `node CPU per message @${P.latencyRate}/s`, 'us', (r) => r.latency.client_cpu_us_per_op, 1],
  ['others_busy_pct', 'other load on the machine during the run (% of one CPU)', '%', (r) => r.others_busy_pct, 1],
];

async function oneRun(r) {
  const rs = lib.now();
  const server = await startNats();
  const disturbance = lib.disturbanceMeter([server.proc.pid]);
  const conns = [];
  try {
    const url = `127.0.0.1:${server.port}`;
    const nc = await connect({ servers: url, reconnect: false, ...CLIENT_OPTIONS });
    conns.push(nc);
    const nc2 = await connect({ servers: url, reconnect: false, ...CLIENT_OPTIONS });
    conns.push(nc2);
    const ncd = await connect({ servers: url, reconnect: false }); // nats.js defaults
    conns.push(ncd);
    const ctx = { server, nc, js: nc.jetstream(), jsm: await nc.jetstreamManager(), nc2, js2: nc2.jetstream() };
    // warm-up, not recorded
    await publishWindow(ctx, Math.min(5000, P.n.publish_window));
    await fetchAck(ctx, Math.min(1000, P.n.fetch64), 64, 'plain');
    const rec = { run: r };
    rec.publish_sync = await publishSync(ctx, P.n.publish_sync);
    rec.publish_window = await publishWindow(ctx, P.n.publish_window);
    rec.publish_window_default_options = await publishWindow({ ...ctx, js: ncd.jetstream() }, P.n.publish_window);
    rec.fetch1_ack = await fetchAck(ctx, P.n.fetch1, 1, 'plain');
    rec.fetch1_ackack = await fetchAck(ctx, P.n.fetch1, 1, 'confirmed');
    rec.fetch64_ack = await fetchAck(ctx, P.n.fetch64, 64, 'plain');
    rec.fetch64_ackack = await fetchAck(ctx, P.n.fetch64, 64, 'confirmed');
    rec.consume_ack = await consumeAck(ctx, P.n.consume);
    rec.publish_consume = await pubsub(ctx, P.n.pubsub);
    rec.latency = await latency(ctx, P.latencyRate, P.latencyS, P.latencyWarmupS);
    Object.assign(rec, disturbance());
    rec.seconds = lib.round((lib.now() - rs) / 1000, 1);
    return rec;
  } finally {
    for (const c of conns) await c.close().catch(() => {});
    await lib.stopServer(server);
  }
}

async function main() {
  const started = new Date();
  const t0 = lib.now();
  const machine = lib.machineInfo();
  const versions = {
    node: process.version,
    nats_js: lib.packageVersion('nats'),
    nats_server: lib.commandVersion(NATS, ['--version'], /v(\d+\.\d+\.\d+\S*)/),
    nats_server_path: NATS,
  };
  if (!versions.nats_server) throw new Error(`cannot run ${NATS} --version; install Debian's nats-server or set AMP_NATS_SERVER`);
  console.log(`nats.js ${versions.nats_js} on nats-server ${versions.nats_server}, node ${versions.node}; ` +
    `${machine.cpus} CPUs (${machine.model}), load ${machine.loadavg_before.join(' ')}`);
  console.log(`${P.runs} run(s), a fresh nats-server each${opts.quick ? ' (quick)' : ''}`);

  const runs = [];
  for (let r = 0; r < P.runs; r++) {
    const rec = await oneRun(r);
    runs.push(rec);
    console.log(`run ${r + 1}/${P.runs}: publish sync ${rec.publish_sync.ops_per_s}/s, window ${rec.publish_window.ops_per_s}/s; ` +
      `fetch(1)+ack ${rec.fetch1_ack.ops_per_s}/s, fetch(64)+ack ${rec.fetch64_ack.ops_per_s}/s, consume ${rec.consume_ack.ops_per_s}/s, ` +
      `pub+consume ${rec.publish_consume.ops_per_s}/s; latency p50 ${rec.latency.e2e_p50_ms} ms, p99 ${rec.latency.e2e_p99_ms} ms, ` +
      `p99.9 ${rec.latency.e2e_p999_ms} ms; ${rec.seconds} s, others' CPU ${rec.others_busy_pct}%`);
  }

  const figures = {};
  const rows = [];
  for (const [key, label, unit, pick, digits] of FIGURES) {
    const values = runs.map(pick);
    const s = lib.summarize(values);
    figures[key] = { label, unit, ...s, runs: values };
    rows.push({ label, unit, ...s, digits });
  }
  machine.loadavg_after = os.loadavg().map((x) => lib.round(x, 2));
  const results = {
    benchmark: 'peer_natsjs',
    started_at: started.toISOString(),
    duration_s: lib.round((lib.now() - t0) / 1000, 1),
    command: `node benchmarks/peer/natsjs.js ${process.argv.slice(2).join(' ')}`.trim(),
    quick: opts.quick,
    machine,
    versions,
    parameters: {
      runs: P.runs,
      server: 'a fresh nats-server per run: -js -a 127.0.0.1 -p PORT -sd TMPDIR',
      client: 'nats.js connections with {noAsyncTraces: true, reconnect: false}, otherwise defaults; two connections ' +
        '(publisher, consumer); publish_window_default_options uses a third connection with the defaults',
      stream: 'a fresh work-queue stream (file storage, one subject) per measurement, deleted afterwards; ' +
        'consumers: durable pull, explicit ack, server defaults otherwise',
      payload: `${lib.PAYLOAD_BYTES}-byte JSON, e.g. ${JSON.stringify(lib.body(0))}`,
      messages: P.n,
      window: P.window,
      fetch: 'consumer.fetch({max_messages: 1 or 64, expires: 5000}) on a prefilled stream; ack = m.ack() (not confirmed, ' +
        'one flush at the end), ackAck = m.ackAck() (confirmed; a batch\'s acks sent together, then awaited); the stream must end empty',
      consume: 'consumer.consume({callback}) with default options (max_messages 100) and m.ack()',
      latency: {
        how: 'js.publish() at the offered rate, open loop (timer ticks of ~1 ms, so ~5 publishes per tick), not waiting for ' +
          'PubAcks; consume() with m.ack() on the second connection; latency = from the publish() call to the consumer\'s ' +
          'callback (e2e) and to the PubAck (puback)',
        offered_msgs_per_s: P.latencyRate,
        seconds: P.latencyS,
        warmup_seconds: P.latencyWarmupS,
        percentiles: 'nearest rank, per run; min/median/max over runs',
      },
      warmup: 'each run first publishes and fetches a few thousand messages, not recorded',
      cpu: 'client = this node process (process.cpuUsage), server = /proc/PID/stat (10 ms ticks); per run, ' +
        'machine_busy_pct = busy CPU of the whole machine (/proc/stat, % of one CPU) and others_busy_pct = the part ' +
        'that was neither this process nor its nats-server: other load that disturbed the run',
    },
    figures,
    runs,
  };
  lib.writeResults(opts.out, results);
  lib.printTable(`nats.js ${versions.nats_js} JetStream on nats-server ${versions.nats_server} ` +
    `(${P.runs} run(s); min / median / max)`, rows);
  console.log(`\n${results.duration_s} s; results in ${path.relative(process.cwd(), opts.out) || opts.out}`);
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(`natsjs.js: ${err && err.stack ? err.stack : err}`);
    lib.cleanupSync();
    process.exit(1);
  },
);
