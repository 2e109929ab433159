'use strict';
// A small amp.v1 client over the `ws` package, for tests: requests with an `id` return a
// promise of their reply (`ok` or `error`), everything else (pushes, and errors with
// `"id":null`) lands in a queue that next(op) takes from.

const assert = require('node:assert/strict');
const WebSocket = require('ws');

const ORDER = Symbol('order'); // arrival number of a frame on its connection
const ARRIVED = Symbol('arrived'); // Date.now() when it arrived

function describeFrame(f) {
  const s = JSON.stringify(f);
  return s.length > 300 ? `${s.slice(0, 300)}…` : s;
}

// An error whose stack is that of `site` (an Error made where the waiting began): a
// timeout fires from a timer, whose own stack names no test line.
function errorAt(site, message) {
  const err = new Error(message);
  err.stack = `Error: ${message}\n${site.stack.split('\n').slice(1).join('\n')}`;
  return err;
}

class Client {
  /**
   * Opens a WebSocket to `url`. `protocols`: the subprotocols to offer (default
   * ["amp.v1"]; [] offers none). Rejects when the handshake is refused: the error has
   * `statusCode` when the server answered with HTTP instead of upgrading.
   */
  static open(url, { protocols = ['amp.v1'], timeoutMs = 10000, name = 'client' } = {}) {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, protocols, { handshakeTimeout: timeoutMs, maxPayload: 256 * 1024 * 1024 });
      const client = new Client(ws, name);
      let settled = false;
      ws.once('open', () => {
        settled = true;
        resolve(client);
      });
      ws.once('unexpected-response', (req, res) => {
        settled = true;
        let body = '';
        res.on('data', (d) => {
          body += d;
        });
        res.on('end', () => {
          const err = new Error(`handshake refused: HTTP ${res.statusCode} ${body.trim()}`);
          err.statusCode = res.statusCode;
          err.body = body;
          err.headers = res.headers;
          reject(err);
        });
        res.on('error', () => {});
        req.destroy();
      });
      ws.on('error', (err) => {
        if (!settled) {
          settled = true;
          reject(err);
        }
      });
    });
  }

  /** open(), then hello with `token`; resolves the client once the hello is ok. */
  static async connect(url, token, options = {}) {
    const c = await Client.open(url, options);
    try {
      c.helloReply = await c.ok('hello', { token });
    } catch (err) {
      c.terminate();
      throw err;
    }
    return c;
  }

  constructor(ws, name) {
    this.ws = ws;
    this.name = name;
    this.nextId = 1;
    this.count = 0;
    this.pending = new Map(); // JSON of an id → {resolve, reject, timer}
    this.answered = new Set(); // JSON of the ids that got their reply
    this.anomalies = []; // replies that answer no request, or answer one twice (spec §1)
    this.queue = []; // frames not taken as replies
    this.waiters = [];
    this.log = []; // every frame received, in order
    this.isClosed = false;
    this.closeInfo = null;
    this.closed = new Promise((resolve) => {
      ws.on('close', (code, reason) => {
        this.isClosed = true;
        this.closeInfo = { code, reason: reason.toString(), at: Date.now() };
        for (const [, p] of this.pending) {
          clearTimeout(p.timer);
          p.reject(new Error(`${this.name}: connection closed (${code}) before the reply to ${p.what}`));
        }
        this.pending.clear();
        this.wake();
        resolve(this.closeInfo);
      });
    });
    ws.on('error', () => {}); // reported through 'close'
    ws.on('message', (data, isBinary) => {
      let frame;
      try {
        frame = JSON.parse(data.toString('utf8'));
      } catch {
        frame = { op: '<unparsable>', text: data.toString('utf8'), binary: isBinary };
      }
      Object.defineProperty(frame, ORDER, { value: this.count++, enumerable: false });
      Object.defineProperty(frame, ARRIVED, { value: Date.now(), enumerable: false });
      this.log.push(frame);
      if ((frame.op === 'ok' || frame.op === 'error') && frame.id !== null && frame.id !== undefined) {
        const key = JSON.stringify(frame.id);
        const p = this.pending.get(key);
        if (p) {
          this.pending.delete(key);
          this.answered.add(key);
          clearTimeout(p.timer);
          p.resolve(frame);
          return;
        }
        this.anomalies.push(`${this.answered.has(key) ? 'a second reply' : 'a reply to no request'}: ${describeFrame(frame)}`);
      }
      this.queue.push(frame);
      this.wake();
    });
  }

  get protocol() {
    return this.ws.protocol;
  }

  /** The arrival number of a frame received on this connection. */
  static order(frame) {
    return frame[ORDER];
  }

  /** When a frame arrived (Date.now()). */
  static arrivedAt(frame) {
    return frame[ARRIVED];
  }

  wake() {
    this.waiters = this.waiters.filter((w) => !w.check());
  }

  /** Sends text as it is. */
  sendRaw(text) {
    this.ws.send(text);
  }

  sendBinary(buffer) {
    this.ws.send(buffer, { binary: true });
  }

  /** Sends a frame object as JSON, without waiting for anything. */
  send(frame) {
    this.ws.send(JSON.stringify(frame));
  }

  /**
   * Sends `text` (a frame whose id is `id`) and resolves its reply frame. Use it for
   * frames that JSON.stringify of an object cannot produce.
   */
  requestRaw(text, id, { timeoutMs = 15000, what = text.slice(0, 80) } = {}) {
    const site = new Error();
    return new Promise((resolve, reject) => {
      if (this.isClosed) {
        reject(new Error(`${this.name}: connection closed (${this.closeInfo.code}); cannot send ${what}`));
        return;
      }
      const key = JSON.stringify(id);
      const timer = setTimeout(() => {
        this.pending.delete(key);
        reject(errorAt(site, `${this.name}: no reply to ${what} within ${timeoutMs} ms; last frames: ` +
            this.log.slice(-5).map(describeFrame).join(' | ')));
      }, timeoutMs);
      this.pending.set(key, { resolve, reject, timer, what });
      this.ws.send(text);
    });
  }

  /**
   * Sends {op, id, ...fields} and resolves the reply (ok or error). `fields.id`, when
   * present, is used as the id; otherwise the client numbers its requests.
   */
  request(op, fields = {}, options = {}) {
    const id = Object.prototype.hasOwnProperty.call(fields, 'id') ? fields.id : this.nextId++;
    const frame = { op, id, ...fields };
    return this.requestRaw(JSON.stringify(frame), id, { what: `${op} #${JSON.stringify(id)}`, ...options });
  }

  /** request(), asserting an ok; resolves the ok frame. */
  async ok(op, fields = {}, options = {}) {
    const reply = await this.request(op, fields, options);
    assert.equal(reply.op, 'ok', `${this.name}: ${op} ${describeFrame(fields)} answered ${describeFrame(reply)}`);
    return reply;
  }

  /** request(), asserting an error with `code`; resolves the error frame. */
  async fails(op, fields, code, options = {}) {
    const reply = await this.request(op, fields, options);
    assert.equal(reply.op, 'error', `${this.name}: ${op} ${describeFrame(fields)} should fail with ${code}, ` +
        `got ${describeFrame(reply)}`);
    assert.equal(reply.code, code, `${this.name}: ${op} ${describeFrame(fields)}: ${describeFrame(reply)}`);
    assert.equal(typeof reply.message, 'string');
    return reply;
  }

  /**
   * Takes the first queued frame with `op` (a string, or an array of ops) for which `pred`
   * holds, waiting at most `timeoutMs` for it. Rejects on timeout, or when the connection
   * closed without it.
   */
  next(op, timeoutMs = 10000, pred = () => true) {
    const ops = Array.isArray(op) ? op : [op];
    const site = new Error();
    return new Promise((resolve, reject) => {
      const waiter = {
        check: () => {
          const i = this.queue.findIndex((f) => ops.includes(f.op) && pred(f));
          if (i >= 0) {
            const [frame] = this.queue.splice(i, 1);
            clearTimeout(timer);
            resolve(frame);
            return true;
          }
          if (this.isClosed) {
            clearTimeout(timer);
            reject(new Error(`${this.name}: connection closed (${this.closeInfo.code} ${this.closeInfo.reason}) ` +
                `while waiting for ${op}; queued: ${this.queue.map(describeFrame).join(' | ')}`));
            return true;
          }
          return false;
        },
      };
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(errorAt(site, `${this.name}: no ${op} within ${timeoutMs} ms; queued: ` +
            (this.queue.map(describeFrame).join(' | ') || 'nothing')));
      }, timeoutMs);
      if (!waiter.check()) this.waiters.push(waiter);
    });
  }

  /** The queued frames with `op` (without taking them). */
  queued(op) {
    return this.queue.filter((f) => f.op === op);
  }

  /** Resolves {code, reason} once closed, or rejects after `timeoutMs`. */
  waitClose(timeoutMs = 10000) {
    let timer;
    return Promise.race([
      this.closed.finally(() => clearTimeout(timer)),
      new Promise((resolve, reject) => {
        timer = setTimeout(() => reject(new Error(`${this.name}: still open after ${timeoutMs} ms`)), timeoutMs);
      }),
    ]);
  }

  /** A clean close from the client (1000), resolving once closed. */
  async close() {
    if (this.isClosed) return this.closeInfo;
    try {
      this.ws.close(1000);
    } catch {
      this.ws.terminate();
    }
    let timer;
    const r = await Promise.race([
      this.closed,
      new Promise((resolve) => {
        timer = setTimeout(resolve, 3000);
      }),
    ]);
    clearTimeout(timer);
    if (!r) this.ws.terminate();
    return this.closed;
  }

  /** Drops the TCP connection without a close handshake. */
  terminate() {
    this.ws.terminate();
  }
}

module.exports = { Client };
