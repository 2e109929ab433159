#!/usr/bin/env node
// Soak: one amp-server on its own nats-server (JetStream, file storage), 1,000 sessions of
// mixed traffic for 10 minutes, sampling what would show a leak: amp-server's resident
// memory, open file descriptors and threads, nats-server's memory, and the size of every
// JetStream stream. A benchmark, not a test: it is not registered in ctest.
//
//   node benchmarks/soak.js [--sessions 1000] [--minutes 10] [--interval-s 5] [--out FILE]
//                           [--amp-server PATH] [--quick] [--help for the rest]
//
// The sessions are a quarter each: workers (register for job "soak", claim each offer,
// complete it with the claim's attempt, heartbeat every heartbeat_s), producers (submit
// tasks, ack their amp.task.completed notices), messengers (send inbox messages to each
// other, ack what they get) and topic users (half publish events, half subscribe). The
// load is paced by timers at a steady total rate. Every --interval-s a sample goes to the
// CSV file and to stdout; at the end a summary judges each metric "flat" or "growing".
//
// `ws` is the end-to-end tests' copy: `ctest --test-dir build -R e2e-npm-ci` installs it
// into build/tests/e2e/node_modules, where this script finds it (or set NODE_PATH).
'use strict';

const { spawn, execFileSync } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const http = require('node:http');
const os = require('node:os');
const path = require('node:path');
const { performance } = require('node:perf_hooks');

const REPO = path.resolve(__dirname, '..');
const jwt = require(path.join(REPO, 'tests', 'e2e', 'lib', 'jwt.js'));
const { freePort } = require(path.join(REPO, 'tests', 'e2e', 'lib', 'ports.js'));

function loadWs() {
  try {
    return require('ws');
  } catch {
    const local = path.join(REPO, 'build', 'tests', 'e2e', 'node_modules', 'ws');
    try {
      return require(local);
    } catch {
      console.error('soak: the `ws` package is missing: run `ctest --test-dir build -R e2e-npm-ci` ' +
          '(installs it into build/tests/e2e/node_modules) or set NODE_PATH');
      process.exit(2);
    }
  }
}
const WebSocket = loadWs();

// ----- options ---------------------------------------------------------------------------

const HELP = `Usage: node benchmarks/soak.js [options]
  --sessions N      sessions, a quarter per role (default 1000; --quick 100)
  --minutes M       length of the traffic phase (default 10; --quick 1)
  --interval-s S    seconds between samples (default 5)
  --warmup-s S      warm-up left out of the slopes (default min(120, 20% of the run))
  --out FILE        CSV of the samples (default benchmarks/results/soak-<date>.csv,
                    soak-<date>-quick.csv with --quick)
  --amp-server PATH (default build/bin/amp-server; copied to the temp dir before it starts)
  --nats-server PATH (default /usr/sbin/nats-server)
  --task-rate R     tasks submitted per second in total (default 200)
  --msg-rate R      inbox messages sent per second in total (default 200)
  --event-rate R    topic events published per second in total (default 100)
  --topics N        topics soak.t0 .. soak.t<N-1> (default 10)
  --slots N         slots per worker (default 4)
  --logs DIR        copy the amp-server and nats-server logs to DIR at the end
  --task-retention-s S  retention.task_s of amp-server (default 120, so that the task
                    store reaches its steady size within the run; amp-server warns that
                    this is under amp.v1's 24 hours)
  --topic-age-s S   retention.topics.max_age_s (default 60)
  --quick           100 sessions for 1 minute
`;

function parseOptions(argv) {
  const o = {
    sessions: null, minutes: null, intervalS: 5, warmupS: null, out: null,
    ampServer: path.join(REPO, 'build', 'bin', 'amp-server'), natsServer: '/usr/sbin/nats-server',
    taskRate: 200, msgRate: 200, eventRate: 100, topics: 10, slots: 4, logs: null, quick: false,
    taskRetentionS: 120, topicAgeS: 60,
  };
  const num = (name, v) => {
    const n = Number(v);
    if (!Number.isFinite(n) || n <= 0) usage(`${name} needs a positive number, not ${v}`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    switch (a) {
      case '--sessions': o.sessions = Math.floor(num(a, next())); break;
      case '--minutes': o.minutes = num(a, next()); break;
      case '--interval-s': o.intervalS = num(a, next()); break;
      case '--warmup-s': o.warmupS = Number(next()); break;
      case '--out': o.out = path.resolve(next()); break;
      case '--amp-server': o.ampServer = path.resolve(next()); break;
      case '--nats-server': o.natsServer = path.resolve(next()); break;
      case '--task-rate': o.taskRate = num(a, next()); break;
      case '--msg-rate': o.msgRate = num(a, next()); break;
      case '--event-rate': o.eventRate = num(a, next()); break;
      case '--topics': o.topics = Math.floor(num(a, next())); break;
      case '--slots': o.slots = Math.floor(num(a, next())); break;
      case '--logs': o.logs = path.resolve(next()); break;
      case '--task-retention-s': o.taskRetentionS = Math.floor(num(a, next())); break;
      case '--topic-age-s': o.topicAgeS = Math.floor(num(a, next())); break;
      case '--quick': o.quick = true; break;
      case '--help': case '-h': process.stdout.write(HELP); process.exit(0); break;
      default: usage(`unknown argument ${a}`);
    }
  }
  o.sessions ??= o.quick ? 100 : 1000;
  o.minutes ??= o.quick ? 1 : 10;
  if (o.sessions < 8) usage('--sessions must be at least 8 (two per role)');
  o.durationS = o.minutes * 60;
  o.warmupS ??= Math.min(120, 0.2 * o.durationS);
  const date = new Date().toISOString().slice(0, 10);
  o.out ??= path.join(REPO, 'benchmarks', 'results', `soak-${date}${o.quick ? '-quick' : ''}.csv`);
  return o;
}

function usage(message) {
  console.error(`soak: ${message}\n\n${HELP}`);
  process.exit(2);
}

const opt = parseOptions(process.argv.slice(2));

// ----- small helpers ---------------------------------------------------------------------

const now = () => performance.now();
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const MiB = 1024 * 1024;
const fmtMiB = (bytes) => `${(bytes / MiB).toFixed(1)}`;
const log = (text) => console.log(`[soak ${new Date().toISOString().slice(11, 19)}] ${text}`);

function percentile(sorted, q) {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}
function sortedCopy(values) {
  return Float64Array.from(values).sort();
}
/** Least-squares slope of y over x. */
function slope(xs, ys) {
  const n = xs.length;
  if (n < 2) return NaN;
  const mx = xs.reduce((a, b) => a + b, 0) / n;
  const my = ys.reduce((a, b) => a + b, 0) / n;
  let sxy = 0;
  let sxx = 0;
  for (let i = 0; i < n; i++) {
    sxy += (xs[i] - mx) * (ys[i] - my);
    sxx += (xs[i] - mx) ** 2;
  }
  return sxx === 0 ? NaN : sxy / sxx;
}

/** GET url → {status, body}; one request per connection (websocketpp closes after one). */
function httpGet(url, timeoutMs = 10000) {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { timeout: timeoutMs, agent: false, headers: { Connection: 'close' } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => {
        body += d;
      });
      res.on('end', () => resolve({ status: res.statusCode, body }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`GET ${url}: timeout`)));
    req.on('error', reject);
  });
}

function shortCommand(file, args) {
  try {
    return execFileSync(file, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return '';
  }
}

// ----- /proc -----------------------------------------------------------------------------

const CLK_TCK = Number(shortCommand('getconf', ['CLK_TCK'])) || 100;

/** {rssKiB, threads, fds, cpuS} of a process, or null when it is gone. */
function procStats(pid) {
  try {
    const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const rss = /^VmRSS:\s+(\d+) kB/m.exec(status);
    const threads = /^Threads:\s+(\d+)/m.exec(status);
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const cpuS = (Number(fields[11]) + Number(fields[12])) / CLK_TCK; // utime + stime
    const fds = fs.readdirSync(`/proc/${pid}/fd`).length;
    return { rssKiB: rss ? Number(rss[1]) : NaN, threads: threads ? Number(threads[1]) : NaN, fds, cpuS };
  } catch {
    return null;
  }
}

// ----- child processes -------------------------------------------------------------------

const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => fs.existsSync(p));
const children = new Set();

/** A server process whose output goes to DIR/NAME.log, with a way to wait for a line. */
class Child {
  constructor(name, binary, args, dir, { onLine } = {}) {
    this.name = name;
    this.logPath = path.join(dir, `${name}.log`);
    this.tailText = '';
    this.exited = false;
    this.exitCode = null;
    this.exitSignal = null;
    this.expectExit = false;
    this.lineWaiters = [];
    this.onLine = onLine;
    this.partial = '';
    // setpriv execs the program (same pid) and has the kernel kill it if this process dies.
    const argv = SETPRIV ? [SETPRIV, '--pdeathsig', 'SIGKILL', '--', binary, ...args] : [binary, ...args];
    // Its own process group: a Ctrl-C in the terminal reaches this script only, which then
    // stops the servers in order.
    this.proc = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    this.pid = this.proc.pid;
    children.add(this);
    this.logFd = fs.openSync(this.logPath, 'a');
    const onData = (chunk) => {
      fs.writeSync(this.logFd, chunk);
      const text = chunk.toString('utf8');
      this.tailText = (this.tailText + text).slice(-16384);
      const lines = (this.partial + text).split('\n');
      this.partial = lines.pop();
      for (const line of lines) {
        if (this.onLine) this.onLine(line);
        this.lineWaiters = this.lineWaiters.filter((w) => !w(line));
      }
    };
    this.proc.stdout.on('data', onData);
    this.proc.stderr.on('data', onData);
    this.exitPromise = new Promise((resolve) => {
      this.proc.once('exit', (code, signal) => {
        this.exited = true;
        this.exitCode = code;
        this.exitSignal = signal;
        children.delete(this);
        this.lineWaiters = this.lineWaiters.filter((w) => !w(null));
        resolve({ code, signal });
      });
      this.proc.once('error', (err) => {
        this.tailText += `\n[spawn error: ${err.message}]`;
        this.exited = true;
        children.delete(this);
        this.lineWaiters = this.lineWaiters.filter((w) => !w(null));
        resolve({ code: null, signal: null, error: err });
      });
    });
  }

  /** Resolves when a line matches `re`; rejects if the process exits first or after timeoutMs. */
  waitForLine(re, timeoutMs) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.lineWaiters = this.lineWaiters.filter((w) => w !== waiter);
        reject(new Error(`${this.name} printed no ${re} within ${timeoutMs} ms:\n${this.tail()}`));
      }, timeoutMs);
      const waiter = (line) => {
        if (line === null) {
          clearTimeout(timer);
          reject(new Error(`${this.name} exited (code ${this.exitCode}, signal ${this.exitSignal}):\n${this.tail()}`));
          return true;
        }
        if (!re.test(line)) return false;
        clearTimeout(timer);
        resolve(line);
        return true;
      };
      if (this.exited) waiter(null);
      else this.lineWaiters.push(waiter);
    });
  }

  tail(lines = 30) {
    return this.tailText.split('\n').slice(-lines).join('\n');
  }

  /** SIGTERM, up to graceMs for the exit, then SIGKILL. Resolves {code, signal, killed}. */
  async stop(graceMs) {
    this.expectExit = true;
    if (!this.exited) this.proc.kill('SIGTERM');
    let timer;
    const r = await Promise.race([this.exitPromise, new Promise((resolve) => {
      timer = setTimeout(() => resolve(null), graceMs);
    })]);
    clearTimeout(timer);
    if (r) return { ...r, killed: false };
    this.proc.kill('SIGKILL');
    return { ...(await this.exitPromise), killed: true };
  }

  closeLog() {
    try {
      fs.closeSync(this.logFd);
    } catch {
      // closed
    }
  }
}

let tempDir = null;
function killEverythingNow() {
  for (const c of children) {
    try {
      c.proc.kill('SIGKILL');
    } catch {
      // gone
    }
  }
  if (tempDir) fs.rmSync(tempDir, { recursive: true, force: true });
}
process.on('exit', killEverythingNow);

async function startNats(dir) {
  let lastError;
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    const monitor = await freePort();
    const args = ['-js', '-a', '127.0.0.1', '-p', String(port), '-m', String(monitor), '-sd', path.join(dir, 'store')];
    const child = new Child('nats-server', opt.natsServer, args, dir);
    try {
      await child.waitForLine(/Server is ready/, 15000);
      return { child, port, monitor, url: `nats://127.0.0.1:${port}` };
    } catch (err) {
      lastError = err;
      await child.stop(1000);
      if (!/address already in use/i.test(child.tailText)) break;
    }
  }
  throw lastError;
}

// amp-server's log: one JSON object per line; counted by level and event.
const ampLog = { byEvent: new Map(), notable: [], lines: 0 };
function onAmpLine(line) {
  if (!line.startsWith('{')) return;
  ampLog.lines++;
  let e;
  try {
    e = JSON.parse(line);
  } catch {
    return;
  }
  const key = `${e.level}:${e.event}`;
  ampLog.byEvent.set(key, (ampLog.byEvent.get(key) || 0) + 1);
  if (e.level !== 'info' && e.level !== 'debug' && ampLog.notable.length < 20) ampLog.notable.push(line.slice(0, 400));
}

async function startAmp(dir, natsUrl, secret) {
  // A private copy, so that a rebuild of build/bin during the run neither disturbs it nor fails.
  const binary = path.join(dir, 'amp-server');
  fs.copyFileSync(opt.ampServer, binary);
  fs.chmodSync(binary, 0o755);
  const configPath = path.join(dir, 'amp-server.json');
  const config = {
    nats: { url: natsUrl },
    auth: { alg: 'HS256', secret },
    retention: { task_s: opt.taskRetentionS, topics: { max_age_s: opt.topicAgeS } },
  };
  fs.writeFileSync(configPath, JSON.stringify(config, null, 2), { mode: 0o600 });
  let lastError;
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    const child = new Child('amp-server', binary, ['--config', configPath, '--listen', `127.0.0.1:${port}`], dir,
        { onLine: onAmpLine });
    try {
      await child.waitForLine(/"event":"listening"/, 20000);
      const httpBase = `http://127.0.0.1:${port}`;
      const deadline = Date.now() + 20000;
      for (;;) {
        const r = await httpGet(`${httpBase}/readyz`).catch(() => ({ status: 0 }));
        if (r.status === 200) break;
        if (Date.now() > deadline) throw new Error(`amp-server /readyz is ${r.status} after 20 s`);
        await sleep(100);
      }
      return { child, port, http: httpBase, url: `ws://127.0.0.1:${port}/amp` };
    } catch (err) {
      lastError = err;
      await child.stop(2000);
      if (!/cannot listen|address already in use/i.test(child.tailText)) break;
    }
  }
  throw lastError;
}

// ----- traffic statistics ------------------------------------------------------------------

const COUNTERS = ['submitted', 'offers', 'claimed', 'completed', 'notices', 'sent', 'received', 'published',
  'events', 'heartbeats', 'errors', 'throttled'];
const total = Object.fromEntries(COUNTERS.map((k) => [k, 0]));
const extra = { redeliveries: 0, duplicates: 0, subDropped: 0, leaseLost: 0, cancelled: 0, otherPushes: 0,
  reconnects: 0, unexpectedCloses: 0, anomalies: 0, skipped: 0, outOfOrder: 0, expectedEvents: 0 };
const errorsByCode = new Map(); // "op:code" → count
const closesByCode = new Map();
const otherPushOps = new Map();
// Latencies (ms): per op for the whole run, and all ops plus the end-to-end paths per interval.
const latencyByOp = new Map();
let intervalLat = { req: [], task: [], msg: [], event: [] };
const wholeLat = { task: [], msg: [], event: [] };

function countError(op, code) {
  total.errors++;
  const key = `${op}:${code}`;
  errorsByCode.set(key, (errorsByCode.get(key) || 0) + 1);
}
function recordLatency(op, ms) {
  let a = latencyByOp.get(op);
  if (!a) latencyByOp.set(op, (a = []));
  a.push(ms);
  intervalLat.req.push(ms);
}
function recordE2e(kind, ms) {
  intervalLat[kind].push(ms);
  wholeLat[kind].push(ms);
}

// ----- one session -------------------------------------------------------------------------

const NS = 'soak';
const JOB = 'soak';
const PAD = 'x'.repeat(96); // bodies of ~128 bytes, as the other benchmarks use
const REQUEST_TIMEOUT_MS = 30000;
const MAX_IN_FLIGHT = 256; // per session; beyond it a paced op is skipped ("throttled")

let server = null; // {url, ...} of amp-server
let secret = null;
let stopping = false;
const sessions = [];

class Session {
  constructor(role, index, name, grants) {
    this.role = role;
    this.index = index;
    this.name = name;
    this.grants = grants;
    this.ws = null;
    this.ready = false;
    this.nextId = 1;
    this.pending = new Map(); // id → {op, t0, cb}
    this.heartbeatTimer = null;
    this.heartbeatS = 10;
  }

  token() {
    const nowS = Math.floor(Date.now() / 1000);
    return jwt.token(secret, { sub: this.name, ns: NS, grants: this.grants, exp: nowS + opt.durationS + 3600 });
  }

  /** Opens the connection, says hello and sets up the role; resolves when ready. */
  start() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(server.url, ['amp.v1'], { handshakeTimeout: 30000, perMessageDeflate: false });
      this.ws = ws;
      let settled = false;
      const fail = (err) => {
        if (!settled) {
          settled = true;
          reject(err);
        }
      };
      ws.on('error', fail);
      ws.on('message', (data) => this.onFrame(data));
      ws.on('close', (code) => {
        this.onClose(code);
        fail(new Error(`${this.name}: closed (${code}) during setup`));
      });
      ws.once('open', () => {
        this.request('hello', { token: this.token() }, (reply) => {
          if (reply.op !== 'ok') {
            fail(new Error(`${this.name}: hello failed: ${JSON.stringify(reply)}`));
            return;
          }
          this.heartbeatS = reply.heartbeat_s || 10;
          this.setup().then(() => {
            this.ready = true;
            settled = true;
            resolve();
          }, fail);
        });
      });
    });
  }

  /** The role's own setup after hello (register, subscribe). */
  setup() {
    if (this.role === 'worker') {
      return this.ask('register', { jobs: [JOB], slots: opt.slots, meta: { role: 'worker' } }).then(() => {
        const periodMs = this.heartbeatS * 1000;
        this.heartbeatTimer = setTimeout(() => {
          this.heartbeat();
          this.heartbeatTimer = setInterval(() => this.heartbeat(), periodMs);
        }, Math.random() * periodMs);
      });
    }
    if (this.role === 'subscriber') return this.subscribe('new');
    return Promise.resolve();
  }

  /** request() as a promise that rejects on an error reply (for setup steps). */
  ask(op, fields) {
    return new Promise((resolve, reject) => {
      this.request(op, fields, (reply) => {
        if (reply.op === 'ok') resolve(reply);
        else reject(new Error(`${this.name}: ${op} answered ${JSON.stringify(reply)}`));
      });
    });
  }

  get open() {
    return this.ws && this.ws.readyState === WebSocket.OPEN;
  }

  request(op, fields, cb) {
    if (!this.open) return false;
    const id = this.nextId++;
    this.pending.set(id, { op, t0: now(), cb });
    this.ws.send(JSON.stringify({ op, id, ...fields }));
    return true;
  }

  onFrame(data) {
    let f;
    try {
      f = JSON.parse(data.toString('utf8'));
    } catch {
      extra.anomalies++;
      return;
    }
    if ((f.op === 'ok' || f.op === 'error') && f.id !== null && f.id !== undefined) {
      const p = this.pending.get(f.id);
      if (!p) {
        extra.anomalies++; // a reply to no request, a second reply, or one after our timeout
        return;
      }
      this.pending.delete(f.id);
      recordLatency(p.op, now() - p.t0);
      if (f.op === 'error') countError(p.op, f.code);
      if (p.cb) p.cb(f);
      return;
    }
    switch (f.op) {
      case 'error': countError('(no id)', f.code); break;
      case 'offer': this.onOffer(f); break;
      case 'message': this.onMessage(f); break;
      case 'event': this.onEvent(f); break;
      case 'sub_dropped': this.onSubDropped(f); break;
      case 'lease_lost': extra.leaseLost++; break;
      case 'cancelled': extra.cancelled++; break;
      default:
        extra.otherPushes++;
        otherPushOps.set(f.op, (otherPushOps.get(f.op) || 0) + 1);
    }
  }

  onClose(code) {
    clearTimeout(this.heartbeatTimer);
    clearInterval(this.heartbeatTimer);
    this.heartbeatTimer = null;
    for (const [, p] of this.pending) {
      if (!stopping) countError(p.op, 'closed');
    }
    this.pending.clear();
    const wasReady = this.ready;
    this.ready = false;
    if (stopping) return;
    extra.unexpectedCloses++;
    closesByCode.set(code, (closesByCode.get(code) || 0) + 1);
    if (wasReady) this.reconnect();
  }

  reconnect() {
    setTimeout(() => {
      if (stopping) return;
      extra.reconnects++;
      this.start().catch(() => {
        // not ready again: drop what is left of this attempt and try once more
        if (stopping) return;
        if (this.ws) this.ws.terminate();
        this.reconnect();
      });
    }, 1000);
  }

  /** Requests older than REQUEST_TIMEOUT_MS count as errors "timeout" (client side). */
  sweep(t) {
    for (const [id, p] of this.pending) {
      if (t - p.t0 < REQUEST_TIMEOUT_MS) break; // insertion order: the rest are younger
      this.pending.delete(id);
      countError(p.op, 'timeout');
    }
  }

  // --- workers
  heartbeat() {
    this.request('heartbeat', {}, (r) => {
      if (r.op === 'ok') total.heartbeats++;
    });
  }

  onOffer(f) {
    total.offers++;
    this.request('claim', { task: f.task }, (r) => {
      if (r.op !== 'ok') return;
      total.claimed++;
      setTimeout(() => {
        this.request('complete', { task: f.task, attempt: r.attempt, result: { ok: true, by: this.name } }, (c) => {
          if (c.op === 'ok') total.completed++;
        });
      }, 5 + Math.random() * 45); // the "work": 5..50 ms
    });
  }

  // --- producers and messengers
  onMessage(f) {
    const env = f.envelope || {};
    if (f.delivery > 1) extra.redeliveries++;
    if (env.from === '$broker') {
      if (this.role === 'producer' && typeof env.type === 'string' && env.type.startsWith('amp.task.')) {
        const t0 = tasksInFlight.get(env.body && env.body.task);
        if (t0 !== undefined) {
          tasksInFlight.delete(env.body.task);
          total.notices++;
          recordE2e('task', now() - t0);
        } else {
          extra.duplicates++;
        }
      } else {
        extra.otherPushes++;
        otherPushOps.set(`message:${env.type}`, (otherPushOps.get(`message:${env.type}`) || 0) + 1);
      }
    } else {
      const entry = messagesInFlight.get(env.id);
      if (entry) {
        messagesInFlight.delete(env.id);
        total.received++;
        recordE2e('msg', now() - entry.t0);
      } else {
        extra.duplicates++;
      }
    }
    this.request('ack', { seq: f.seq });
  }

  // --- subscribers
  subscribe(from) {
    this.subCount = (this.subCount || 0) + 1;
    const sub = `s${this.subCount}`;
    return this.ask('subscribe', { topic: `soak.t${this.topic}`, sub, from }).then(() => {
      this.sub = sub;
      if (!this.counted) {
        subscribersOnTopic[this.topic]++;
        this.counted = true;
      }
    });
  }

  onEvent(f) {
    total.events++;
    if (this.lastSeq !== undefined && f.seq <= this.lastSeq) extra.outOfOrder++;
    this.lastSeq = f.seq;
    const b = f.envelope && f.envelope.body;
    if (b && typeof b.t === 'number') recordE2e('event', now() - b.t);
  }

  onSubDropped(f) {
    extra.subDropped++;
    this.subscribe({ seq: f.last_seq + 1 }).catch(() => {});
  }
}

const tasksInFlight = new Map(); // task id → submit time (until its notice)
const messagesInFlight = new Map(); // msg_id → {t0} (until received)
let subscribersOnTopic = [];

// ----- paced load --------------------------------------------------------------------------

/** Calls fn() `rate` times a second, spread over 10 ms ticks; a stall is not caught up. */
class Pacer {
  constructor(rate, fn) {
    this.rate = rate;
    this.fn = fn;
    this.done = 0;
    this.timer = null;
  }

  start() {
    this.t0 = now();
    this.timer = setInterval(() => this.tick(), 10);
  }

  tick() {
    const due = Math.floor((this.rate * (now() - this.t0)) / 1000);
    let behind = due - this.done;
    if (behind > this.rate) { // more than a second behind (a stall): drop the backlog
      extra.skipped += behind - 1;
      this.done = due - 1;
      behind = 1;
    }
    for (; behind > 0; behind--) {
      this.done++;
      this.fn();
    }
  }

  stop() {
    clearInterval(this.timer);
  }
}

function roundRobin(list) {
  let i = 0;
  return () => {
    for (let tries = 0; tries < list.length; tries++) {
      const s = list[i];
      i = (i + 1) % list.length;
      if (s.ready) {
        if (s.pending.size < MAX_IN_FLIGHT) return s;
        total.throttled++;
        return null;
      }
    }
    return null;
  };
}

function makePacers(roles) {
  let taskN = 0;
  let msgN = 0;
  const nextProducer = roundRobin(roles.producer);
  const nextMessenger = roundRobin(roles.messenger);
  const nextPublisher = roundRobin(roles.publisher);
  return [
    new Pacer(opt.taskRate, () => {
      const s = nextProducer();
      if (!s) return;
      const t0 = now();
      s.request('submit', { job: JOB, type: 'soak.task', body: { n: taskN++, pad: PAD } }, (r) => {
        if (r.op !== 'ok') return;
        total.submitted++;
        tasksInFlight.set(r.task, t0);
      });
    }),
    new Pacer(opt.msgRate, () => {
      const s = nextMessenger();
      if (!s) return;
      const peers = roles.messenger;
      let to = peers[Math.floor(Math.random() * peers.length)];
      if (to === s) to = peers[(s.index + 1) % peers.length];
      const msgId = `${s.name}-${msgN++}`;
      messagesInFlight.set(msgId, { t0: now(), acked: false });
      s.request('send', { to: to.name, msg_id: msgId, type: 'soak.msg', body: { n: msgN, pad: PAD } }, (r) => {
        if (r.op === 'ok') {
          total.sent++;
          const e = messagesInFlight.get(msgId);
          if (e) e.acked = true;
        } else {
          messagesInFlight.delete(msgId);
        }
      });
    }),
    new Pacer(opt.eventRate, () => {
      const s = nextPublisher();
      if (!s) return;
      s.request('publish', { topic: `soak.t${s.topic}`, type: 'soak.event', body: { t: now(), pad: PAD } }, (r) => {
        if (r.op !== 'ok') return;
        total.published++;
        extra.expectedEvents += subscribersOnTopic[s.topic];
      });
    }),
  ];
}

// ----- samples -----------------------------------------------------------------------------

const samples = [];
let streamNames = null; // the CSV's stream columns, fixed by the first sample
const lateStreams = new Set();
let csv = null;
let prevTotals = { ...total };
let prevCpu = null;
let runStart = 0;

async function jetstreamSizes(monitorPort) {
  const r = await httpGet(`http://127.0.0.1:${monitorPort}/jsz?streams=true`);
  const j = JSON.parse(r.body);
  const streams = {};
  for (const acc of j.account_details || []) {
    for (const s of acc.stream_detail || []) {
      streams[s.name] = { messages: s.state.messages, bytes: s.state.bytes, consumers: s.state.consumer_count };
    }
  }
  return { streams, messages: j.messages, bytes: j.bytes, nStreams: j.streams, consumers: j.consumers };
}

async function ampSessions() {
  const r = await httpGet(`${server.http}/metrics`).catch(() => null);
  const m = r && /^amp_sessions (\d+)/m.exec(r.body);
  return m ? Number(m[1]) : NaN;
}

function pctOf(values, q) {
  return percentile(sortedCopy(values), q);
}

async function takeSample(amp, nats, phase) {
  const t = now();
  const elapsed = (t - runStart) / 1000;
  const a = procStats(amp.child.pid) || {};
  const n = procStats(nats.child.pid) || {};
  const clientCpu = process.cpuUsage();
  const cpu = { t, amp: a.cpuS, nats: n.cpuS, client: (clientCpu.user + clientCpu.system) / 1e6 };
  const pct = (k) => (prevCpu ? (100 * (cpu[k] - prevCpu[k])) / ((t - prevCpu.t) / 1000) : NaN);
  const js = await jetstreamSizes(nats.monitor).catch(() => ({ streams: {} }));
  const sessionsNow = await ampSessions();
  const delta = Object.fromEntries(COUNTERS.map((k) => [k, total[k] - prevTotals[k]]));
  prevTotals = { ...total };
  const lat = intervalLat;
  intervalLat = { req: [], task: [], msg: [], event: [] };
  const s = {
    time: new Date().toISOString(), elapsed, phase,
    ampRssKiB: a.rssKiB, ampFds: a.fds, ampThreads: a.threads, ampCpu: pct('amp'),
    natsRssKiB: n.rssKiB, natsCpu: pct('nats'),
    clientRssKiB: Math.round(process.memoryUsage.rss() / 1024), clientCpu: pct('client'),
    ampSessions: sessionsNow, jsStreams: js.nStreams, jsConsumers: js.consumers, jsMessages: js.messages,
    jsBytes: js.bytes, streams: js.streams, delta,
    reqP50: pctOf(lat.req, 0.5), reqP99: pctOf(lat.req, 0.99),
    reqMax: lat.req.length ? lat.req.reduce((a, b) => Math.max(a, b)) : NaN,
    taskP50: pctOf(lat.task, 0.5), taskP99: pctOf(lat.task, 0.99), msgP99: pctOf(lat.msg, 0.99),
    eventP99: pctOf(lat.event, 0.99),
  };
  prevCpu = cpu;
  samples.push(s);
  // The stream columns are those of the first sample with traffic (the streams exist by then).
  if (!streamNames && phase !== 'start') {
    streamNames = Object.keys(js.streams).sort();
    openCsv();
    for (const early of samples.slice(0, -1)) writeCsvRow(early);
  }
  if (streamNames) {
    for (const name of Object.keys(js.streams)) {
      if (!streamNames.includes(name) && !lateStreams.has(name)) {
        lateStreams.add(name);
        log(`stream ${name} appeared after the first sample: it is in the summary, not in the CSV`);
      }
    }
    writeCsvRow(s);
  }
  printSample(s);
  return s;
}

function openCsv() {
  fs.mkdirSync(path.dirname(opt.out), { recursive: true });
  csv = fs.openSync(opt.out, 'w');
  const cols = ['time_utc', 'elapsed_s', 'phase', 'amp_rss_kib', 'amp_fds', 'amp_threads', 'amp_cpu_pct',
    'nats_rss_kib', 'nats_cpu_pct', 'client_rss_kib', 'client_cpu_pct', 'amp_sessions', 'js_streams',
    'js_consumers', 'js_messages', 'js_bytes'];
  for (const name of streamNames) cols.push(`${name}.messages`, `${name}.bytes`, `${name}.consumers`);
  cols.push(...COUNTERS);
  cols.push('req_p50_ms', 'req_p99_ms', 'req_max_ms', 'task_e2e_p50_ms', 'task_e2e_p99_ms', 'msg_e2e_p99_ms',
      'event_e2e_p99_ms');
  fs.writeSync(csv, `${cols.join(',')}\n`);
}

function writeCsvRow(s) {
  const r = (x, d = 1) => (Number.isFinite(x) ? Number(x.toFixed(d)) : '');
  const row = [s.time, r(s.elapsed), s.phase, s.ampRssKiB, s.ampFds, s.ampThreads, r(s.ampCpu), s.natsRssKiB,
    r(s.natsCpu), s.clientRssKiB, r(s.clientCpu), r(s.ampSessions, 0), s.jsStreams, s.jsConsumers, s.jsMessages,
    s.jsBytes];
  for (const name of streamNames) {
    const st = s.streams[name] || {};
    row.push(st.messages ?? '', st.bytes ?? '', st.consumers ?? '');
  }
  for (const k of COUNTERS) row.push(s.delta[k]);
  row.push(r(s.reqP50, 2), r(s.reqP99, 2), r(s.reqMax, 2), r(s.taskP50, 2), r(s.taskP99, 2), r(s.msgP99, 2),
      r(s.eventP99, 2));
  fs.writeSync(csv, `${row.join(',')}\n`);
}

function shortStream(name) {
  return name.replace(/^KV_AMP_/, 'kv:').replace(/^AMP_/, '').replace(/_soak$/, '');
}

function printSample(s) {
  const d = s.delta;
  const f1 = (x) => (Number.isFinite(x) ? x.toFixed(1) : '-');
  const streams = Object.keys(s.streams).sort().map((k) =>
    `${shortStream(k)}=${s.streams[k].messages}/${fmtMiB(s.streams[k].bytes)}M`).join(' ');
  console.log(`${s.phase === 'run' ? '' : `${s.phase} `}t=${s.elapsed.toFixed(0).padStart(4)}s ` +
      `amp rss=${(s.ampRssKiB / 1024).toFixed(1)}M fds=${s.ampFds} thr=${s.ampThreads} cpu=${f1(s.ampCpu)}% ` +
      `sess=${s.ampSessions} | nats rss=${(s.natsRssKiB / 1024).toFixed(1)}M cpu=${f1(s.natsCpu)}% | ` +
      `client cpu=${f1(s.clientCpu)}% | sub=${d.submitted} done=${d.completed} ntc=${d.notices} ` +
      `snd=${d.sent} rcv=${d.received} pub=${d.published} ev=${d.events} hb=${d.heartbeats} err=${d.errors}` +
      `${d.throttled ? ` thr=${d.throttled}` : ''} | req p50/p99/max=${f1(s.reqP50)}/${f1(s.reqP99)}/` +
      `${f1(s.reqMax)}ms task p99=${f1(s.taskP99)}ms | ${streams}`);
}

// ----- summary -----------------------------------------------------------------------------

function judge(name, unit, points, warmupS, { pct = 5, floor = 0, scale = 1, digits = 1 }) {
  const after = points.filter((p) => p.x >= warmupS && Number.isFinite(p.y));
  if (!after.length) return null;
  const atWarmup = after[0].y;
  const end = after[after.length - 1].y;
  const max = Math.max(...points.filter((p) => Number.isFinite(p.y)).map((p) => p.y));
  const perMin = slope(after.map((p) => p.x / 60), after.map((p) => p.y));
  const spanMin = (after[after.length - 1].x - after[0].x) / 60;
  const growth = perMin * spanMin; // fitted growth over the post-warm-up span
  const limit = Math.max((pct / 100) * Math.abs(atWarmup), floor);
  const verdict = Number.isFinite(growth) && growth > limit ? 'growing' : 'flat';
  const f = (v) => (Number.isFinite(v) ? (v / scale).toFixed(digits) : '-');
  return { name, unit, atWarmup: f(atWarmup), end: f(end), max: f(max), slope: f(perMin), growth: f(growth),
    limit: f(limit), verdict };
}

function printTable(rows) {
  const head = ['metric', 'unit', 'warm-up end', 'end', 'max', 'slope/min', 'fit growth', 'threshold', 'verdict'];
  const cells = [head, ...rows.map((r) => [r.name, r.unit, r.atWarmup, r.end, r.max, r.slope, r.growth, r.limit,
    r.verdict])];
  const widths = head.map((_, i) => Math.max(...cells.map((c) => String(c[i]).length)));
  for (const c of cells) {
    // names left-aligned, numbers right-aligned
    const line = c.map((v, i) => (i < 2 ? String(v).padEnd(widths[i]) : String(v).padStart(widths[i])));
    console.log(`  ${line.join('  ')}`);
  }
}

function latencyLine(values) {
  if (!values.length) return 'none';
  const s = sortedCopy(values);
  const over = (ms) => {
    const i = s.findIndex((v) => v > ms);
    if (i < 0) return '0';
    const n = s.length - i;
    return `${n} (${((100 * n) / s.length).toFixed(2)}%, ${s[i].toFixed(0)}..${s[s.length - 1].toFixed(0)} ms)`;
  };
  return `n=${s.length} p50=${percentile(s, 0.5).toFixed(2)} p99=${percentile(s, 0.99).toFixed(2)} ` +
      `p99.9=${percentile(s, 0.999).toFixed(2)} max=${s[s.length - 1].toFixed(1)} ms; ` +
      `over 100 ms: ${over(100)}, over 1 s: ${over(1000)}`;
}

function summarize(info) {
  const run = samples.filter((s) => s.phase === 'run');
  const lastRun = run[run.length - 1];
  const warmupS = Math.min(opt.warmupS, lastRun ? lastRun.elapsed : 0);
  console.log('\n==== soak summary ====');
  console.log(`${info.sessions} sessions (${info.roleCounts}), ${(info.trafficS / 60).toFixed(2)} min of traffic, ` +
      `sample every ${opt.intervalS} s, warm-up ${warmupS.toFixed(0)} s; ` +
      `offered ${opt.taskRate} tasks/s, ${opt.msgRate} msgs/s, ${opt.eventRate} events/s`);
  console.log(`amp-server ${info.ampVersion} (${opt.ampServer}, sha256 ${info.ampSha}, built ${info.ampMtime}); ` +
      `nats-server ${info.natsVersion}; node ${process.version}; commit ${info.commit}`);
  console.log(`load average before: ${info.loadBefore}; after: ${info.loadAfter} (${os.cpus().length} CPUs)`);
  if (info.baseline) {
    console.log(`baseline after connecting, before traffic: amp rss ${info.baseline.ampRss} MiB, ` +
        `fds ${info.baseline.ampFds}, threads ${info.baseline.ampThreads}; nats rss ${info.baseline.natsRss} MiB`);
  }
  if (run.length >= 2) {
    console.log(`\nverdict: "growing" when the least-squares growth after warm-up (slope x span) exceeds the ` +
        `threshold: 5% of the warm-up-end value (at least 10 fds, threads or consumers; 64 KiB or 100 ` +
        'messages for a stream).');
    const pts = (get) => run.map((s) => ({ x: s.elapsed, y: get(s) }));
    const rows = [
      judge('amp-server RSS', 'MiB', pts((s) => s.ampRssKiB * 1024), warmupS, { scale: MiB }),
      judge('amp-server fds', 'count', pts((s) => s.ampFds), warmupS, { floor: 10, digits: 0 }),
      judge('amp-server threads', 'count', pts((s) => s.ampThreads), warmupS, { floor: 10, digits: 0 }),
      judge('nats-server RSS', 'MiB', pts((s) => s.natsRssKiB * 1024), warmupS, { scale: MiB }),
      judge('JetStream consumers', 'count', pts((s) => s.jsConsumers), warmupS, { floor: 10, digits: 0 }),
    ];
    const names = [...new Set(run.flatMap((s) => Object.keys(s.streams)))].sort();
    for (const name of names) {
      rows.push(judge(`${name} bytes`, 'KiB', pts((s) => (s.streams[name] ? s.streams[name].bytes : NaN)), warmupS,
          { floor: 64 * 1024, scale: 1024 }));
      rows.push(judge(`${name} msgs`, 'count', pts((s) => (s.streams[name] ? s.streams[name].messages : NaN)),
          warmupS, { floor: 100, digits: 0 }));
    }
    printTable(rows.filter(Boolean));
    const perMinute = [];
    for (let m = 0; m <= Math.ceil(lastRun.elapsed / 60); m++) {
      const s = run.reduce((best, x) => (Math.abs(x.elapsed - m * 60) < Math.abs(best.elapsed - m * 60) ? x : best));
      if (!perMinute.includes(s)) perMinute.push(s);
    }
    console.log('\nper minute (nearest sample): t | amp RSS MiB | fds | threads | nats RSS MiB | ' +
        'consumers | stream msgs/KiB');
    for (const s of perMinute) {
      const st = Object.keys(s.streams).sort().map((k) =>
        `${shortStream(k)} ${s.streams[k].messages}/${(s.streams[k].bytes / 1024).toFixed(0)}`).join(', ');
      console.log(`  ${(s.elapsed / 60).toFixed(1).padStart(5)} min | ${(s.ampRssKiB / 1024).toFixed(1)} | ` +
          `${s.ampFds} | ${s.ampThreads} | ${(s.natsRssKiB / 1024).toFixed(1)} | ${s.jsConsumers} | ${st}`);
    }
    const cpuAvg = (k) => {
      const v = run.slice(1).map((s) => s[k]).filter(Number.isFinite);
      return v.length ? (v.reduce((a, b) => a + b, 0) / v.length).toFixed(0) : '-';
    };
    console.log(`mean CPU during traffic: amp-server ${cpuAvg('ampCpu')}%, nats-server ${cpuAvg('natsCpu')}%, ` +
        `this client ${cpuAvg('clientCpu')}% (of one core)`);
  }
  const drain = samples.filter((s) => s.phase === 'drain').pop();
  if (drain) {
    console.log(`after the drain: ${Object.keys(drain.streams).sort().map((k) =>
      `${k} ${drain.streams[k].messages} msgs ${(drain.streams[k].bytes / 1024).toFixed(0)} KiB`).join('; ')}`);
  }
  console.log('\ntraffic totals:');
  const rate = (n) => (info.trafficS > 0 ? (n / info.trafficS).toFixed(1) : '-');
  for (const k of COUNTERS) console.log(`  ${k.padEnd(11)} ${String(total[k]).padStart(9)}  (${rate(total[k])}/s)`);
  console.log(`  tasks without a notice at the end: ${tasksInFlight.size}; messages sent (ok) but not received: ` +
      `${[...messagesInFlight.values()].filter((e) => e.acked).length}`);
  console.log(`  events delivered ${total.events} of ${extra.expectedEvents} expected (publishes x subscribers of ` +
      `the topic at the time); out of order ${extra.outOfOrder}; sub_dropped ${extra.subDropped}`);
  console.log(`  redeliveries ${extra.redeliveries}, duplicates ${extra.duplicates}, lease_lost ${extra.leaseLost}, ` +
      `cancelled ${extra.cancelled}, other pushes ${extra.otherPushes}` +
      `${otherPushOps.size ? ` (${[...otherPushOps].map(([k, v]) => `${k} ${v}`).join(', ')})` : ''}, ` +
      `unexpected closes ${extra.unexpectedCloses}` +
      `${closesByCode.size ? ` (${[...closesByCode].map(([k, v]) => `${k}: ${v}`).join(', ')})` : ''}, ` +
      `reconnects ${extra.reconnects}, replies to no request ${extra.anomalies}, pacer ticks skipped ${extra.skipped}`);
  console.log(`errors by op:code: ${errorsByCode.size ? [...errorsByCode].sort((a, b) => b[1] - a[1])
    .map(([k, v]) => `${k} ${v}`).join(', ') : 'none'}`);
  console.log('\nlatency, whole run (ms):');
  for (const op of [...latencyByOp.keys()].sort()) {
    console.log(`  ${op.padEnd(10)} ${latencyLine(latencyByOp.get(op))}`);
  }
  console.log(`  submit -> completed notice: ${latencyLine(wholeLat.task)}`);
  console.log(`  send -> message received:   ${latencyLine(wholeLat.msg)}`);
  console.log(`  publish -> event received:  ${latencyLine(wholeLat.event)}`);
  if (info.metrics) console.log(`\namp-server /metrics at the end: ${info.metrics}`);
  console.log(`amp-server log: ${ampLog.lines} lines; ${[...ampLog.byEvent].sort((a, b) => b[1] - a[1])
    .map(([k, v]) => `${k} ${v}`).join(', ')}`);
  for (const l of ampLog.notable) console.log(`  ${l}`);
  console.log(`\nsamples: ${opt.out}`);
}

function metricsDigest(body) {
  const pick = (re) => [...body.matchAll(re)].map((m) => `${m[1]}=${m[2]}`).join(' ');
  const one = (name) => {
    const m = new RegExp(`^${name} (\\S+)`, 'm').exec(body);
    return m ? `${name}=${m[1]}` : '';
  };
  return [one('amp_sessions'), one('amp_lease_expiries_total'), one('amp_slow_consumers_total'),
    one('amp_offers_total'), `errors{${pick(/^amp_errors_total\{code="([^"]+)"\} (\S+)/gm)}}`,
    `transitions{${pick(/^amp_task_transitions_total\{to="([^"]+)"\} (\S+)/gm)}}`].filter(Boolean).join(' ');
}

// ----- the run -----------------------------------------------------------------------------

let interrupted = 0;
let wakeInterrupted = null;

async function connectAll(list, batch = 50) {
  for (let i = 0; i < list.length && !interrupted; i += batch) {
    const part = list.slice(i, i + batch);
    const results = await Promise.allSettled(part.map((s) => s.start()));
    const failed = results.filter((r) => r.status === 'rejected');
    if (failed.length) throw new Error(`${failed.length} sessions failed to start: ${failed[0].reason.message}`);
  }
}

function loadAverage() {
  return os.loadavg().map((x) => x.toFixed(2)).join(', ');
}

async function waitOrInterrupt(ms) {
  if (interrupted) return;
  await new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    wakeInterrupted = () => {
      clearTimeout(timer);
      resolve();
    };
  });
  wakeInterrupted = null;
}

async function main() {
  for (const [file, what] of [[opt.ampServer, '--amp-server'], [opt.natsServer, '--nats-server']]) {
    if (!fs.existsSync(file)) usage(`${what}: ${file} does not exist`);
  }
  const info = {
    sessions: opt.sessions, loadBefore: loadAverage(), uptimeBefore: shortCommand('uptime', []),
    commit: shortCommand('git', ['-C', REPO, 'rev-parse', '--short', 'HEAD']) || 'unknown',
    ampVersion: shortCommand(opt.ampServer, ['--version']).replace(/^amp-server /, ''),
    natsVersion: shortCommand(opt.natsServer, ['--version']).replace(/^nats-server: /, ''),
    ampSha: crypto.createHash('sha256').update(fs.readFileSync(opt.ampServer)).digest('hex').slice(0, 12),
    ampMtime: fs.statSync(opt.ampServer).mtime.toISOString().slice(0, 19),
  };
  log(`uptime before: ${info.uptimeBefore}`);
  tempDir = fs.mkdtempSync(path.join(os.tmpdir(), 'amp-soak-'));
  secret = crypto.randomBytes(32).toString('hex');

  const nats = await startNats(tempDir);
  log(`nats-server pid ${nats.child.pid} on ${nats.url}, monitoring :${nats.monitor}, store ${tempDir}/store`);
  const amp = await startAmp(tempDir, nats.url, secret);
  server = amp;
  log(`amp-server pid ${amp.child.pid} on ${amp.url}`);
  amp.child.exitPromise.then(({ code, signal }) => {
    if (!amp.child.expectExit) {
      log(`amp-server died during the run (code ${code}, signal ${signal}):\n${amp.child.tail()}`);
      info.ampDied = true;
      interrupt();
    }
  });
  nats.child.exitPromise.then(({ code, signal }) => {
    if (!nats.child.expectExit) {
      log(`nats-server died during the run (code ${code}, signal ${signal}):\n${nats.child.tail()}`);
      info.natsDied = true;
      interrupt();
    }
  });

  // Roles: a quarter each; the topic quarter is half publishers, half subscribers.
  const q = Math.floor(opt.sessions / 4);
  const nTopic = opt.sessions - 3 * q;
  const nPub = Math.floor(nTopic / 2);
  const roles = { worker: [], producer: [], messenger: [], publisher: [], subscriber: [] };
  const add = (role, n, prefix, grants) => {
    for (let i = 0; i < n; i++) {
      const s = new Session(role, i, `${prefix}${i}`, grants);
      s.topic = i % opt.topics;
      roles[role].push(s);
      sessions.push(s);
    }
  };
  subscribersOnTopic = new Array(opt.topics).fill(0);
  add('worker', q, 'w', { work: [JOB] });
  add('subscriber', nTopic - nPub, 'sub', { subscribe: ['soak.>'] });
  add('publisher', nPub, 'pub', { publish: ['soak.>'] });
  add('messenger', q, 'm', { send: ['*'] });
  add('producer', q, 'p', { submit: [JOB] });
  info.roleCounts = Object.entries(roles).map(([k, v]) => `${v.length} ${k}s`).join(', ');

  const t0 = now();
  await connectAll(sessions);
  if (interrupted) return finish(amp, nats, info, 0);
  log(`${sessions.length} sessions connected in ${((now() - t0) / 1000).toFixed(1)} s (${info.roleCounts})`);
  await sleep(1000);
  const b = procStats(amp.child.pid);
  const nb = procStats(nats.child.pid);
  info.baseline = { ampRss: (b.rssKiB / 1024).toFixed(1), ampFds: b.fds, ampThreads: b.threads,
    natsRss: (nb.rssKiB / 1024).toFixed(1) };

  const pacers = makePacers(roles);
  runStart = now();
  prevCpu = null;
  await takeSample(amp, nats, 'start').catch(() => {}); // CPU baseline; before any traffic
  for (const p of pacers) p.start();
  const sweeper = setInterval(() => {
    const t = now();
    for (const s of sessions) s.sweep(t);
  }, 1000);
  log(`traffic for ${opt.minutes} min; CSV: ${opt.out}`);

  for (let k = 1; !interrupted; k++) {
    const due = runStart + k * opt.intervalS * 1000;
    if ((due - runStart) / 1000 > opt.durationS + 0.001) break;
    await waitOrInterrupt(due - now());
    if (interrupted) break;
    await takeSample(amp, nats, 'run');
  }
  info.trafficS = (now() - runStart) / 1000;
  for (const p of pacers) p.stop();
  for (const s of roles.worker) {
    clearTimeout(s.heartbeatTimer);
    clearInterval(s.heartbeatTimer);
  }

  // Drain: what is in flight finishes (tasks get their notices, messages arrive).
  if (!interrupted) {
    const deadline = now() + 20000;
    while (now() < deadline && !interrupted) {
      const inFlight = sessions.reduce((n, s) => n + s.pending.size, 0);
      const msgs = [...messagesInFlight.values()].filter((e) => e.acked).length;
      if (!inFlight && !tasksInFlight.size && !msgs) break;
      await sleep(200);
    }
    await sleep(2000); // acks settle in the streams
    await takeSample(amp, nats, 'drain').catch((err) => log(`drain sample failed: ${err.message}`));
  }
  clearInterval(sweeper);
  const m = await httpGet(`${amp.http}/metrics`).catch(() => null);
  if (m) info.metrics = metricsDigest(m.body);
  return finish(amp, nats, info, 1);
}

async function finish(amp, nats, info, ran) {
  stopping = true;
  // Close every session (1000), then the servers.
  await Promise.all(sessions.map((s) => new Promise((resolve) => {
    if (!s.ws || s.ws.readyState === WebSocket.CLOSED) {
      resolve();
      return;
    }
    const timer = setTimeout(() => {
      s.ws.terminate();
      resolve();
    }, 5000);
    s.ws.once('close', () => {
      clearTimeout(timer);
      resolve();
    });
    try {
      s.ws.close(1000);
    } catch {
      s.ws.terminate();
    }
  })));
  const ampExit = await amp.child.stop(10000);
  const natsExit = await nats.child.stop(10000);
  info.loadAfter = loadAverage();
  info.uptimeAfter = shortCommand('uptime', []);
  amp.child.closeLog();
  nats.child.closeLog();
  if (opt.logs) {
    fs.mkdirSync(opt.logs, { recursive: true });
    for (const c of [amp.child, nats.child]) fs.copyFileSync(c.logPath, path.join(opt.logs, path.basename(c.logPath)));
  }
  fs.rmSync(tempDir, { recursive: true, force: true });
  tempDir = null;
  if (csv !== null) fs.closeSync(csv);
  if (ran && samples.length) summarize(info);
  log(`amp-server exit: code ${ampExit.code} signal ${ampExit.signal}` +
      `${ampExit.killed ? ' (SIGKILL after 10 s)' : ''}; ` +
      `nats-server exit: code ${natsExit.code} signal ${natsExit.signal}${natsExit.killed ? ' (killed)' : ''}` +
      `${natsExit.code === 1 && !natsExit.killed ? ' (nats-server 2.9 exits 1 after a SIGTERM shutdown)' : ''}`);
  log(`uptime after: ${info.uptimeAfter}`);
  if (opt.logs) log(`logs copied to ${opt.logs}`);
  const lost = tasksInFlight.size + [...messagesInFlight.values()].filter((e) => e.acked).length;
  if (info.ampDied || info.natsDied) return 1;
  if (interrupted) return 130;
  if (lost) {
    log(`FAILED: ${lost} tasks or messages were acknowledged by amp-server but never arrived`);
    return 1;
  }
  return 0;
}

function interrupt() {
  interrupted++;
  if (wakeInterrupted) wakeInterrupted();
}

process.on('SIGINT', () => {
  if (interrupted) {
    console.error('soak: second interrupt: killing the servers');
    process.exit(130); // the exit handler kills the children and removes the temp dir
  }
  log('interrupted: stopping (Ctrl-C again to kill at once)');
  interrupt();
});
process.on('SIGTERM', () => process.emit('SIGINT'));

main().then((code) => {
  process.exitCode = code;
  // Whatever still holds the loop (a ws socket, a timer) must not keep us here.
  setTimeout(() => process.exit(code), 500).unref();
}, (err) => {
  console.error(`soak: ${err.stack || err.message}`);
  process.exitCode = 1;
  killEverythingNow();
  process.exit(1);
});
