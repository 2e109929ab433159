'use strict';
// What every test file shares: the transports to run on, a per-suite environment that
// owns its servers and clients (and cleans them up in `after`, even when a test failed),
// unique namespaces, tokens, HTTP GET.

const crypto = require('node:crypto');
const http = require('node:http');

const { AmpServer, NatsServer, natsBinary } = require('./processes');
const { Client } = require('./client');
const jwt = require('./jwt');

/** Every grant there is (not admin). */
const ALL = Object.freeze({
  send: ['*'],
  submit: ['*'],
  work: ['*'],
  publish: ['>'],
  subscribe: ['>'],
});

/** The transports to run each suite on: AMP_E2E_TRANSPORTS (e.g. "memory"), else both. */
function transports() {
  const env = process.env.AMP_E2E_TRANSPORTS;
  return env ? env.split(',').map((s) => s.trim()).filter(Boolean) : ['memory', 'jetstream'];
}

/** node:test options that skip a JetStream suite when no nats-server can be found. */
function suiteOptions(transport, extra = {}) {
  if (transport === 'jetstream' && !natsBinary()) return { ...extra, skip: 'nats-server not found (set NATS_SERVER)' };
  return extra;
}

let nsCounter = 0;
/** A namespace name no other test of this run uses (so tests on one NATS do not meet). */
function uniqueNs(prefix = 'n') {
  nsCounter += 1;
  return `${prefix}${process.pid.toString(36)}${Date.now().toString(36)}${nsCounter}`.slice(0, 64);
}

/** GET http://127.0.0.1:PORT/PATH → {status, headers, body}. */
function httpGet(url) {
  return new Promise((resolve, reject) => {
    // websocketpp answers one request per connection: no keep-alive agent
    const req = http.get(url, { timeout: 10000, agent: false, headers: { Connection: 'close' } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => {
        body += d;
      });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`GET ${url}: timeout`)));
    req.on('error', reject);
  });
}

/** Resolves after `ms`. Used only where time itself is what is tested (a rate window). */
function delay(ms) {
  return new Promise((resolve) => {
    setTimeout(resolve, ms);
  });
}

/**
 * Polls `fn` (sync or async) until it returns a truthy value, every `stepMs`, at most
 * `timeoutMs`; resolves that value or rejects with `what`.
 */
async function eventually(fn, { timeoutMs = 10000, stepMs = 50, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (err) {
      last = err;
    }
    if (Date.now() >= deadline) throw new Error(`${what} not reached within ${timeoutMs} ms (last: ${last})`);
    await delay(stepMs);
  }
}

/**
 * The environment of one suite on one transport: a nats-server for "jetstream" (started
 * by setup()), the amp-servers and clients the tests make, all ended by teardown().
 */
class Env {
  constructor(transport) {
    this.transport = transport;
    this.secret = crypto.randomBytes(24).toString('hex');
    this.servers = [];
    this.clients = [];
    this.nats = null;
  }

  get durable() {
    return this.transport === 'jetstream';
  }

  async setup() {
    if (this.transport === 'jetstream') this.nats = await NatsServer.start();
    else if (this.transport !== 'memory') throw new Error(`unknown transport ${this.transport}`);
  }

  /**
   * Starts an amp-server with `config` plus the suite's secret and, on JetStream, the
   * suite's nats-server (unless `config.nats` is given).
   */
  async server(config = {}, options = {}) {
    const full = { ...config, auth: { secret: this.secret, ...(config.auth || {}) } };
    if (this.nats && !('nats' in config)) full.nats = { url: this.nats.url };
    const s = await AmpServer.start(full, options);
    this.servers.push(s);
    return s;
  }

  token(ns, sub, grants = ALL, more = {}) {
    return jwt.token(this.secret, { sub, ns, grants: grants === null ? undefined : grants, ...more });
  }

  /** A client that said hello as `sub` in `ns` on `server`; closed at teardown. */
  async connect(server, ns, sub, grants = ALL, options = {}) {
    const c = await Client.connect(server.url, this.token(ns, sub, grants), { name: sub, ...options });
    this.clients.push(c);
    return c;
  }

  /** A client that has not said hello; closed at teardown. */
  async open(server, options = {}) {
    const c = await Client.open(server.url, options);
    this.clients.push(c);
    return c;
  }

  /**
   * Closes every client and stops every server and the nats-server. Then fails if a client
   * got a reply that answered no request of its own, or a second reply to one (spec §1:
   * exactly one reply per id).
   */
  async teardown() {
    const clients = this.clients.splice(0);
    for (const c of clients) c.terminate();
    const anomalies = clients.flatMap((c) => c.anomalies.map((a) => `${c.name}: ${a}`));
    const servers = this.servers.splice(0);
    await Promise.all(servers.map((s) => s.stop().catch(() => {})));
    if (this.nats) {
      const n = this.nats;
      this.nats = null;
      await n.stop();
    }
    if (anomalies.length) throw new Error(`unexpected replies:\n${anomalies.join('\n')}`);
  }
}

module.exports = { ALL, Env, Client, delay, eventually, httpGet, jwt, suiteOptions, transports, uniqueNs };
