'use strict';
// Two regions on loopback (seed 000: leaf nodes; spec §13): a hub nats-server with JetStream
// in domain `hub`, and a leaf nats-server without JetStream connected to it. An amp-server
// on each; the leaf's names the hub's domain (`nats.domain`), so both keep their data in the
// hub's JetStream and are one broker. Then the leaf's nats-server goes away: the leaf's
// amp-server answers `unavailable` and /readyz 503, nothing acknowledged is lost, and when
// the leaf comes back traffic goes on.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');

const { Env, eventually, httpGet, suiteOptions, transports, uniqueNs } = require('./lib/harness');
const { NatsServer } = require('./lib/processes');
const { freePort } = require('./lib/ports');

const CONFIG = {
  jobs: { '*': { lease_s: 30, max_attempts: 3, decline_delay_ms: 100 } },
};

const run = transports().includes('jetstream');

const options = suiteOptions('jetstream', { skip: run ? false : 'jetstream not selected' });

describe('a hub and a leaf node, one broker (jetstream)', options, () => {
  const env = new Env('jetstream');
  let hubNats;
  let leafNats;
  let hub;
  let leaf;
  before(async () => {
    let leafPort;
    hubNats = await NatsServer.start({
      conf: async ({ port, store }) => {
        leafPort = await freePort();
        return [
          `listen: "127.0.0.1:${port}"`,
          `jetstream { store_dir: "${store}", domain: hub }`,
          `leafnodes { listen: "127.0.0.1:${leafPort}" }`,
        ].join('\n');
      },
    });
    leafNats = await NatsServer.start({
      conf: async ({ port }) =>
        [`listen: "127.0.0.1:${port}"`, `leafnodes { remotes: [ { url: "nats-leaf://127.0.0.1:${leafPort}" } ] }`].join('\n'),
    });
    await leafNats.child.waitForOutput(/Leafnode connection created/i, 15000);
    [hub, leaf] = await Promise.all([
      env.server({ ...CONFIG, nats: { url: hubNats.url } }, { name: 'amp-server-hub' }),
      env.server({ ...CONFIG, nats: { url: leafNats.url, domain: 'hub' } }, { name: 'amp-server-leaf' }),
    ]);
  });
  after(async () => {
    await env.teardown();
    await Promise.all([leafNats, hubNats].filter(Boolean).map((n) => n.stop()));
  });

  it('participants on either side exchange messages, topics, tasks and presence', async () => {
    const ns = uniqueNs();
    const alice = await env.connect(hub, ns, 'alice');
    const bob = await env.connect(leaf, ns, 'bob');
    const watcher = await env.connect(hub, ns, 'watcher');
    await watcher.ok('watch');

    const sent = await alice.ok('send', { to: 'bob', body: 'from the hub' });
    const m = await bob.next('message');
    assert.deepEqual([m.seq, m.envelope.from, m.envelope.body], [sent.seq, 'alice', 'from the hub']);
    await bob.ok('ack', { seq: m.seq });
    const back = await bob.ok('send', { to: 'alice', body: 'from the leaf' });
    assert.equal((await alice.next('message')).seq, back.seq);

    await alice.ok('subscribe', { topic: 'news.>', sub: 'n' });
    const ev = await bob.ok('publish', { topic: 'news.eu', body: 1 });
    assert.equal((await alice.next('event')).seq, ev.seq);

    await bob.ok('register', { jobs: ['resize'] });
    const up = await watcher.next('presence', 10000, (p) => p.participant === 'bob');
    assert.deepEqual([up.state, up.reason], ['up', 'registered']);
    const task = (await alice.ok('submit', { job: 'resize', body: { w: 1 } })).task;
    const offer = await bob.next('offer', 10000);
    assert.equal(offer.task, task);
    await bob.ok('claim', { task });
    assert.equal((await bob.ok('complete', { task, result: 'done on the leaf' })).state, 'completed');
    const notice = await alice.next('message', 10000, (x) => x.envelope.from === '$broker');
    assert.deepEqual([notice.envelope.type, notice.envelope.body.result], ['amp.task.completed', 'done on the leaf']);
    const record = await alice.ok('task', { task });
    assert.equal(record.task.state, 'completed');
  });

  it('the leaf cut off: unavailable and /readyz 503 on its side, nothing acknowledged lost, then all resumes', { timeout: 120000 }, async () => {
    const ns = uniqueNs();
    const alice = await env.connect(hub, ns, 'alice');
    const bob = await env.connect(leaf, ns, 'bob');
    const acked = [];
    for (let i = 0; i < 3; i++) acked.push((await bob.ok('send', { to: 'alice', body: i })).seq);
    assert.equal((await httpGet(`${leaf.http}/readyz`)).status, 200);

    await leafNats.kill();
    try {
      await eventually(async () => (await httpGet(`${leaf.http}/readyz`)).status === 503, { timeoutMs: 20000, what: 'leaf /readyz 503' });
      assert.equal((await httpGet(`${hub.http}/readyz`)).status, 200, 'the hub side stays ready');
      const e = await bob.request('send', { to: 'alice', body: 'during', msg_id: 'cut-1' }, { timeoutMs: 30000 });
      assert.deepEqual([e.op, e.code], ['error', 'unavailable'], JSON.stringify(e));
      // The hub side goes on meanwhile.
      const carol = await env.connect(hub, ns, 'carol');
      const c = await carol.ok('send', { to: 'alice', body: 'from carol' });
      acked.push(c.seq);
    } finally {
      await leafNats.restart();
    }
    await eventually(async () => (await httpGet(`${leaf.http}/readyz`)).status === 200, { timeoutMs: 30000, what: 'leaf /readyz 200' });
    const after = await eventually(async () => {
      const r = await bob.request('send', { to: 'alice', body: 'after', msg_id: 'cut-1' }, { timeoutMs: 30000 });
      return r.op === 'ok' ? r : null;
    }, { timeoutMs: 30000, what: 'a send from the leaf after it came back' });
    assert.equal(after.duplicate, false, 'the send refused during the cut was not stored');
    acked.push(after.seq);
    // alice gets every acknowledged message, once, in order, and nothing else.
    const got = [];
    while (got.length < acked.length) {
      const m = await alice.next('message', 30000);
      got.push(m.seq);
      await alice.ok('ack', { seq: m.seq });
    }
    assert.deepEqual(got, acked);
  });
});
