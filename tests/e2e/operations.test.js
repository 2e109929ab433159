'use strict';
// Operations (spec §12) over real WebSocket connections, on both transports: scatter with a
// quorum and branch bodies, replies and their votes, the notice, the record as each party
// sees it, the deadline, a fenced retry, a cancel that withdraws what was not acked, and the
// checks of §1. On JetStream also across two amp-servers (§13): an operation started on one
// completes with replies sent to the other, and its deadline is kept by the other when the
// first is gone.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');

const { Env, delay, suiteOptions, transports, uniqueNs } = require('./lib/harness');

const TS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
const CONFIG = { inbox_ack_s: 2, limits: { max_body_bytes: 1024 } };

// The next branch message of `op` for `member`.
function branch(member, op, timeoutMs = 10000) {
  return member.next('message', timeoutMs, (f) => f.envelope.operation && f.envelope.operation.id === op);
}

// The initiator's notice of `op`, acked.
async function notice(initiator, op, timeoutMs = 15000) {
  const m = await initiator.next('message', timeoutMs, (f) => f.envelope.from === '$broker' && f.envelope.body.operation === op);
  await initiator.ok('ack', { seq: m.seq });
  return m.envelope;
}

for (const transport of transports()) {
  describe(`operations (${transport})`, suiteOptions(transport, { concurrency: true }), () => {
    const env = new Env(transport);
    let s;
    before(async () => {
      await env.setup();
      s = await env.server(CONFIG);
    });
    after(() => env.teardown());

    it('a scatter with a quorum: branches, votes, the notice, the record', async () => {
      const ns = uniqueNs();
      const boss = await env.connect(s, ns, 'boss');
      const [alfa, bravo, charlie] = await Promise.all(['alfa', 'bravo', 'charlie'].map((p) => env.connect(s, ns, p)));
      const ok = await boss.ok('scatter', {
        to: ['charlie', 'alfa', 'bravo', 'alfa'], body: { doc: 1 }, bodies: { bravo: { doc: 2 } },
        type: 'review.request', headers: { trace: 't1' }, quorum: 2, timeout_ms: 30000, on_timeout: 'partial',
        idempotency_key: 'review-42',
      });
      assert.match(ok.operation, /^o_[0-9a-z]+$/);
      assert.equal(ok.created, true);
      assert.deepEqual(ok.members, ['alfa', 'bravo', 'charlie']);

      const a = await branch(alfa, ok.operation);
      assert.equal(a.envelope.from, 'boss');
      assert.equal(a.envelope.type, 'review.request');
      assert.deepEqual(a.envelope.body, { doc: 1 });
      assert.deepEqual(a.envelope.headers, { trace: 't1' });
      assert.equal(a.envelope.operation.branch, 'alfa');
      assert.equal(a.envelope.operation.attempt, 1);
      assert.match(a.envelope.operation.reply_by, TS);
      const b = await branch(bravo, ok.operation);
      assert.deepEqual(b.envelope.body, { doc: 2 });
      await branch(charlie, ok.operation);

      // The same key again: the same operation, nothing sent twice.
      const again = await boss.ok('scatter', { to: ['alfa'], body: 0, idempotency_key: 'review-42' });
      assert.deepEqual([again.operation, again.created, again.members], [ok.operation, false, ['alfa', 'bravo', 'charlie']]);

      const no = await alfa.ok('reply', { operation: ok.operation, attempt: 1, accept: false, body: 'no' });
      assert.deepEqual([no.operation, no.state, no.duplicate], [ok.operation, 'open', undefined]);
      const dup = await alfa.ok('reply', { operation: ok.operation, attempt: 1, accept: true });
      assert.deepEqual([dup.state, dup.duplicate], ['open', true]);
      await bravo.fails('reply', { operation: ok.operation, attempt: 2 }, 'conflict');
      await boss.fails('reply', { operation: ok.operation, attempt: 1 }, 'forbidden');
      await alfa.fails('reply', { operation: 'o_unknown', attempt: 1 }, 'not_found');
      assert.equal((await bravo.ok('reply', { operation: ok.operation, attempt: 1, body: { ok: 1 } })).state, 'open');
      assert.equal((await charlie.ok('reply', { operation: ok.operation, attempt: 1 })).state, 'completed');
      await charlie.fails('reply', { operation: ok.operation, attempt: 1 }, 'conflict');

      const n = await notice(boss, ok.operation);
      assert.equal(n.type, 'amp.operation.completed');
      assert.deepEqual(n.body.members, ['alfa', 'bravo', 'charlie']);
      assert.equal(n.body.quorum, 2);
      assert.equal(n.body.state, 'completed');
      assert.deepEqual(n.body.missing, []);
      assert.deepEqual([n.body.replies.alfa.accept, n.body.replies.alfa.body], [false, 'no']);
      assert.deepEqual(n.body.replies.bravo.body, { ok: 1 });
      assert.match(n.body.replies.charlie.at, TS);

      const rec = (await boss.ok('operation', { operation: ok.operation })).operation;
      assert.deepEqual([rec.operation, rec.ns, rec.initiator, rec.quorum, rec.state], [ok.operation, ns, 'boss', 2, 'completed']);
      assert.deepEqual(rec.members, ['alfa', 'bravo', 'charlie']);
      for (const k of ['created_at', 'updated_at', 'timeout_at']) assert.match(rec[k], TS);
      assert.deepEqual(rec.branches.alfa, { attempt: 1, state: 'replied', reply: n.body.replies.alfa });
      assert.equal(typeof rec.revision, 'number');
      const own = (await alfa.ok('operation', { operation: ok.operation })).operation;
      assert.deepEqual(Object.keys(own.branches), ['alfa']);
      const stranger = await env.connect(s, ns, 'mallory');
      await stranger.fails('operation', { operation: ok.operation }, 'not_found');
    });

    it('a multicast completes once stored; rejections fail early; the deadline decides the rest', async () => {
      const ns = uniqueNs();
      const boss = await env.connect(s, ns, 'boss');
      const alfa = await env.connect(s, ns, 'alfa');
      const multi = await boss.ok('scatter', { to: ['alfa', 'bravo'], body: 'hi' });
      const m = await branch(alfa, multi.operation);
      assert.equal(m.envelope.operation.reply_by, null);
      assert.equal((await notice(boss, multi.operation)).type, 'amp.operation.completed');
      await alfa.fails('reply', { operation: multi.operation, attempt: 1 }, 'conflict');
      // Completed already, the record still shows the branch alfa acked.
      await alfa.ok('ack', { seq: m.seq });
      const branches = (await boss.ok('operation', { operation: multi.operation })).operation.branches;
      assert.deepEqual([branches.alfa.state, branches.bravo.state], ['delivered', 'pending']);

      const early = await boss.ok('scatter', { to: ['alfa', 'bravo', 'charlie'], body: 1, quorum: 2, timeout_ms: 60000 });
      await alfa.ok('reply', { operation: early.operation, attempt: 1, accept: false });
      const bravo = await env.connect(s, ns, 'bravo');
      assert.equal((await bravo.ok('reply', { operation: early.operation, attempt: 1, accept: false })).state, 'failed');
      const ef = await notice(boss, early.operation);
      assert.deepEqual([ef.type, ef.body.missing, ef.body.error], ['amp.operation.failed', ['charlie'], undefined]);

      const started = Date.now();
      const partial = await boss.ok('scatter', { to: ['alfa', 'bravo'], body: 1, quorum: 2, timeout_ms: 800, on_timeout: 'partial' });
      const timedOut = await boss.ok('scatter', { to: ['alfa', 'bravo'], body: 1, quorum: 1, timeout_ms: 800 });
      await alfa.ok('reply', { operation: partial.operation, attempt: 1, body: 'yes' });
      const p = await notice(boss, partial.operation, 10000);
      assert.ok(Date.now() - started >= 800, 'not before the deadline');
      assert.deepEqual([p.type, p.body.state, p.body.missing], ['amp.operation.partial', 'partial', ['bravo']]);
      const f = await notice(boss, timedOut.operation, 10000);
      assert.deepEqual([f.type, f.body.state, f.body.error.code], ['amp.operation.failed', 'failed', 'timeout']);
      assert.equal((await boss.ok('operation', { operation: timedOut.operation })).operation.error.code, 'timeout');
      await bravo.fails('reply', { operation: partial.operation, attempt: 1 }, 'conflict');
    });

    it('a retry fences the old attempt; a cancel withdraws what was not acked', async () => {
      const ns = uniqueNs();
      const boss = await env.connect(s, ns, 'boss');
      const [alfa, bravo, charlie] = await Promise.all(['alfa', 'bravo', 'charlie'].map((p) => env.connect(s, ns, p)));
      const ok = await boss.ok('scatter', { to: ['alfa', 'bravo', 'charlie', 'delta'], body: 1, quorum: 4, timeout_ms: 60000 });
      const b1 = await branch(bravo, ok.operation);
      await bravo.fails('retry', { operation: ok.operation, member: 'bravo' }, 'forbidden');
      const r = await boss.ok('retry', { operation: ok.operation, member: 'bravo' });
      assert.deepEqual([r.operation, r.member, r.attempt], [ok.operation, 'bravo', 2]);
      const b2 = await bravo.next('message', 10000, (f) => f.envelope.operation && f.envelope.operation.attempt === 2);
      assert.notEqual(b2.seq, b1.seq);
      await bravo.fails('reply', { operation: ok.operation, attempt: 1 }, 'conflict');

      await alfa.ok('reply', { operation: ok.operation, attempt: 1 });
      const c = await branch(charlie, ok.operation);
      // Once its ack is answered, the branch is delivered: a cancel says unknown for it.
      await charlie.ok('ack', { seq: c.seq });
      const cancelled = await boss.ok('cancel', { operation: ok.operation });
      assert.equal(cancelled.state, 'cancelled');
      assert.deepEqual(cancelled.branches, { alfa: 'already_completed', bravo: 'stopped', charlie: 'unknown', delta: 'stopped' });
      assert.equal((await bravo.next('cancelled')).operation, ok.operation);
      assert.equal((await charlie.next('cancelled')).operation, ok.operation);
      assert.equal((await notice(boss, ok.operation)).type, 'amp.operation.cancelled');
      await boss.fails('cancel', { operation: ok.operation }, 'conflict');
      await boss.fails('cancel', { operation: ok.operation, task: 't_1' }, 'bad_request');

      // Withdrawn: delta, connecting now, and bravo, past the redelivery time, get nothing.
      const delta = await env.connect(s, ns, 'delta');
      await delay(2500);
      assert.equal(delta.queued('message').length, 0);
      // Neither attempt of bravo's comes back: the retry withdrew the first, the cancel the second.
      assert.equal(bravo.queued('message').filter((f) => f.seq === b1.seq || f.seq === b2.seq).length, 0);
    });

    it('checks in the order of section 1, and audiences', async () => {
      const ns = uniqueNs();
      const boss = await env.connect(s, ns, 'boss', { send: ['alfa', 'bravo'] });
      await boss.fails('scatter', { to: 42, body: 1 }, 'bad_request');
      await boss.fails('scatter', { body: 1 }, 'bad_request');
      await boss.fails('scatter', { to: ['alfa'], audience: 'online', body: 1 }, 'bad_request');
      await boss.fails('scatter', { to: ['alfa'], quorum: 1, body: 1 }, 'bad_request');
      await boss.fails('scatter', { to: ['alfa', 'bravo'], quorum: 3, timeout_ms: 1000, body: 1 }, 'bad_request');
      await boss.fails('scatter', { to: ['Alfa'], body: 1 }, 'invalid_name');
      await boss.fails('scatter', { to: ['zulu'], body: 1 }, 'forbidden');
      await boss.fails('scatter', { audience: 'all', body: 1 }, 'forbidden');
      const big = await boss.fails('scatter', { to: ['alfa'], body: 'x'.repeat(2000) }, 'payload_too_large');
      assert.equal(big.path, '/body');
      await boss.fails('scatter', { to: ['alfa'], type: 'bad type', body: 1 }, 'invalid_envelope');
      await boss.fails('reply', { operation: 'nope', attempt: 1 }, 'invalid_name');
      await boss.fails('operation', { operation: 'o_nothere' }, 'not_found');

      const all = await env.connect(s, ns, 'root');
      const alfa = await env.connect(s, ns, 'alfa');
      await alfa.ok('register', { jobs: [] });
      const online = await all.ok('scatter', { audience: 'online', body: 1 });
      assert.deepEqual(online.members, ['alfa']);
      await all.ok('send', { to: 'waiting', body: 1 });
      const everyone = await all.ok('scatter', { audience: 'all', body: 1 });
      assert.deepEqual(everyone.members, ['alfa', 'boss', 'waiting']);
    });
  });
}

const cluster = transports().includes('jetstream');
describe('operations across two amp-servers (jetstream)',
    suiteOptions('jetstream', { skip: cluster ? false : 'jetstream not selected', concurrency: true }), () => {
      const env = new Env('jetstream');
      let a;
      let b;
      before(async () => {
        await env.setup();
        [a, b] = await Promise.all([env.server(CONFIG, { name: 'amp-server-a' }), env.server(CONFIG, { name: 'amp-server-b' })]);
      });
      after(() => env.teardown());

      it('an operation started on one server completes with replies sent to the other', async () => {
        const ns = uniqueNs();
        const boss = await env.connect(a, ns, 'boss');
        const alfa = await env.connect(b, ns, 'alfa');
        const bravo = await env.connect(b, ns, 'bravo');
        const ok = await boss.ok('scatter', { to: ['alfa', 'bravo'], body: 1, quorum: 2, timeout_ms: 30000 });
        await branch(alfa, ok.operation);
        await branch(bravo, ok.operation);
        await alfa.ok('reply', { operation: ok.operation, attempt: 1 });
        assert.equal((await bravo.ok('reply', { operation: ok.operation, attempt: 1 })).state, 'completed');
        assert.equal((await notice(boss, ok.operation)).type, 'amp.operation.completed');
        // A cancel through B reaches members on A.
        const carol = await env.connect(a, ns, 'carol');
        const two = await boss.ok('scatter', { to: ['carol'], body: 1, quorum: 1, timeout_ms: 30000 });
        await branch(carol, two.operation);
        const root = await env.connect(b, ns, 'root');
        await root.fails('cancel', { operation: two.operation }, 'not_found');  // not an admin
        await boss.ok('cancel', { operation: two.operation });
        assert.equal((await carol.next('cancelled')).operation, two.operation);
      });

      it('the deadline of an operation is kept by the other server when the first is gone', async () => {
        const ns = uniqueNs();
        const c = await env.server(CONFIG, { name: 'amp-server-c' });
        const boss = await env.connect(c, ns, 'boss');
        const watcher = await env.connect(b, ns, 'boss');
        const ok = await boss.ok('scatter', { to: ['alfa'], body: 1, quorum: 1, timeout_ms: 1500 });
        await c.kill();
        const n = await notice(watcher, ok.operation, 20000);
        assert.deepEqual([n.type, n.body.error.code], ['amp.operation.failed', 'timeout']);
      });
    });
