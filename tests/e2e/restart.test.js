'use strict';
// kill -9 of amp-server on JetStream (spec §7 leases, §5 inbox; docs/protocol.md
// "Shutdown"): what was acknowledged before the kill is all there after a new amp-server
// starts on the same NATS. And a NATS outage (spec §9 `unavailable`, §10 /readyz). The
// memory transport keeps nothing across a restart, so this suite runs on JetStream only.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');

const { Env, eventually, httpGet, suiteOptions, transports, uniqueNs } = require('./lib/harness');

const CONFIG = {
  inbox_ack_s: 2, // what was in flight to a session of the killed server comes back soon
  jobs: { '*': { lease_s: 30, max_attempts: 3, decline_delay_ms: 100 } },
};

const run = transports().includes('jetstream');

const options = suiteOptions('jetstream', { skip: run ? false : 'jetstream not selected' });

describe('restarts and outages (jetstream)', options, () => {
  const env = new Env('jetstream');
  before(() => env.setup());
  after(() => env.teardown());

  it('a new server on the same NATS: the lease, the queue, the inbox and the topics survive', async () => {
    const ns = uniqueNs();
    const a = await env.server(CONFIG, { name: 'amp-server-a' });

    // Before the kill: a task claimed, a task queued, messages in flight and waiting, events.
    const alice = await env.connect(a, ns, 'alice');
    const worker = await env.connect(a, ns, 'worker');
    const bob = await env.connect(a, ns, 'bob');
    await worker.ok('register', { jobs: ['resize'], slots: 1 });
    const t1 = (await alice.ok('submit', { job: 'resize', body: { n: 1 } })).task;
    await worker.next('offer', 10000, (o) => o.task === t1);
    const claim = await worker.ok('claim', { task: t1 });
    assert.equal(claim.attempt, 1);
    const t2 = (await alice.ok('submit', { job: 'resize', body: { n: 2 } })).task; // no free slot: queued

    const inFlight = await alice.ok('send', { to: 'bob', body: 'delivered, not acked' });
    assert.equal((await bob.next('message')).seq, inFlight.seq);
    const waiting = [];
    for (let i = 0; i < 5; i++) waiting.push((await alice.ok('send', { to: 'carol', body: { i } })).seq);
    const events = [];
    for (let i = 0; i < 3; i++) events.push((await alice.ok('publish', { topic: 'log.a', body: i })).seq);

    // kill -9
    await a.kill();
    for (const c of [alice, worker, bob]) assert.equal((await c.waitClose()).code, 1006);

    const b = await env.server(CONFIG, { name: 'amp-server-b' });

    // The worker reconnects: its lease is in the store, it heartbeats and completes.
    const worker2 = await env.connect(b, ns, 'worker');
    const hb = await worker2.ok('heartbeat', { task: t1 });
    assert.equal(hb.task, t1);
    assert.ok(hb.expires_at >= claim.lease_expires_at);
    const all = await worker2.ok('heartbeat');
    assert.deepEqual(all.leases.map((l) => l.task), [t1]);
    const done = await worker2.ok('complete', { task: t1, result: 'after the kill' });
    assert.equal(done.state, 'completed');

    // The submitter gets the notice on the new server.
    const alice2 = await env.connect(b, ns, 'alice');
    const n1 = await alice2.next('message', 15000, (m) => m.envelope.from === '$broker' && m.envelope.body.task === t1);
    assert.equal(n1.envelope.type, 'amp.task.completed');
    assert.deepEqual(n1.envelope.body, { task: t1, job: 'resize', state: 'completed', attempt: 1, result: 'after the kill' });
    await alice2.ok('ack', { seq: n1.seq });

    // The queued task is offered on the new server.
    await worker2.ok('register', { jobs: ['resize'], slots: 1 });
    const o2 = await worker2.next('offer', 15000);
    assert.deepEqual([o2.task, o2.attempt], [t2, 1]);
    await worker2.ok('claim', { task: t2 });
    await worker2.ok('complete', { task: t2, result: 2 });
    const n2 = await alice2.next('message', 15000, (m) => m.envelope.from === '$broker' && m.envelope.body.task === t2);
    assert.equal(n2.envelope.body.state, 'completed');
    await alice2.ok('ack', { seq: n2.seq });

    // The message that was in flight comes again; those that waited arrive.
    const bob2 = await env.connect(b, ns, 'bob');
    const again = await bob2.next('message', 20000);
    assert.equal(again.seq, inFlight.seq);
    assert.ok(again.delivery >= 2);
    await bob2.ok('ack', { seq: again.seq });
    const carol = await env.connect(b, ns, 'carol');
    const got = [];
    for (let i = 0; i < waiting.length; i++) {
      const m = await carol.next('message', 15000);
      got.push(m.seq);
      await carol.ok('ack', { seq: m.seq });
    }
    assert.deepEqual(got, waiting);

    // The events are in the stream.
    await alice2.ok('subscribe', { topic: 'log.*', sub: 'replay', from: 'all' });
    const replayed = [];
    for (let i = 0; i < events.length; i++) replayed.push((await alice2.next('event')).seq);
    assert.deepEqual(replayed, events);
  });

  it('NATS down: /readyz 503, requests unavailable and nothing stored; NATS back: all works', { timeout: 120000 }, async () => {
    const ns = uniqueNs();
    const s = await env.server(CONFIG, { name: 'amp-server-outage' });
    const alice = await env.connect(s, ns, 'alice');
    const bob = await env.connect(s, ns, 'bob');
    const before = await alice.ok('send', { to: 'bob', body: 'before' });
    assert.equal((await bob.next('message')).seq, before.seq);
    await bob.ok('ack', { seq: before.seq });
    assert.equal((await httpGet(`${s.http}/readyz`)).status, 200);

    await env.nats.kill();
    try {
      await eventually(async () => (await httpGet(`${s.http}/readyz`)).status === 503, { timeoutMs: 20000, what: '/readyz 503' });
      assert.equal((await httpGet(`${s.http}/healthz`)).status, 200, 'the process still serves');
      const [e, p] = await Promise.all([
        alice.request('send', { to: 'bob', body: 'during the outage', msg_id: 'outage-1' }, { timeoutMs: 30000 }),
        bob.request('publish', { topic: 'news.eu', body: 1 }, { timeoutMs: 30000 }),
      ]);
      assert.deepEqual([e.op, e.code], ['error', 'unavailable'], JSON.stringify(e));
      assert.deepEqual([p.op, p.code], ['error', 'unavailable'], JSON.stringify(p));
      assert.equal(alice.isClosed, false, 'the session stays');
    } finally {
      await env.nats.restart();
    }
    await eventually(async () => (await httpGet(`${s.http}/readyz`)).status === 200, { timeoutMs: 30000, what: '/readyz 200' });
    // the failed send stored nothing: the same msg_id is not a duplicate, and bob gets
    // exactly the messages that were acknowledged
    const after = await eventually(async () => {
      const r = await alice.request('send', { to: 'bob', body: 'after', msg_id: 'outage-1' }, { timeoutMs: 30000 });
      return r.op === 'ok' ? r : null;
    }, { timeoutMs: 30000, what: 'a send after NATS came back' });
    assert.equal(after.duplicate, false, 'the send that failed with unavailable was not stored');
    // nats-server 2.9.10 writes a consumer's acks to its store up to ~100 ms after it
    // applied them: 'before', acked just ahead of the kill -9, may come once more, as a
    // redelivery (docs/protocol.md, inbox). Nothing else comes ahead of 'after'.
    let m = await bob.next('message', 30000);
    if (m.seq === before.seq) {
      assert.ok(m.delivery >= 2, `'before' again only as a redelivery: ${JSON.stringify(m)}`);
      await bob.ok('ack', { seq: m.seq });
      m = await bob.next('message', 30000);
    }
    assert.deepEqual([m.seq, m.envelope.body], [after.seq, 'after']);
    await bob.ok('ack', { seq: m.seq });
  });
});
