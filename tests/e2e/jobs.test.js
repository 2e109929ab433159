'use strict';
// Jobs and tasks (spec §7) and the registry they rely on (spec §4), over real WebSocket
// connections, on both transports.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');

const { Client, Env, suiteOptions, transports, uniqueNs } = require('./lib/harness');

const TS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

const CONFIG = {
  jobs: {
    '*': { lease_s: 30, max_attempts: 3, decline_delay_ms: 100 },
    // short leases for the expiry stories
    quick: { lease_s: 2, max_attempts: 2, decline_delay_ms: 100 },
  },
};

// The next message from $broker about `task` in the submitter's inbox, acked.
async function notice(submitter, task, timeoutMs = 15000) {
  const m = await submitter.next('message', timeoutMs, (f) => f.envelope.from === '$broker' && f.envelope.body.task === task);
  await submitter.ok('ack', { seq: m.seq });
  return m.envelope;
}

for (const transport of transports()) {
  describe(`jobs (${transport})`, suiteOptions(transport, { concurrency: true }), () => {
    const env = new Env(transport);
    let s;
    before(async () => {
      await env.setup();
      s = await env.server(CONFIG);
    });
    after(() => env.teardown());

    it('register, submit, offer, claim, heartbeat, complete, the notice and the history', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const w = await env.connect(s, ns, 'worker');
      const reg = await w.ok('register', { jobs: ['resize'], slots: 1, meta: { zone: 'eu' } });
      assert.equal(reg.expires_in_s, 30);
      const who = await alice.ok('who', { job: 'resize' });
      assert.equal(who.participants.length, 1);
      const entry = who.participants[0];
      assert.deepEqual([entry.participant, entry.jobs, entry.slots, entry.load, entry.meta],
          ['worker', ['resize'], 1, 0, { zone: 'eu' }]);
      assert.match(entry.updated_at, TS);
      assert.match(entry.expires_at, TS);
      assert.deepEqual((await alice.ok('who', { job: 'encode' })).participants, []);

      const sub = await alice.ok('submit', {
        job: 'resize', body: { w: 640 }, type: 'img.resize', headers: { k: 'v' }, from: 'mallory',
      });
      assert.match(sub.task, /^t_/);
      assert.equal(sub.created, true);

      const offer = await w.next('offer');
      assert.equal(offer.task, sub.task);
      assert.equal(offer.job, 'resize');
      assert.equal(offer.attempt, 1);
      assert.equal(offer.max_attempts, 3);
      assert.equal(offer.lease_s, 30);
      assert.equal(offer.envelope.from, 'alice');
      assert.equal(offer.envelope.to, 'resize');
      assert.equal(offer.envelope.ns, ns);
      assert.equal(offer.envelope.type, 'img.resize');
      assert.deepEqual(offer.envelope.headers, { k: 'v' });
      assert.deepEqual(offer.envelope.body, { w: 640 });

      const claim = await w.ok('claim', { task: sub.task });
      assert.equal(claim.task, sub.task);
      assert.equal(claim.attempt, 1);
      assert.match(claim.lease_expires_at, TS);
      await w.fails('claim', { task: sub.task }, 'not_found'); // the offer is gone

      const running = await w.ok('task', { task: sub.task });
      assert.equal(running.task.state, 'running');
      assert.equal(running.task.owner, 'worker');
      assert.equal(running.task.attempt, 1);
      assert.equal(running.task.submitted_by, 'alice');

      const all = await w.ok('heartbeat');
      assert.equal(all.leases.length, 1);
      assert.equal(all.leases[0].task, sub.task);
      assert.match(all.leases[0].expires_at, TS);
      assert.ok(all.leases[0].expires_at >= claim.lease_expires_at);
      const one = await w.ok('heartbeat', { task: sub.task });
      assert.equal(one.task, sub.task);
      assert.match(one.expires_at, TS);
      // load is the number of leases held
      assert.equal((await alice.ok('who', { job: 'resize' })).participants[0].load, 1);

      // only the lease holder may complete or fail
      const eve = await env.connect(s, ns, 'eve');
      await eve.fails('complete', { task: sub.task, result: 'stolen' }, 'lease_lost');
      await eve.fails('fail', { task: sub.task, error: { code: 'x', message: '' } }, 'lease_lost');
      await eve.fails('heartbeat', { task: sub.task }, 'lease_lost');

      const done = await w.ok('complete', { task: sub.task, result: { url: 'x.png' } });
      assert.deepEqual([done.task, done.state], [sub.task, 'completed']);
      assert.notEqual(done.duplicate, true);
      const dup = await w.ok('complete', { task: sub.task, result: { url: 'x.png' } });
      assert.deepEqual([dup.task, dup.state, dup.duplicate], [sub.task, 'completed', true]);
      await w.fails('heartbeat', { task: sub.task }, 'lease_lost');

      const n = await notice(alice, sub.task);
      assert.equal(n.type, 'amp.task.completed');
      assert.equal(n.to, 'alice');
      assert.deepEqual(n.body, { task: sub.task, job: 'resize', state: 'completed', attempt: 1, result: { url: 'x.png' } });

      const h = await alice.ok('task', { task: sub.task, history: true });
      assert.equal(h.task.state, 'completed');
      assert.deepEqual(h.task.result, { url: 'x.png' });
      assert.equal(h.task.ns, ns);
      assert.equal(h.task.job, 'resize');
      assert.equal(h.task.max_attempts, 3);
      assert.ok(h.history.length >= 3, JSON.stringify(h.history));
      assert.equal(h.history[0].state, 'queued');
      assert.equal(h.history[h.history.length - 1].state, 'completed');
      assert.ok(h.history.some((r) => r.state === 'running' && r.owner === 'worker'));
      for (let i = 1; i < h.history.length; i++) assert.ok(h.history[i].revision > h.history[i - 1].revision);
      // a holder sees it too, a stranger does not; cancelling what ended is conflict
      await w.ok('task', { task: sub.task });
      await eve.fails('task', { task: sub.task }, 'not_found');
      await alice.fails('cancel', { task: sub.task }, 'conflict');
    });

    it('a worker with 0 slots gets no offers; registering again replaces the entry', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const w = await env.connect(s, ns, 'worker');
      await w.ok('register', { jobs: ['resize'], slots: 0 });
      const { task } = await alice.ok('submit', { job: 'resize', body: 1 });
      await alice.ok('who'); // some time for an offer that must not come
      await w.ok('who');
      assert.deepEqual(w.queued('offer'), []);
      await w.ok('register', { jobs: ['resize'], slots: 2, meta: { v: 2 } });
      const entry = (await alice.ok('who', { job: 'resize' })).participants[0];
      assert.deepEqual([entry.slots, entry.meta], [2, { v: 2 }]);
      const offer = await w.next('offer');
      assert.equal(offer.task, task);
    });

    it('offers go to the least-loaded worker with a free slot, one task to each', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const w1 = await env.connect(s, ns, 'w1');
      const w2 = await env.connect(s, ns, 'w2');
      await w1.ok('register', { jobs: ['resize'], slots: 2 });
      await w2.ok('register', { jobs: ['resize'], slots: 2 });
      const t1 = (await alice.ok('submit', { job: 'resize', body: 1 })).task;
      const t2 = (await alice.ok('submit', { job: 'resize', body: 2 })).task;
      const [o1, o2] = await Promise.all([w1.next('offer'), w2.next('offer')]);
      assert.deepEqual([o1.task, o2.task].sort(), [t1, t2].sort());
      // a worker with no free slot gets nothing more: w3 with one slot, busy, and w4 free
      const w3 = await env.connect(s, ns, 'w3');
      await w3.ok('register', { jobs: ['encode'], slots: 1 });
      const e1 = (await alice.ok('submit', { job: 'encode', body: 1 })).task;
      assert.equal((await w3.next('offer')).task, e1);
      await w3.ok('claim', { task: e1 });
      const w4 = await env.connect(s, ns, 'w4');
      await w4.ok('register', { jobs: ['encode'], slots: 1 });
      const e2 = (await alice.ok('submit', { job: 'encode', body: 2 })).task;
      assert.equal((await w4.next('offer')).task, e2);
      await w3.ok('who');
      assert.deepEqual(w3.queued('offer'), []);
    });

    it('decline: offered again after decline_delay_ms, without an attempt counted', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const w = await env.connect(s, ns, 'worker');
      await w.ok('register', { jobs: ['resize'] });
      const { task } = await alice.ok('submit', { job: 'resize', body: 1 });
      const o1 = await w.next('offer');
      assert.deepEqual([o1.task, o1.attempt], [task, 1]);
      await w.ok('decline', { task });
      await w.fails('decline', { task }, 'not_found');
      const o2 = await w.next('offer');
      assert.deepEqual([o2.task, o2.attempt], [task, 1]);
      const c = await w.ok('claim', { task });
      assert.equal(c.attempt, 1);
      await w.ok('complete', { task });
      const n = await notice(alice, task);
      assert.deepEqual([n.body.state, n.body.attempt, n.body.result], ['completed', 1, null]);
    });

    it('fail with retry offers it again with the next attempt; without attempts left it fails', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const w = await env.connect(s, ns, 'worker');
      await w.ok('register', { jobs: ['resize'] });
      const { task } = await alice.ok('submit', { job: 'resize', body: 1, max_attempts: 2 });
      assert.equal((await w.next('offer')).max_attempts, 2);
      await w.ok('claim', { task });
      const f1 = await w.ok('fail', { task, error: { code: 'busy', message: 'try later' }, retry: true, retry_delay_ms: 100 });
      assert.deepEqual([f1.task, f1.state, f1.attempt], [task, 'queued', 1]);
      const queued = await alice.ok('task', { task });
      assert.equal(queued.task.owner, null);
      assert.equal(queued.task.lease_expires_at, null);
      const o2 = await w.next('offer');
      assert.deepEqual([o2.task, o2.attempt], [task, 2]);
      assert.equal((await w.ok('claim', { task })).attempt, 2);
      // retry asked, but no attempt left
      const f2 = await w.ok('fail', { task, error: { code: 'broken', message: 'cannot', extra: 1 }, retry: true });
      assert.deepEqual([f2.state, f2.attempt], ['failed', 2]);
      const n = await notice(alice, task);
      assert.equal(n.type, 'amp.task.failed');
      assert.deepEqual([n.body.task, n.body.job, n.body.state, n.body.attempt], [task, 'resize', 'failed', 2]);
      assert.equal(n.body.error.code, 'broken');
      // fail without retry fails at once
      const t2 = (await alice.ok('submit', { job: 'resize', body: 2 })).task;
      await w.next('offer', 10000, (o) => o.task === t2);
      await w.ok('claim', { task: t2 });
      const f3 = await w.ok('fail', { task: t2, error: { code: 'no', message: '' } });
      assert.deepEqual([f3.state, f3.attempt], ['failed', 1]);
      assert.equal((await notice(alice, t2)).body.error.code, 'no');
      await w.fails('fail', { task: t2, error: { code: 'no', message: '' } }, 'lease_lost');
    });

    it('the same idempotency_key returns the same task with created false', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const bob = await env.connect(s, ns, 'bob');
      const first = await alice.ok('submit', { job: 'resize', body: 1, idempotency_key: 'order-42' });
      assert.equal(first.created, true);
      for (let i = 0; i < 3; i++) {
        const again = await alice.ok('submit', { job: 'resize', body: 1, idempotency_key: 'order-42' });
        assert.deepEqual([again.task, again.created], [first.task, false]);
      }
      const other = await alice.ok('submit', { job: 'resize', body: 1, idempotency_key: 'order-43' });
      assert.notEqual(other.task, first.task);
      const bobs = await bob.ok('submit', { job: 'resize', body: 1, idempotency_key: 'order-42' });
      assert.equal(bobs.created, true);
      assert.notEqual(bobs.task, first.task);
      // one task only: a worker gets three offers in all
      const w = await env.connect(s, ns, 'worker');
      await w.ok('register', { jobs: ['resize'], slots: 10 });
      const offered = new Set();
      for (let i = 0; i < 3; i++) offered.add((await w.next('offer')).task);
      assert.deepEqual([...offered].sort(), [first.task, other.task, bobs.task].sort());
      await w.ok('who');
      assert.deepEqual(w.queued('offer'), []);
      // after the task ended, the key still returns it
      await w.ok('claim', { task: first.task });
      await w.ok('complete', { task: first.task, result: 'done' });
      await notice(alice, first.task);
      const later = await alice.ok('submit', { job: 'resize', body: 1, idempotency_key: 'order-42' });
      assert.deepEqual([later.task, later.created], [first.task, false]);
      await w.ok('who');
      assert.deepEqual(w.queued('offer'), [], 'no new task for the key');
    });

    it('cancel: the submitter may, a stranger gets not_found, the holder gets cancelled', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const eve = await env.connect(s, ns, 'eve');
      // a queued task
      const t1 = (await alice.ok('submit', { job: 'nobody-works', body: 1 })).task;
      await eve.fails('cancel', { task: t1 }, 'not_found');
      const c1 = await alice.ok('cancel', { task: t1 });
      assert.equal(c1.state, 'cancelled');
      await alice.fails('cancel', { task: t1 }, 'conflict');
      const n1 = await notice(alice, t1);
      assert.equal(n1.type, 'amp.task.cancelled');
      assert.deepEqual([n1.body.task, n1.body.state], [t1, 'cancelled']);
      assert.equal((await alice.ok('task', { task: t1 })).task.state, 'cancelled');

      // a running task
      const w = await env.connect(s, ns, 'worker');
      await w.ok('register', { jobs: ['resize'] });
      const t2 = (await alice.ok('submit', { job: 'resize', body: 2 })).task;
      await w.next('offer');
      await w.ok('claim', { task: t2 });
      await eve.fails('cancel', { task: t2 }, 'not_found');
      await w.fails('cancel', { task: t2 }, 'not_found'); // the holder is not the submitter
      await alice.ok('cancel', { task: t2 });
      const pushed = await w.next('cancelled');
      assert.deepEqual(pushed, { op: 'cancelled', task: t2 });
      await w.fails('complete', { task: t2, result: 1 }, 'lease_lost');
      assert.equal((await notice(alice, t2)).type, 'amp.task.cancelled');

      // an admin may read and cancel any task of its namespace
      const admin = await env.connect(s, ns, 'root', { admin: true });
      const t3 = (await alice.ok('submit', { job: 'nobody-works', body: 3 })).task;
      assert.equal((await admin.ok('task', { task: t3 })).task.submitted_by, 'alice');
      await admin.ok('cancel', { task: t3 });
      assert.equal((await notice(alice, t3)).type, 'amp.task.cancelled');
    });

    it('an unclaimed offer lapses after lease_s and is offered again without an attempt', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const w = await env.connect(s, ns, 'worker');
      await w.ok('register', { jobs: ['quick'] });
      const { task } = await alice.ok('submit', { job: 'quick', body: 1 });
      const o1 = await w.next('offer');
      assert.deepEqual([o1.task, o1.attempt, o1.lease_s, o1.max_attempts], [task, 1, 2, 2]);
      const o2 = await w.next('offer', 15000);
      assert.deepEqual([o2.task, o2.attempt], [task, 1]);
      const lapse = Client.arrivedAt(o2) - Client.arrivedAt(o1);
      assert.ok(lapse >= 1500, `offered again after ${lapse} ms; lease_s is 2`);
      assert.equal((await w.ok('claim', { task })).attempt, 1);
      await w.ok('complete', { task });
    });

    it('lease expiry: lease_lost, offered again with attempt 2, the late complete is lease_lost', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const w = await env.connect(s, ns, 'worker');
      await w.ok('register', { jobs: ['quick'] });
      const { task } = await alice.ok('submit', { job: 'quick', body: 'slow' });
      await w.next('offer');
      const claim = await w.ok('claim', { task });
      assert.equal(claim.attempt, 1);
      // silent: no heartbeat
      const lost = await w.next('lease_lost', 15000);
      assert.deepEqual(lost, { op: 'lease_lost', task });
      const o2 = await w.next('offer', 15000);
      assert.deepEqual([o2.task, o2.attempt, o2.max_attempts], [task, 2, 2]);
      // the late result of attempt 1
      await w.fails('complete', { task, result: 'late' }, 'lease_lost');
      await w.fails('heartbeat', { task }, 'lease_lost');
      const queued = await alice.ok('task', { task });
      assert.deepEqual([queued.task.state, queued.task.owner], ['queued', null]);
      const c2 = await w.ok('claim', { task });
      assert.equal(c2.attempt, 2);
      await w.ok('complete', { task, result: 'second' });
      const n = await notice(alice, task);
      assert.deepEqual(n.body, { task, job: 'quick', state: 'completed', attempt: 2, result: 'second' });
      const m = await env.connect(s, ns, 'probe', { admin: true });
      const h = await m.ok('task', { task, history: true });
      assert.equal(h.task.attempt, 2);
      // history keeps who held it before the lease expired
      const back = h.history.findIndex((r, i) => i > 0 && r.state === 'queued' && h.history[i - 1].state === 'running');
      assert.ok(back > 0, JSON.stringify(h.history));
      assert.equal(h.history[back - 1].owner, 'worker');
      assert.equal(h.history[back].owner, null);
    });

    it('a lease that expires with no attempt left fails the task with attempts_exhausted', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const w = await env.connect(s, ns, 'worker');
      await w.ok('register', { jobs: ['quick'] });
      const { task } = await alice.ok('submit', { job: 'quick', body: 1, max_attempts: 1 });
      const o = await w.next('offer');
      assert.equal(o.max_attempts, 1);
      await w.ok('claim', { task });
      await w.next('lease_lost', 15000);
      const n = await notice(alice, task);
      assert.equal(n.type, 'amp.task.failed');
      assert.deepEqual([n.body.task, n.body.state, n.body.attempt], [task, 'failed', 1]);
      assert.equal(n.body.error.code, 'attempts_exhausted');
      const r = await alice.ok('task', { task });
      assert.equal(r.task.state, 'failed');
      assert.equal(r.task.error.code, 'attempts_exhausted');
      await w.fails('complete', { task }, 'lease_lost');
    });

    it('heartbeats keep a lease alive past lease_s', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const w = await env.connect(s, ns, 'worker');
      await w.ok('register', { jobs: ['quick'] });
      const { task } = await alice.ok('submit', { job: 'quick', body: 1 });
      await w.next('offer');
      await w.ok('claim', { task });
      const until = Date.now() + 3500; // lease_s is 2
      let beats = 0;
      while (Date.now() < until) {
        await new Promise((resolve) => { setTimeout(resolve, 400); });
        const hb = beats++ % 2 ? await w.ok('heartbeat', { task }) : await w.ok('heartbeat');
        assert.ok(hb.task === task || hb.leases.some((l) => l.task === task), JSON.stringify(hb));
      }
      assert.deepEqual(w.queued('lease_lost'), []);
      await w.ok('complete', { task, result: 'kept' });
      assert.equal((await notice(alice, task)).body.result, 'kept');
    });

    it('bye releases the leases of the session at once; a closed session hands back its offers', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const w1 = await env.connect(s, ns, 'w1');
      await w1.ok('register', { jobs: ['resize'] });
      const { task } = await alice.ok('submit', { job: 'resize', body: 1 });
      await w1.next('offer');
      await w1.ok('claim', { task });
      const w2 = await env.connect(s, ns, 'w2');
      await w2.ok('register', { jobs: ['resize'] });
      const t0 = Date.now();
      await w1.ok('bye');
      assert.equal((await w1.waitClose()).code, 1000);
      const o = await w2.next('offer', 15000);
      assert.deepEqual([o.task, o.attempt], [task, 2]);
      assert.ok(Date.now() - t0 < 15000, 'well before lease_s (30 s)');

      // w2 does not claim but goes away: the offer goes to w3 at once
      const w3 = await env.connect(s, ns, 'w3');
      await w3.ok('register', { jobs: ['resize'] });
      w2.terminate();
      const o3 = await w3.next('offer', 15000);
      assert.deepEqual([o3.task, o3.attempt], [task, 2]);
      await w3.ok('claim', { task });
      await w3.ok('complete', { task });
      assert.equal((await notice(alice, task)).body.attempt, 2);
    });

    it('a result over max_body_bytes is payload_too_large; the lease stays', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const w = await env.connect(s, ns, 'worker');
      await w.ok('register', { jobs: ['resize'] });
      const { task } = await alice.ok('submit', { job: 'resize', body: 1 });
      await w.next('offer');
      await w.ok('claim', { task });
      const e = await w.fails('complete', { task, result: 'r'.repeat(262144) }, 'payload_too_large');
      assert.equal(e.path, '/result');
      await w.ok('heartbeat', { task });
      await w.ok('complete', { task, result: 'small' });
    });
  });
}
