#!/usr/bin/env node
'use strict';
// Peer benchmark: what presence heartbeats cost nats-server by themselves, without amp.
// N keys in a KV bucket (history 1, file storage, like amp's registry bucket), each
// rewritten with a compare-and-set (`kv.update` on the revision last written) every
// `--every` seconds, spread over the interval, while `--watchers` watches of the whole
// bucket receive every write (amp-server keeps two: the registry's sweeper view and the
// gateway's presence view). Reports nats-server's CPU over the window and the update round
// trip. A fresh nats-server per run (`nats-server -js -a 127.0.0.1 -p PORT -sd TMPDIR`).

const path = require('node:path');
const lib = require('./lib');

const USAGE = `usage: node kv_presence.js [--keys N] [--every S] [--watchers W] [--consumers C] [--window S] [--runs R] [--out FILE]
  --keys N      keys refreshed (default 10000: amp-bench-sessions' sessions)
  --every S     seconds between two writes of one key (default 10: heartbeat_s)
  --watchers W  watches of the bucket (default 2)
  --consumers C idle durable pull consumers on another stream beside (default 0; amp keeps
                one per participant on its inbox stream)
  --window S    measured seconds, after one interval of warm-up (default 30)
  --runs R      runs (default 1)
  --out FILE    results JSON (default benchmarks/results/peer_kv_presence.json)
environment: AMP_NATS_SERVER (nats-server binary; default /usr/sbin/nats-server, else PATH)`;

function parse(argv) {
  const o = { keys: 10000, every: 10, watchers: 2, consumers: 0, window: 30, runs: 1,
    out: path.join(__dirname, '..', 'results', 'peer_kv_presence.json') };
  const numeric = { '--keys': 'keys', '--every': 'every', '--watchers': 'watchers', '--consumers': 'consumers',
    '--window': 'window', '--runs': 'runs' };
  const mayBeZero = new Set(['--watchers', '--consumers']);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--help' || a === '-h') {
      console.log(USAGE);
      process.exit(0);
    }
    if (i + 1 >= argv.length) {
      console.error(`kv_presence.js: ${a} needs a value\n${USAGE}`);
      process.exit(2);
    }
    if (a === '--out') {
      o.out = argv[++i];
    } else if (numeric[a]) {
      const v = Number(argv[++i]);
      if (!(Number.isInteger(v) && v >= (mayBeZero.has(a) ? 0 : 1))) {
        console.error(`kv_presence.js: ${a} needs a ${mayBeZero.has(a) ? 'non-negative' : 'positive'} integer`);
        process.exit(2);
      }
      o[numeric[a]] = v;
    } else {
      console.error(`kv_presence.js: unknown option ${a}\n${USAGE}`);
      process.exit(2);
    }
  }
  return o;
}

const opts = parse(process.argv.slice(2));

let nats;
try {
  nats = require('nats');
} catch (err) {
  console.error(`kv_presence.js: cannot load nats (${err.message}); run \`npm ci\` in ${__dirname}`);
  process.exit(1);
}
const { connect, AckPolicy, StorageType } = nats;
const NATS = lib.findBinary('AMP_NATS_SERVER', 'nats-server', ['/usr/sbin/nats-server']);

// A value the size of an amp registry record (participant, jobs, slots, load, meta, times).
function value(i, t) {
  return JSON.stringify({
    entry: { participant: `idle${String(i).padStart(5, '0')}`, jobs: [], slots: 0, load: 0, meta: {},
      updated_at: new Date(t).toISOString(), expires_at: new Date(t + 30000).toISOString() },
    state: 'refreshed', loads: { 'gw-0123456789abcdef': 0 },
  });
}

async function startNats() {
  const dir = lib.makeTempDir('amp-peer-kv-');
  const port = await lib.freePort();
  const server = await lib.startServer({
    name: 'nats-server',
    bin: NATS,
    args: ['-js', '-a', '127.0.0.1', '-p', String(port), '-sd', dir],
    dir,
    logFile: path.join(dir, 'nats.log'),
    ready: async () => {
      const nc = await connect({ servers: `127.0.0.1:${port}`, reconnect: false });
      try {
        await (await nc.jetstreamManager()).getAccountInfo();
      } finally {
        await nc.close();
      }
    },
  });
  server.port = port;
  return server;
}

async function oneRun(run) {
  const server = await startNats();
  const nc = await connect({ servers: `127.0.0.1:${server.port}`, noAsyncTraces: true });
  if (opts.consumers > 0) {
    // Like amp's inbox stream: one subject per participant, a durable consumer on each.
    const jsm = await nc.jetstreamManager();
    await jsm.streams.add({ name: 'INBOX', subjects: ['inbox.*'], storage: StorageType.File });
    for (let i = 0; i < opts.consumers; i += 100) {
      const batch = [];
      for (let k = i; k < Math.min(opts.consumers, i + 100); k++) {
        batch.push(jsm.consumers.add('INBOX', { durable_name: `p${k}`, filter_subject: `inbox.p${k}`,
          ack_policy: AckPolicy.Explicit }));
      }
      await Promise.all(batch);
    }
  }
  const kv = await nc.jetstream().views.kv('presence', { history: 1, storage: StorageType.File });
  const revisions = new Array(opts.keys);
  for (let i = 0; i < opts.keys; i += 500) {
    const batch = [];
    for (let k = i; k < Math.min(opts.keys, i + 500); k++) {
      batch.push(kv.create(`p.idle${k}`, value(k, Date.now())).then((r) => { revisions[k] = r; }));
    }
    await Promise.all(batch);
  }
  let heard = 0;
  const watches = [];
  for (let w = 0; w < opts.watchers; w++) {
    const it = await kv.watch({ initializedFn: () => {} });
    watches.push(it);
    (async () => {
      for await (const e of it) {
        if (e) heard++;
      }
    })();
  }
  const rate = opts.keys / opts.every; // writes per second
  const latencies = [];
  let measuring = false;
  let failures = 0;
  let stop = false;
  const start = lib.now();
  let i = 0;
  const tick = () => {
    if (stop) return;
    const due = Math.floor(((lib.now() - start) * rate) / 1000) + 1;
    while (i < due) {
      const k = i++ % opts.keys;
      const t0 = lib.now();
      kv.update(`p.idle${k}`, value(k, Date.now()), revisions[k]).then((r) => {
        revisions[k] = r;
        if (measuring) latencies.push(lib.now() - t0);
      }, () => { failures++; });
    }
    setTimeout(tick, Math.max(0, start + (i * 1000) / rate - lib.now()));
  };
  tick();
  await lib.sleep(opts.every * 1000); // every key written once more: the steady state
  measuring = true;
  const heard0 = heard;
  const cpu = lib.cpuMeter(server.proc.pid);
  const t0 = lib.now();
  await lib.sleep(opts.window * 1000);
  const seconds = (lib.now() - t0) / 1000;
  const c = cpu(seconds * 1e6 / 100); // per op of 10 ms: percent of a core
  measuring = false;
  stop = true;
  const heardPerS = (heard - heard0) / seconds;
  for (const w of watches) w.stop();
  await nc.close();
  await lib.stopServer(server);
  latencies.sort((a, b) => a - b);
  const r = {
    run,
    writes_per_s: lib.round(latencies.length / seconds),
    watched_entries_per_s: lib.round(heardPerS),
    nats_cpu_percent: lib.round(c.server_cpu_us_per_op, 1),
    client_cpu_percent: lib.round(c.client_cpu_us_per_op, 1),
    update_p50_ms: lib.round(lib.percentile(latencies, 50), 2),
    update_p99_ms: lib.round(lib.percentile(latencies, 99), 2),
    failed_updates: failures,
  };
  console.log(`run ${run}: ${r.writes_per_s} CAS writes/s, ${r.watched_entries_per_s} watched entries/s: `
    + `nats-server ${r.nats_cpu_percent}% of a core, update p50 ${r.update_p50_ms} ms p99 ${r.update_p99_ms} ms`
    + (failures ? `, ${failures} updates failed` : ''));
  return r;
}

(async () => {
  const runs = [];
  for (let run = 1; run <= opts.runs; run++) runs.push(await oneRun(run));
  const rows = [
    ['writes_per_s', 'CAS writes answered', '/s', 0],
    ['watched_entries_per_s', 'entries the watches received', '/s', 0],
    ['nats_cpu_percent', 'nats-server CPU', '% core', 1],
    ['client_cpu_percent', 'this client CPU', '% core', 1],
    ['update_p50_ms', 'update round trip p50', 'ms', 2],
    ['update_p99_ms', 'update round trip p99', 'ms', 2],
  ].map(([key, label, unit, digits]) => ({ label, unit, digits, ...lib.summarize(runs.map((r) => r[key])) }));
  lib.printTable(`${opts.keys} KV keys, a compare-and-set each every ${opts.every} s, ${opts.watchers} watches, `
    + `${opts.consumers} idle consumers beside`, rows);
  lib.writeResults(opts.out, { benchmark: 'kv_presence', options: opts, machine: lib.machineInfo(), runs });
  process.exit(runs.some((r) => r.failed_updates > 0) ? 1 : 0);
})();
