#!/usr/bin/env node
'use strict';
// Peer benchmark: BullMQ on a redis-server this script starts (free loopback port, temp
// dir), doing amp's task lifecycle: add a job (128-byte JSON body, attempts: 3), process it
// with a no-op handler that returns a small result, complete. Two Redis persistence modes,
// alternated run by run: off (--save "" --appendonly no) and aof (--save ""
// --appendonly yes --appendfsync everysec). See README.md beside this file.

const path = require('node:path');
const lib = require('./lib');

const USAGE = `usage: node bullmq.js [--quick] [--runs N] [--out FILE]
  --quick     small counts, 1 run per mode (well under a minute)
  --runs N    runs per persistence mode (default 3; --quick: 1)
  --out FILE  results JSON (default benchmarks/results/peer_bullmq.json)
environment: AMP_REDIS_SERVER (redis-server binary; default from PATH)`;

const opts = lib.parseArgs(process.argv.slice(2), {
  name: 'bullmq.js',
  defaultOut: path.join(__dirname, '..', 'results', 'peer_bullmq.json'),
  usage: USAGE,
});

let bullmq;
try {
  bullmq = require('bullmq');
} catch (err) {
  console.error(`bullmq.js: cannot load bullmq (${err.message}); run \`npm ci\` in ${__dirname}`);
  process.exit(1);
}
const { Queue, Worker, QueueEvents } = bullmq;

const REDIS = lib.findBinary('AMP_REDIS_SERVER', 'redis-server', ['/usr/bin/redis-server']);

const P = opts.quick
  ? { runs: opts.runs ?? 1, warmupJobs: 500, jobs: { c1: 2000, c8: 4000, c64: 4000 }, latencyS: 3, latencyWarmupS: 0.5 }
  : { runs: opts.runs ?? 3, warmupJobs: 2000, jobs: { c1: 10000, c8: 20000, c64: 20000 }, latencyS: 10, latencyWarmupS: 1 };
P.addBulkChunk = 1000;
P.latencyRate = 1000;
P.latencyConcurrency = 8;
P.attempts = 3;
P.modes = ['off', 'aof'];

const MODE_ARGS = {
  off: ['--save', '', '--appendonly', 'no'],
  aof: ['--save', '', '--appendonly', 'yes', '--appendfsync', 'everysec'],
};

async function startRedis(mode) {
  const dir = lib.makeTempDir(`amp-peer-redis-${mode}-`);
  const port = await lib.freePort();
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--daemonize', 'no',
    '--logfile', '', ...MODE_ARGS[mode]];
  const server = await lib.startServer({
    name: `redis-server (${mode})`,
    bin: REDIS,
    args,
    dir,
    logFile: path.join(dir, 'redis.log'),
    ready: async () => {
      const reply = await lib.tcpProbe(port, 'PING\r\n');
      if (!reply.startsWith('+PONG')) throw new Error(`PING answered ${JSON.stringify(reply)}`);
    },
  });
  server.port = port;
  server.args = args;
  return server;
}

// One command over a plain socket; resolves with the bulk-string reply (INFO's text).
function redisCommand(port, command) {
  return new Promise((resolve, reject) => {
    const sock = require('node:net').connect({ host: '127.0.0.1', port });
    let buf = Buffer.alloc(0);
    const t = setTimeout(() => {
      sock.destroy();
      reject(new Error(`${command}: timed out`));
    }, 5000);
    sock.on('connect', () => sock.write(`${command}\r\n`));
    sock.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      const eol = buf.indexOf('\r\n');
      if (eol < 0) return;
      if (buf[0] !== 0x24) { // not a bulk string: '$'
        clearTimeout(t);
        sock.destroy();
        resolve(buf.toString());
        return;
      }
      const len = Number(buf.subarray(1, eol).toString());
      if (buf.length >= eol + 2 + len) {
        clearTimeout(t);
        sock.destroy();
        resolve(buf.subarray(eol + 2, eol + 2 + len).toString());
      }
    });
    sock.on('error', (err) => {
      clearTimeout(t);
      reject(err);
    });
  });
}

async function redisStats(server) {
  const text = await redisCommand(server.port, 'INFO');
  const info = {};
  for (const line of text.split('\r\n')) {
    const i = line.indexOf(':');
    if (i > 0) info[line.slice(0, i)] = line.slice(i + 1);
  }
  const num = (k) => (info[k] === undefined ? null : Number(info[k]));
  return {
    used_memory_mib: lib.round(num('used_memory') / 2 ** 20, 1),
    aof_enabled: num('aof_enabled'),
    aof_rewrites: num('aof_rewrites'),
    aof_current_size_mib: info.aof_current_size === undefined ? null : lib.round(num('aof_current_size') / 2 ** 20, 1),
    rdb_saves: num('rdb_saves'),
    total_commands_processed: num('total_commands_processed'),
  };
}

function connectionOf(server) {
  // maxRetriesPerRequest: null is what BullMQ requires of a Worker's connection.
  return { host: '127.0.0.1', port: server.port, maxRetriesPerRequest: null };
}

const handler = async (job) => ({ ok: true, seq: job.data.seq });

// Throughput of `n` jobs through a Worker with `concurrency` slots, the jobs added with
// queue.addBulk in chunks either
//   'before': all added first (timed on its own), then the worker is started and timed
//             from worker.run() until its 'completed' event has fired for all n;
//   'during': the worker is started first, then the chunks are added one after another
//             while it runs, timed from the first addBulk until the last 'completed'.
async function throughput(server, qname, n, concurrency, how) {
  const connection = connectionOf(server);
  const queue = new Queue(qname, { connection });
  await queue.waitUntilReady();
  const jobs = [];
  for (let i = 0; i < n; i++) jobs.push({ name: 'task', data: lib.body(i), opts: { attempts: P.attempts } });
  const addAll = async () => {
    for (let i = 0; i < n; i += P.addBulkChunk) await queue.addBulk(jobs.slice(i, i + P.addBulkChunk));
  };

  const worker = new Worker(qname, handler, { connection, concurrency, autorun: false });
  let completed = 0;
  const done = lib.deferred();
  worker.on('completed', () => {
    if (++completed === n) done.resolve();
  });
  worker.on('failed', (job, err) => done.reject(new Error(`job ${job && job.id} failed: ${err && err.message}`)));
  worker.on('error', (err) => done.reject(err));
  await worker.waitUntilReady();

  const r = { jobs: n, concurrency, added: how };
  if (how === 'before') {
    const addCpu = lib.cpuMeter(server.proc.pid);
    const a0 = lib.now();
    await addAll();
    const addMs = lib.now() - a0;
    const addCpuPer = addCpu(n);
    Object.assign(r, {
      add_ms: lib.round(addMs, 1),
      add_jobs_per_s: lib.round((n * 1000) / addMs),
      add_client_cpu_us_per_job: addCpuPer.client_cpu_us_per_op,
      add_redis_cpu_us_per_job: addCpuPer.server_cpu_us_per_op,
    });
  }
  const cpu = lib.cpuMeter(server.proc.pid);
  const t0 = lib.now();
  worker.run().catch((err) => done.reject(err));
  if (how === 'during') {
    addAll().then(() => {
      r.add_ms = lib.round(lib.now() - t0, 1);
    }, (err) => done.reject(err));
  }
  await lib.withTimeout(done.promise, 120000 + n * 10, `throughput c=${concurrency} (${how})`);
  const ms = lib.now() - t0;
  const cpuPer = cpu(n);
  await worker.close();
  const counts = await queue.getJobCounts('completed', 'failed', 'wait', 'active', 'delayed');
  await queue.close();
  if (counts.completed !== n || counts.failed !== 0) {
    throw new Error(`throughput c=${concurrency} (${how}): expected ${n} completed, got ${JSON.stringify(counts)}`);
  }
  Object.assign(r, {
    process_ms: lib.round(ms, 1),
    jobs_per_s: lib.round((n * 1000) / ms),
    client_cpu_us_per_job: cpuPer.client_cpu_us_per_op,
    redis_cpu_us_per_job: cpuPer.server_cpu_us_per_op,
  });
  if (how === 'before') r.add_and_process_jobs_per_s = lib.round((n * 1000) / (ms + r.add_ms));
  return r;
}

// Latency at a fixed offered load: queue.add() one job at a time at `rate` jobs/s (open
// loop: an add is never held back by an earlier one), a worker with `concurrency` slots in
// the same process, and a QueueEvents listener. For each job: add() call -> the
// QueueEvents 'completed' event (the submitter learns the result; primary figure), and
// add() call -> the worker's own 'completed' event (secondary). The first `warmup`
// seconds of jobs are not counted.
async function latency(server, qname, rate, seconds, warmupS, concurrency) {
  const connection = connectionOf(server);
  const queue = new Queue(qname, { connection });
  const events = new QueueEvents(qname, { connection });
  const worker = new Worker(qname, handler, { connection, concurrency });
  await Promise.all([queue.waitUntilReady(), events.waitUntilReady(), worker.waitUntilReady()]);

  const warm = Math.round(rate * warmupS);
  const n = warm + Math.round(rate * seconds);
  const tAdd = new Float64Array(n).fill(NaN);
  const tWorker = new Float64Array(n).fill(NaN);
  const tEvent = new Float64Array(n).fill(NaN);
  let seen = 0; // completion times recorded, two per job
  const done = lib.deferred();
  const saw = () => {
    if (++seen === 2 * n) done.resolve();
  };
  worker.on('completed', (job) => {
    const seq = job.data.seq;
    if (Number.isNaN(tWorker[seq])) {
      tWorker[seq] = lib.now();
      saw();
    }
  });
  worker.on('failed', (job, err) => done.reject(new Error(`job failed: ${err && err.message}`)));
  worker.on('error', (err) => done.reject(err));
  events.on('completed', ({ returnvalue }) => {
    const seq = returnvalue && returnvalue.seq;
    if (Number.isInteger(seq) && seq < n && Number.isNaN(tEvent[seq])) {
      tEvent[seq] = lib.now();
      saw();
    }
  });
  events.on('error', (err) => done.reject(err));

  const cpu = lib.cpuMeter(server.proc.pid);
  const loop = lib.loopDelayMeter();
  const pacing = await lib.paced(n, rate, (i) => {
    const data = lib.body(i);
    tAdd[i] = lib.now();
    queue.add('task', data, { attempts: P.attempts }).catch((err) => done.reject(err));
  });
  await lib.withTimeout(done.promise, 60000, 'latency: waiting for completed events');
  const cpuPer = cpu(n);
  const loopDelay = loop();
  await worker.close();
  await events.close();
  await queue.close();

  const ev = lib.latencies(tAdd, tEvent, warm);
  const wk = lib.latencies(tAdd, tWorker, warm);
  if (ev.some(Number.isNaN) || wk.some(Number.isNaN)) throw new Error('latency: a job has no completion time');
  return {
    jobs_counted: n - warm,
    warmup_jobs: warm,
    offered_jobs_per_s: rate,
    achieved_add_rate: lib.round(((n - 1) * 1000) / pacing.elapsed_ms),
    max_add_lag_ms: pacing.max_lag_ms,
    late_adds: pacing.late_sends,
    events_p50_ms: lib.round(lib.percentile(ev, 50), 3),
    events_p99_ms: lib.round(lib.percentile(ev, 99), 3),
    events_p999_ms: lib.round(lib.percentile(ev, 99.9), 3),
    events_max_ms: lib.round(ev[ev.length - 1], 3),
    worker_p50_ms: lib.round(lib.percentile(wk, 50), 3),
    worker_p99_ms: lib.round(lib.percentile(wk, 99), 3),
    client_cpu_us_per_job: cpuPer.client_cpu_us_per_op,
    redis_cpu_us_per_job: cpuPer.server_cpu_us_per_op,
    ...loopDelay,
  };
}

// Figures: key -> [label, unit, pick(run record), digits]
const FIGURES = [];
for (const mode of P.modes) {
  const f = (key, label, unit, pick, digits) => FIGURES.push([`${mode}.${key}`, `${mode}: ${label}`, unit, pick, digits, mode]);
  for (const c of [1, 8, 64]) {
    f(`throughput_c${c}`, `throughput c=${c}, addBulk before (process only)`, 'jobs/s', (r) => r.throughput[`before_c${c}`].jobs_per_s, 0);
  }
  for (const c of [1, 8, 64]) {
    f(`throughput_add_and_process_c${c}`, `throughput c=${c}, addBulk before (add + process)`, 'jobs/s',
      (r) => r.throughput[`before_c${c}`].add_and_process_jobs_per_s, 0);
  }
  for (const c of [1, 8, 64]) {
    f(`throughput_during_c${c}`, `throughput c=${c}, addBulk during`, 'jobs/s', (r) => r.throughput[`during_c${c}`].jobs_per_s, 0);
  }
  f('add_bulk', `addBulk alone (chunks of ${P.addBulkChunk})`, 'jobs/s', (r) => r.throughput.before_c8.add_jobs_per_s, 0);
  f('latency_p50', `add -> QueueEvents completed p50 @${P.latencyRate}/s c=${P.latencyConcurrency}`, 'ms', (r) => r.latency.events_p50_ms, 2);
  f('latency_p99', 'add -> QueueEvents completed p99', 'ms', (r) => r.latency.events_p99_ms, 2);
  f('latency_p999', 'add -> QueueEvents completed p99.9', 'ms', (r) => r.latency.events_p999_ms, 2);
  f('worker_latency_p50', 'add -> worker completed p50', 'ms', (r) => r.latency.worker_p50_ms, 2);
  f('worker_latency_p99', 'add -> worker completed p99', 'ms', (r) => r.latency.worker_p99_ms, 2);
  f('latency_loop_delay_p99', 'node event-loop delay p99 during the latency test', 'ms', (r) => r.latency.loop_delay_p99_ms, 2);
  f('redis_cpu_us_per_job_c8', 'redis-server CPU per job (c=8 processing)', 'us', (r) => r.throughput.before_c8.redis_cpu_us_per_job, 1);
  f('client_cpu_us_per_job_c8', 'node CPU per job (c=8 processing)', 'us', (r) => r.throughput.before_c8.client_cpu_us_per_job, 1);
  f('others_busy_pct', "other load on the machine during the run (% of one CPU)", '%', (r) => r.others_busy_pct, 1);
}

async function main() {
  const started = new Date();
  const t0 = lib.now();
  const machine = lib.machineInfo();
  const versions = {
    node: process.version,
    bullmq: lib.packageVersion('bullmq'),
    ioredis: lib.packageVersion('ioredis'),
    redis_server: lib.commandVersion(REDIS, ['--version'], /v=(\S+)/),
    redis_server_path: REDIS,
  };
  if (!versions.redis_server) throw new Error(`cannot run ${REDIS} --version; install Debian's redis-server or set AMP_REDIS_SERVER`);
  console.log(`bullmq ${versions.bullmq} on redis-server ${versions.redis_server}, node ${versions.node}; ` +
    `${machine.cpus} CPUs (${machine.model}), load ${machine.loadavg_before.join(' ')}`);
  console.log(`${P.runs} run(s) per mode, modes alternated ${P.modes.join(', ')}, ...${opts.quick ? ' (quick)' : ''}`);

  const runs = [];
  for (let r = 0; r < P.runs; r++) {
    for (const mode of P.modes) {
      const rs = lib.now();
      const server = await startRedis(mode);
      const disturbance = lib.disturbanceMeter([server.proc.pid]);
      try {
        const tag = `r${r}-${mode}`;
        await throughput(server, `warmup-${tag}`, P.warmupJobs, 8, 'before'); // not recorded
        const throughputs = {};
        for (const how of ['before', 'during']) {
          for (const c of [1, 8, 64]) {
            throughputs[`${how}_c${c}`] = await throughput(server, `thr-${how}-c${c}-${tag}`, P.jobs[`c${c}`], c, how);
          }
        }
        const lat = await latency(server, `lat-${tag}`, P.latencyRate, P.latencyS, P.latencyWarmupS, P.latencyConcurrency);
        const record = {
          run: r,
          mode,
          throughput: throughputs,
          latency: lat,
          redis: await redisStats(server),
          ...disturbance(),
          seconds: lib.round((lib.now() - rs) / 1000, 1),
        };
        runs.push(record);
        console.log(`run ${r + 1}/${P.runs} ${mode.padEnd(3)}: ` +
          `before: c1 ${throughputs.before_c1.jobs_per_s}/s, c8 ${throughputs.before_c8.jobs_per_s}/s, ` +
          `c64 ${throughputs.before_c64.jobs_per_s}/s (addBulk ${throughputs.before_c8.add_jobs_per_s}/s); ` +
          `during: c1 ${throughputs.during_c1.jobs_per_s}/s, c8 ${throughputs.during_c8.jobs_per_s}/s, ` +
          `c64 ${throughputs.during_c64.jobs_per_s}/s; latency p50 ${lat.events_p50_ms} ms, p99 ${lat.events_p99_ms} ms ` +
          `(worker p50 ${lat.worker_p50_ms}, p99 ${lat.worker_p99_ms}); ${record.seconds} s, ` +
          `others' CPU ${record.others_busy_pct}%${mode === 'aof' ? `, AOF rewrites ${record.redis.aof_rewrites}` : ''}`);
      } finally {
        await lib.stopServer(server);
      }
    }
  }

  const figures = {};
  const rows = [];
  for (const [key, label, unit, pick, digits, mode] of FIGURES) {
    const values = runs.filter((x) => x.mode === mode).map(pick);
    const s = lib.summarize(values);
    figures[key] = { label, unit, ...s, runs: values };
    rows.push({ label, unit, ...s, digits });
  }
  machine.loadavg_after = require('node:os').loadavg().map((x) => lib.round(x, 2));
  const results = {
    benchmark: 'peer_bullmq',
    started_at: started.toISOString(),
    duration_s: lib.round((lib.now() - t0) / 1000, 1),
    command: `node benchmarks/peer/bullmq.js ${process.argv.slice(2).join(' ')}`.trim(),
    quick: opts.quick,
    machine,
    versions,
    parameters: {
      runs_per_mode: P.runs,
      mode_order: 'alternating per run: off, aof, off, aof, ...; a fresh redis-server (new temp dir) for every run of every mode',
      redis_args_common: ['--port', 'PORT', '--bind', '127.0.0.1', '--dir', 'TMPDIR', '--daemonize', 'no', '--logfile', ''],
      redis_args: MODE_ARGS,
      payload: `${lib.PAYLOAD_BYTES}-byte JSON object as job data, e.g. ${JSON.stringify(lib.body(0))}`,
      job_options: { attempts: P.attempts },
      completed_jobs_kept: 'yes (BullMQ default: no removeOnComplete)',
      handler: 'async (job) => ({ ok: true, seq: job.data.seq })',
      throughput: {
        before: `all jobs added with queue.addBulk (chunks of ${P.addBulkChunk}, awaited one after another) before the ` +
          "worker starts, timed on their own (add_*); then Worker(concurrency) is run and timed from worker.run() until its " +
          "'completed' event fired for every job (jobs_per_s); add_and_process_jobs_per_s = jobs / (add time + process time)",
        during: 'Worker(concurrency) started first, then the same addBulk chunks added while it runs; timed from the first ' +
          "addBulk until the worker's 'completed' event fired for every job",
        jobs: P.jobs,
        warmup: `${P.warmupJobs} jobs at concurrency 8 on each new server, not recorded`,
      },
      latency: {
        how: 'queue.add() of one job at a time, open loop at the offered rate (timer ticks of ~1 ms); a Worker with ' +
          `concurrency ${P.latencyConcurrency} and a QueueEvents listener in the same process; latency = from the add() call ` +
          "to the QueueEvents 'completed' event (primary), and to the worker's 'completed' event (worker_*)",
        offered_jobs_per_s: P.latencyRate,
        concurrency: P.latencyConcurrency,
        seconds: P.latencyS,
        warmup_seconds: P.latencyWarmupS,
        percentiles: 'nearest rank, per run; min/median/max over runs',
      },
      cpu: 'client = this node process (process.cpuUsage), redis = /proc/PID/stat (10 ms ticks); per run, ' +
        'machine_busy_pct = busy CPU of the whole machine (/proc/stat, % of one CPU) and others_busy_pct = the part ' +
        'that was neither this process nor its redis-server: other load that disturbed the run',
      redis_info: 'per run, from INFO at its end: used memory, AOF size and rewrites (auto-aof-rewrite at its defaults)',
    },
    figures,
    runs,
  };
  lib.writeResults(opts.out, results);
  lib.printTable(`BullMQ ${versions.bullmq} on redis-server ${versions.redis_server} ` +
    `(${P.runs} run(s) per mode; min / median / max)`, rows);
  console.log(`\n${results.duration_s} s; results in ${path.relative(process.cwd(), opts.out) || opts.out}`);
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(`bullmq.js: ${err && err.stack ? err.stack : err}`);
    lib.cleanupSync();
    process.exit(1);
  },
);
