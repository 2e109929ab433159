'use strict';
// Shared pieces of the peer benchmarks: servers started as child processes (always killed
// at exit, also on failure or a signal, with their temp dirs removed), machine and version
// facts, statistics, option parsing, the JSON results file and the summary table.

const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { performance, monitorEventLoopDelay } = require('node:perf_hooks');

const { freePort } = require('../../tests/e2e/lib/ports');

const now = () => performance.now(); // milliseconds, fractional

// ---------------------------------------------------------------------------------------
// Cleanup of everything this process started.

const servers = new Set(); // started servers not yet stopped
const tempDirs = new Set();

function killQuietly(pid, signal, group = false) {
  try {
    process.kill(group ? -pid : pid, signal);
  } catch {
    // already gone
  }
}

function cleanupSync() {
  for (const s of servers) {
    if (s.proc.exitCode === null && s.proc.signalCode === null) killQuietly(s.proc.pid, 'SIGKILL');
    if (s.watchdog) killQuietly(s.watchdog.pid, 'SIGKILL', true);
  }
  servers.clear();
  for (const dir of tempDirs) fs.rmSync(dir, { recursive: true, force: true });
  tempDirs.clear();
}

process.on('exit', cleanupSync);
for (const [sig, num] of [['SIGINT', 2], ['SIGTERM', 15], ['SIGHUP', 1]]) {
  process.on(sig, () => {
    console.error(`\ninterrupted by ${sig}; stopping the servers`);
    cleanupSync();
    process.exit(128 + num);
  });
}
process.on('uncaughtException', (err) => {
  console.error(err);
  cleanupSync();
  process.exit(1);
});
process.on('unhandledRejection', (err) => {
  console.error(err);
  cleanupSync();
  process.exit(1);
});

function makeTempDir(prefix) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  tempDirs.add(dir);
  return dir;
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function logTail(file, lines = 20) {
  try {
    return fs.readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

// Starts `bin args` with its output in `logFile` (inside `dir`, a temp dir owned by the
// server) and a watchdog: a detached shell that kills the server and removes `dir` if this
// process dies without cleaning up (SIGKILL). `ready(server)` resolves once it serves.
async function startServer({ name, bin, args, dir, logFile, ready, timeoutMs = 15000 }) {
  const out = fs.openSync(logFile, 'a');
  const proc = spawn(bin, args, { stdio: ['ignore', out, out] });
  fs.closeSync(out);
  const server = { name, proc, dir, logFile, watchdog: null, exited: null };
  servers.add(server);
  server.exited = new Promise((resolve) => proc.once('exit', (code, sig) => resolve({ code, sig })));
  proc.once('error', (err) => {
    server.spawnError = err;
  });
  if (proc.pid) {
    server.watchdog = spawn(
      'sh',
      ['-c', 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; kill -9 "$2" 2>/dev/null; rm -rf "$3"',
        'amp-peer-watchdog', String(process.pid), String(proc.pid), dir],
      { detached: true, stdio: 'ignore' });
    server.watchdog.unref();
  }
  const deadline = Date.now() + timeoutMs;
  let lastErr = null;
  for (;;) {
    if (server.spawnError) throw new Error(`${name}: cannot start ${bin}: ${server.spawnError.message}`);
    if (proc.exitCode !== null || proc.signalCode !== null) {
      throw new Error(`${name} exited at start (${proc.exitCode ?? proc.signalCode}); log:\n${logTail(logFile)}`);
    }
    try {
      await ready(server);
      return server;
    } catch (err) {
      lastErr = err;
    }
    if (Date.now() > deadline) {
      throw new Error(`${name} not ready after ${timeoutMs} ms (${lastErr && lastErr.message}); log:\n${logTail(logFile)}`);
    }
    await sleep(50);
  }
}

// SIGTERM, then SIGKILL after `graceMs`; removes the server's temp dir.
async function stopServer(server, graceMs = 5000) {
  if (!servers.has(server)) return;
  const { proc } = server;
  if (proc.exitCode === null && proc.signalCode === null) {
    killQuietly(proc.pid, 'SIGTERM');
    const t = setTimeout(() => killQuietly(proc.pid, 'SIGKILL'), graceMs);
    await server.exited;
    clearTimeout(t);
  }
  if (server.watchdog) killQuietly(server.watchdog.pid, 'SIGKILL', true);
  servers.delete(server);
  fs.rmSync(server.dir, { recursive: true, force: true });
  tempDirs.delete(server.dir);
}

// One TCP connection that sends `payload` and resolves with the first bytes received.
function tcpProbe(port, payload, timeoutMs = 1000) {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host: '127.0.0.1', port });
    let data = '';
    const t = setTimeout(() => {
      sock.destroy();
      reject(new Error('probe timed out'));
    }, timeoutMs);
    sock.on('connect', () => {
      if (payload) sock.write(payload);
    });
    sock.on('data', (chunk) => {
      data += chunk.toString();
      clearTimeout(t);
      sock.destroy();
      resolve(data);
    });
    sock.on('error', (err) => {
      clearTimeout(t);
      reject(err);
    });
  });
}

// CPU time (user + system) of a process, in microseconds, from /proc (10 ms ticks).
const CLK_TCK = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();

function procCpuUs(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1e6) / CLK_TCK; // utime, stime
  } catch {
    return NaN;
  }
}

function selfCpuUs() {
  const u = process.cpuUsage();
  return u.user + u.system;
}

// Measures CPU of this process and of a server across `fn`, per operation.
function cpuMeter(serverPid) {
  const c0 = selfCpuUs();
  const s0 = serverPid ? procCpuUs(serverPid) : NaN;
  return (ops) => ({
    client_cpu_us_per_op: round((selfCpuUs() - c0) / ops, 2),
    server_cpu_us_per_op: round((procCpuUs(serverPid) - s0) / ops, 2),
  });
}

// Busy CPU of the whole machine across a stretch of time (/proc/stat), and how much of it
// was neither this process nor the given server pids: the other load that disturbed it.
// Both in percent of one CPU (so up to 100 x CPUs).
function machineCpu() {
  try {
    const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
    const idle = f[3] + (f[4] || 0); // idle + iowait
    const total = f.slice(0, 8).reduce((a, b) => a + b, 0); // up to steal; guest is inside user
    return { busyUs: ((total - idle) * 1e6) / CLK_TCK, wallMs: now() };
  } catch {
    return null;
  }
}

function disturbanceMeter(pids) {
  const m0 = machineCpu();
  const own0 = selfCpuUs() + pids.reduce((a, p) => a + procCpuUs(p), 0);
  return () => {
    const m1 = machineCpu();
    if (!m0 || !m1) return { machine_busy_pct: null, others_busy_pct: null };
    const own = selfCpuUs() + pids.reduce((a, p) => a + procCpuUs(p), 0) - own0;
    const wallUs = (m1.wallMs - m0.wallMs) * 1000;
    const busy = m1.busyUs - m0.busyUs;
    return {
      machine_busy_pct: round((100 * busy) / wallUs, 1),
      others_busy_pct: round(Math.max(0, (100 * (busy - own)) / wallUs), 1),
    };
  };
}

// ---------------------------------------------------------------------------------------
// Facts about the machine and the software.

function machineInfo() {
  let model = os.cpus()[0] ? os.cpus()[0].model : 'unknown';
  try {
    const m = fs.readFileSync('/proc/cpuinfo', 'utf8').match(/^model name\s*:\s*(.*)$/m);
    if (m) model = m[1].trim();
  } catch {
    // keep os.cpus()
  }
  return {
    cpus: os.cpus().length,
    model,
    mem_total_gib: round(os.totalmem() / 2 ** 30, 1),
    kernel: `${os.type()} ${os.release()}`,
    hostname: os.hostname(),
    loadavg_before: os.loadavg().map((x) => round(x, 2)),
  };
}

// The version of an npm package as it resolves from here (node_modules or NODE_PATH).
function packageVersion(name) {
  try {
    return require(`${name}/package.json`).version;
  } catch {
    return null;
  }
}

function commandVersion(bin, args, pattern) {
  try {
    const out = execFileSync(bin, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    const m = out.match(pattern);
    return m ? m[1] : out.trim();
  } catch (err) {
    return null;
  }
}

// A binary from an environment variable, else the first of `candidates` that exists, else
// the bare name (looked up in PATH by spawn).
function findBinary(envVar, name, candidates) {
  if (process.env[envVar]) return process.env[envVar];
  for (const c of candidates) if (fs.existsSync(c)) return c;
  return name;
}

// ---------------------------------------------------------------------------------------
// Statistics.

function round(x, digits = 0) {
  if (!Number.isFinite(x)) return null;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

// Nearest-rank percentile of an ascending array.
// Sorted latencies end[i] - start[i] for i from `from` on (the warm-up before it is not
// counted); NaN where an end is missing.
function latencies(start, end, from) {
  const v = [];
  for (let i = from; i < start.length; i++) v.push(end[i] - start[i]);
  return v.sort((a, b) => a - b);
}

function percentile(sorted, p) {
  if (sorted.length === 0) return NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1];
}

function median(values) {
  const s = values.filter(Number.isFinite).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

function summarize(values) {
  const v = values.filter(Number.isFinite);
  return { min: v.length ? Math.min(...v) : null, median: v.length ? median(v) : null, max: v.length ? Math.max(...v) : null };
}

// ---------------------------------------------------------------------------------------
// The 128-byte JSON body every job and message carries (the same in both benchmarks).

const PAYLOAD_BYTES = 128;

function body(seq) {
  const o = { seq, op: 'resize', w: 640, h: 480, src: 'images/in', pad: '' };
  o.pad = 'x'.repeat(Math.max(0, PAYLOAD_BYTES - JSON.stringify(o).length));
  return o;
}

// ---------------------------------------------------------------------------------------
// Open-loop pacing: calls send(i) for i = 0..n-1 at `ratePerS`, each when its time has come
// (timer granularity ~1 ms, so a few per tick at high rates), never waiting for a send to
// finish. Resolves with how late the sends were behind their schedule.

function paced(n, ratePerS, send) {
  return new Promise((resolve, reject) => {
    const start = now();
    let i = 0;
    let maxLagMs = 0;
    let late = 0; // sends more than 2 ms behind schedule
    const tick = () => {
      try {
        const t = now();
        const due = Math.min(n, Math.floor(((t - start) * ratePerS) / 1000) + 1);
        while (i < due) {
          const lag = now() - (start + (i * 1000) / ratePerS);
          if (lag > maxLagMs) maxLagMs = lag;
          if (lag > 2) late++;
          send(i++);
        }
        if (i >= n) {
          resolve({ elapsed_ms: now() - start, max_lag_ms: round(maxLagMs, 2), late_sends: late });
          return;
        }
        const next = start + (i * 1000) / ratePerS;
        setTimeout(tick, Math.max(0, next - now()));
      } catch (err) {
        reject(err);
      }
    };
    tick();
  });
}

// How long this process's event loop was held up (a late timer: GC, long callbacks), over
// a stretch: the client-side share of a latency tail.
function loopDelayMeter() {
  const h = monitorEventLoopDelay({ resolution: 1 });
  h.enable();
  return () => {
    h.disable();
    return {
      loop_delay_p99_ms: round(h.percentile(99) / 1e6, 2),
      loop_delay_max_ms: round(h.max / 1e6, 2),
    };
  };
}

function withTimeout(promise, ms, what) {
  let t;
  return Promise.race([
    promise.finally(() => clearTimeout(t)),
    new Promise((_, reject) => {
      t = setTimeout(() => reject(new Error(`${what}: timed out after ${ms} ms`)), ms);
    }),
  ]);
}

// A promise with its resolve/reject exposed.
function deferred() {
  let resolve;
  let reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

// ---------------------------------------------------------------------------------------
// Options, results file, summary table.

function parseArgs(argv, { name, defaultOut, usage }) {
  const opts = { quick: false, runs: null, out: defaultOut };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--quick') opts.quick = true;
    else if (a === '--runs') opts.runs = Number(value());
    else if (a.startsWith('--runs=')) opts.runs = Number(a.slice(7));
    else if (a === '--out') opts.out = value();
    else if (a.startsWith('--out=')) opts.out = a.slice(6);
    else if (a === '--help' || a === '-h') {
      console.log(usage);
      process.exit(0);
    } else {
      console.error(`${name}: unknown option ${a}\n${usage}`);
      process.exit(2);
    }
  }
  if (opts.runs !== null && !(Number.isInteger(opts.runs) && opts.runs >= 1)) {
    console.error(`${name}: --runs needs a positive integer`);
    process.exit(2);
  }
  return opts;
}

function writeResults(file, results) {
  fs.mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
  const tmp = `${file}.tmp`;
  fs.writeFileSync(tmp, `${JSON.stringify(results, null, 2)}\n`);
  fs.renameSync(tmp, file);
}

function fmtNum(x, digits) {
  if (x === null || x === undefined || !Number.isFinite(x)) return '-';
  return x.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

// rows: [{ label, unit, min, median, max, digits }]
function printTable(title, rows) {
  const cells = rows.map((r) => [r.label, r.unit, fmtNum(r.min, r.digits), fmtNum(r.median, r.digits), fmtNum(r.max, r.digits)]);
  const head = ['figure', 'unit', 'min', 'median', 'max'];
  const widths = head.map((h, c) => Math.max(h.length, ...cells.map((row) => row[c].length)));
  const line = (row) => row.map((v, c) => (c < 2 ? v.padEnd(widths[c]) : v.padStart(widths[c]))).join('  ');
  console.log(`\n${title}`);
  console.log(line(head));
  console.log(widths.map((w) => '-'.repeat(w)).join('  '));
  for (const row of cells) console.log(line(row));
}

module.exports = {
  now,
  sleep,
  makeTempDir,
  freePort,
  startServer,
  stopServer,
  tcpProbe,
  cpuMeter,
  disturbanceMeter,
  loopDelayMeter,
  machineInfo,
  packageVersion,
  commandVersion,
  findBinary,
  round,
  latencies,
  percentile,
  median,
  summarize,
  PAYLOAD_BYTES,
  body,
  paced,
  withTimeout,
  deferred,
  parseArgs,
  writeResults,
  printTable,
  cleanupSync,
};
