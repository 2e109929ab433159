'use strict';
// Child processes of the end-to-end tests: nats-server and amp-server, each on a free
// loopback port with its files in a fresh temporary directory.
//
// Every child is started through `setpriv --pdeathsig SIGKILL` when setpriv exists (it
// execs the program, so the pid is the program's own): the kernel kills it when this test
// process dies, even by SIGKILL. Besides that, every live child is killed when this process
// exits (normally, by an uncaught error, or by SIGINT/SIGTERM/SIGHUP), and the temporary
// directories are removed. Tests call stop()/kill() in their `after` hooks as well.

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const { freePort } = require('./ports.js');

const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => fs.existsSync(p));

const live = new Set(); // ChildProcess objects not yet reaped
const dirs = new Set(); // temporary directories to remove at exit
// AMP_E2E_KEEP=1: temporary directories (with the servers' logs) stay, for a post-mortem.
const keep = Boolean(process.env.AMP_E2E_KEEP);

function killAllNow() {
  for (const child of live) {
    try {
      child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
  for (const dir of keep ? [] : dirs) {
    try {
      fs.rmSync(dir, { recursive: true, force: true });
    } catch {
      // best effort
    }
  }
}

// When a test failed, every child's warnings and errors (amp-server's JSON log lines) and
// its last lines of output go to stderr, which ctest shows with --output-on-failure: what
// the servers said is often the explanation.
const REPORT_LINES = 40;
const children = []; // every Child started, for that post-mortem
function reportChildren(code) {
  if (code === 0) return;
  for (const c of children) {
    const lines = c.output.trimEnd().split('\n');
    const warnings = lines.filter((l) => /"level":"(warn|error)"/.test(l)).slice(-REPORT_LINES);
    const tail = lines.slice(-REPORT_LINES);
    let text = `\n--- ${c.name} (pid ${c.pid}): ${lines.length} lines of output`;
    if (warnings.length > 0) text += `; the last ${warnings.length} warnings and errors ---\n${warnings.join('\n')}\n---`;
    text += ` the last ${tail.length} lines ---\n${tail.join('\n')}\n`;
    fs.writeSync(2, text);
  }
}

process.on('exit', (code) => {
  reportChildren(code);
  killAllNow();
});
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(sig, () => {
    killAllNow();
    process.exit(128 + os.constants.signals[sig]);
  });
}
// `node --test FILE` runs the file in a child of the runner: if the runner goes away (a
// ctest timeout kills it), this process is orphaned; leave then, taking the servers along.
const parentAtStart = process.ppid;
setInterval(() => {
  if (process.ppid !== parentAtStart) process.exit(1);
}, 1000).unref();

// Removes amp-e2e-<pid>-* directories left by test processes that were killed (their
// exit handlers did not run). Once per process.
let swept = false;
function sweepStaleDirs() {
  if (swept || keep) return;
  swept = true;
  let names = [];
  try {
    names = fs.readdirSync(os.tmpdir());
  } catch {
    return;
  }
  for (const name of names) {
    const m = /^amp-e2e-(\d+)-/.exec(name);
    if (!m || Number(m[1]) === process.pid) continue;
    try {
      process.kill(Number(m[1]), 0);
      continue; // its process lives
    } catch (err) {
      if (err.code !== 'ESRCH') continue;
    }
    try {
      fs.rmSync(path.join(os.tmpdir(), name), { recursive: true, force: true });
    } catch {
      // not ours, or in use
    }
  }
}

/** A fresh temporary directory, removed by removeDir() or at exit. */
function makeTempDir(prefix) {
  sweepStaleDirs();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `amp-e2e-${process.pid}-${prefix}-`));
  dirs.add(dir);
  return dir;
}

function removeDir(dir) {
  dirs.delete(dir);
  if (keep) return;
  fs.rmSync(dir, { recursive: true, force: true });
}

/**
 * A child process whose stdout and stderr are kept (in memory and in files of `dir`),
 * with a way to wait for a line of its output.
 */
class Child {
  constructor(name, binary, args, dir) {
    this.name = name;
    this.dir = dir;
    this.output = '';
    this.exited = false;
    this.exitCode = null;
    this.exitSignal = null;
    this.waiters = [];
    const argv = SETPRIV ? [SETPRIV, '--pdeathsig', 'SIGKILL', '--', binary, ...args] : [binary, ...args];
    this.child = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    this.pid = this.child.pid;
    live.add(this.child);
    children.push(this);
    const log = fs.createWriteStream(path.join(dir, `${name}.log`));
    const onData = (chunk) => {
      const text = chunk.toString('utf8');
      this.output += text;
      log.write(text);
      this.checkWaiters();
    };
    this.child.stdout.on('data', onData);
    this.child.stderr.on('data', onData);
    this.exitPromise = new Promise((resolve) => {
      this.child.once('exit', (code, signal) => {
        this.exited = true;
        this.exitCode = code;
        this.exitSignal = signal;
        live.delete(this.child);
        log.end();
        this.checkWaiters();
        resolve({ code, signal });
      });
      this.child.once('error', (err) => {
        this.output += `\n[spawn error: ${err.message}]\n`;
        this.exited = true;
        live.delete(this.child);
        this.checkWaiters();
        resolve({ code: null, signal: null, error: err });
      });
    });
  }

  checkWaiters() {
    this.waiters = this.waiters.filter((w) => !w.check());
  }

  /**
   * Resolves once the output holds a match of `pattern` (a RegExp or a string) after
   * `fromOffset`; rejects when the process exits first or after `timeoutMs`.
   */
  waitForOutput(pattern, timeoutMs, fromOffset = 0) {
    const matches = () => {
      const text = this.output.slice(fromOffset);
      return typeof pattern === 'string' ? text.includes(pattern) : pattern.test(text);
    };
    return new Promise((resolve, reject) => {
      const waiter = {
        check: () => {
          if (matches()) {
            clearTimeout(timer);
            resolve();
            return true;
          }
          if (this.exited) {
            clearTimeout(timer);
            reject(new Error(`${this.name} exited (code ${this.exitCode}, signal ${this.exitSignal}) ` +
                `before printing ${pattern}; its output:\n${this.tail()}`));
            return true;
          }
          return false;
        },
      };
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(new Error(`${this.name} did not print ${pattern} within ${timeoutMs} ms; its output:\n${this.tail()}`));
      }, timeoutMs);
      if (!waiter.check()) this.waiters.push(waiter);
    });
  }

  tail(lines = 40) {
    return this.output.split('\n').slice(-lines).join('\n');
  }

  signal(sig) {
    if (!this.exited) this.child.kill(sig);
  }

  /** Waits for the exit; resolves {code, signal}, or null after `timeoutMs`. */
  async waitExit(timeoutMs = 10000) {
    let timer;
    const timeout = new Promise((resolve) => {
      timer = setTimeout(() => resolve(null), timeoutMs);
    });
    const r = await Promise.race([this.exitPromise, timeout]);
    clearTimeout(timer);
    return r;
  }

  /** SIGKILL, and wait until it is gone. */
  async kill() {
    this.signal('SIGKILL');
    await this.exitPromise;
  }

  /** SIGTERM, wait up to `graceMs`, then SIGKILL. */
  async stop(graceMs = 5000) {
    if (this.exited) return;
    this.signal('SIGTERM');
    if ((await this.waitExit(graceMs)) === null) await this.kill();
  }
}

function natsBinary() {
  if (process.env.NATS_SERVER) return process.env.NATS_SERVER;
  for (const dir of (process.env.PATH || '').split(':').concat(['/usr/sbin', '/usr/bin'])) {
    if (!dir) continue;
    const candidate = path.join(dir, 'nats-server');
    try {
      fs.accessSync(candidate, fs.constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return null;
}

function ampBinary() {
  const p = process.env.AMP_SERVER;
  if (!p) throw new Error('set AMP_SERVER to the amp-server binary (ctest does)');
  return p;
}

/**
 * A nats-server with JetStream on a free loopback port, its store in a temporary directory.
 * With `conf`, the server runs from the configuration file `conf({port, store})` returns
 * (it may be async, to take more free ports) instead: what it sets up is up to it.
 */
class NatsServer {
  static async start({ conf } = {}) {
    const binary = natsBinary();
    if (!binary) throw new Error('nats-server not found: set NATS_SERVER');
    let lastError;
    for (let attempt = 0; attempt < 3; attempt++) {
      const dir = makeTempDir('nats');
      const store = path.join(dir, 'store');
      const port = await freePort();
      let args = ['-js', '-a', '127.0.0.1', '-p', String(port), '-sd', store];
      if (conf) {
        const file = path.join(dir, 'nats.conf');
        fs.writeFileSync(file, await conf({ port, store }));
        args = ['-c', file];
      }
      const child = new Child('nats-server', binary, args, dir);
      try {
        await child.waitForOutput('Server is ready', 15000);
        const s = new NatsServer();
        s.binary = binary;
        s.args = args;
        s.child = child;
        s.dir = dir;
        s.port = port;
        s.url = `nats://127.0.0.1:${port}`;
        return s;
      } catch (err) {
        lastError = err;
        await child.kill();
        removeDir(dir);
        if (!/address already in use/i.test(child.output)) break;
      }
    }
    throw lastError;
  }

  /** SIGKILL: the server is gone at once; the store stays for restart(). */
  async kill() {
    await this.child.kill();
  }

  /** Starts the server again on the same port with the same store (killing it first). */
  async restart() {
    await this.child.kill();
    const child = new Child('nats-server', this.binary, this.args, this.dir);
    this.child = child;
    await child.waitForOutput('Server is ready', 15000);
  }

  /** Stops the server (its store is thrown away: no need to wait for a flush) and removes it. */
  async stop() {
    await this.child.stop(1000);
    removeDir(this.dir);
  }
}

/**
 * An amp-server started with a configuration file (written to a temporary directory with
 * `listen` on a free port and the test secret) and ready once it logged `listening`.
 *
 * `config` is the JSON configuration (without `listen`); `files` maps a file name to its
 * text, written beside the configuration (for `schemas`; relative paths in the
 * configuration are relative to its file).
 */
class AmpServer {
  static async start(config, { files = {}, name = 'amp-server' } = {}) {
    const binary = ampBinary();
    let lastError;
    for (let attempt = 0; attempt < 3; attempt++) {
      const dir = makeTempDir('amp');
      for (const [file, text] of Object.entries(files)) fs.writeFileSync(path.join(dir, file), text);
      const port = await freePort();
      const full = { ...config, listen: `127.0.0.1:${port}` };
      const configPath = path.join(dir, 'config.json');
      fs.writeFileSync(configPath, JSON.stringify(full, null, 2));
      const child = new Child(name, binary, ['--config', configPath], dir);
      try {
        await child.waitForOutput(/"event":"listening"/, 20000);
        const s = new AmpServer();
        s.child = child;
        s.dir = dir;
        s.port = port;
        s.pid = child.pid;
        s.config = full;
        s.url = `ws://127.0.0.1:${port}/amp`;
        s.http = `http://127.0.0.1:${port}`;
        return s;
      } catch (err) {
        lastError = err;
        await child.kill();
        removeDir(dir);
        if (!/cannot listen/.test(child.output)) break;
      }
    }
    throw lastError;
  }

  /** The server's log (stderr: one JSON object per line) so far. */
  log() {
    return this.child.output;
  }

  /** The parsed JSON log lines so far. */
  logEvents() {
    return this.child.output
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => {
        try {
          return JSON.parse(l);
        } catch {
          return null;
        }
      })
      .filter(Boolean);
  }

  /** SIGKILL: the server gets no chance to clean up. The directory stays until stop(). */
  async kill() {
    await this.child.kill();
  }

  /** SIGTERM (then SIGKILL) and remove the directory. */
  async stop() {
    await this.child.stop();
    removeDir(this.dir);
  }
}

module.exports = { AmpServer, NatsServer, natsBinary, freePort, makeTempDir, removeDir };
