'use strict';
// 1,000 concurrent sessions on one amp-server: 500 pairs, each participant sends one
// message to its partner and acks the one it receives; every message arrives. Both
// transports.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');

const { Env, httpGet, suiteOptions, transports, uniqueNs } = require('./lib/harness');

const PAIRS = Number(process.env.AMP_E2E_PAIRS || 500);
const CONNECT_BATCH = 50; // connections opened at once

for (const transport of transports()) {
  describe(`1,000 sessions (${transport})`, suiteOptions(transport), () => {
    const env = new Env(transport);
    let s;
    before(async () => {
      await env.setup();
      s = await env.server();
    });
    after(() => env.teardown());

    it(`${PAIRS * 2} sessions exchange ${PAIRS * 2} messages, every one arrives`, { timeout: 120000 }, async () => {
      const ns = uniqueNs();
      const names = [];
      for (let i = 0; i < PAIRS; i++) names.push(`p${i}a`, `p${i}b`);
      const partner = (name) => (name.endsWith('a') ? name.replace(/a$/, 'b') : name.replace(/b$/, 'a'));
      const grants = (name) => ({ send: [partner(name)] });

      const t0 = Date.now();
      const clients = [];
      for (let i = 0; i < names.length; i += CONNECT_BATCH) {
        const batch = names.slice(i, i + CONNECT_BATCH);
        clients.push(...await Promise.all(batch.map((n) => env.connect(s, ns, n, grants(n), { timeoutMs: 30000 }))));
      }
      const connected = Date.now() - t0;
      const metrics = await httpGet(`${s.http}/metrics`);
      assert.match(metrics.body, new RegExp(`^amp_sessions ${names.length}$`, 'm'));

      const t1 = Date.now();
      const received = await Promise.all(clients.map(async (c) => {
        const [sent, m] = await Promise.all([
          c.ok('send', { to: partner(c.name), body: { from: c.name } }, { timeoutMs: 60000 }),
          c.next('message', 60000),
        ]);
        assert.equal(m.envelope.from, partner(c.name));
        assert.equal(m.envelope.to, c.name);
        assert.deepEqual(m.envelope.body, { from: partner(c.name) });
        await c.ok('ack', { seq: m.seq }, { timeoutMs: 60000 });
        return sent.seq;
      }));
      const exchanged = Date.now() - t1;
      assert.equal(received.length, names.length);
      assert.equal(new Set(received).size, names.length, 'every send got its own seq');
      for (const c of clients) assert.deepEqual(c.queued('error'), []);
      console.log(`# ${transport}: ${names.length} sessions connected in ${connected} ms; ` +
          `${names.length} messages sent, received and acked in ${exchanged} ms`);
      await Promise.all(clients.map((c) => c.close()));
    });
  });
}
