'use strict';
// Two amp-servers on one NATS (spec §5, §7, §8 "Budgets hold across several gateways", §13):
// messages cross from one to the other and reach a participant's sessions on both, workers on
// both share the tasks, the least loaded first whichever server fetched it, a cancel and a
// lost lease reach the holder on the other server, budgets are shared, presence is seen on both. JetStream only: the memory transport lives in one
// process.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');

const { Env, delay, suiteOptions, transports, uniqueNs } = require('./lib/harness');

const CONFIG = {
  jobs: { '*': { lease_s: 30, max_attempts: 3, decline_delay_ms: 100 }, quick: { lease_s: 2, max_attempts: 3 } },
  policy: { participants: { budgeted: { budget: { per_day: 4 } } } },
};

const run = transports().includes('jetstream');

const options = suiteOptions('jetstream', { skip: run ? false : 'jetstream not selected', concurrency: true });

describe('two amp-servers on one NATS (jetstream)', options, () => {
  const env = new Env('jetstream');
  let a;
  let b;
  before(async () => {
    await env.setup();
    [a, b] = await Promise.all([env.server(CONFIG, { name: 'amp-server-a' }), env.server(CONFIG, { name: 'amp-server-b' })]);
  });
  after(() => env.teardown());

  it('a participant on server A sends to a participant on server B, and back', async () => {
    const ns = uniqueNs();
    const alice = await env.connect(a, ns, 'alice');
    const bob = await env.connect(b, ns, 'bob');
    const sent = await alice.ok('send', { to: 'bob', body: 'from A', correlation: 'c-9' });
    const m = await bob.next('message');
    assert.deepEqual([m.seq, m.envelope.from, m.envelope.body, m.envelope.correlation], [sent.seq, 'alice', 'from A', 'c-9']);
    await bob.ok('ack', { seq: m.seq });
    const reply = await bob.ok('send', { to: 'alice', body: 'from B', correlation: 'c-9' });
    const r = await alice.next('message');
    assert.deepEqual([r.seq, r.envelope.from, r.envelope.body], [reply.seq, 'bob', 'from B']);
    await alice.ok('ack', { seq: r.seq });
    // topics too
    await bob.ok('subscribe', { topic: 'news.>', sub: 'n' });
    const p = await alice.ok('publish', { topic: 'news.eu', body: 1 });
    assert.equal((await bob.next('event')).seq, p.seq);
  });

  it('a participant connected to both servers gets each message on both sessions, acked once (§5, §13)', async () => {
    const ns = uniqueNs();
    const alice = await env.connect(a, ns, 'alice');
    const onA = await env.connect(a, ns, 'bob');
    const onB = await env.connect(b, ns, 'bob');
    const sent = [];
    for (let i = 0; i < 5; i++) sent.push((await alice.ok('send', { to: 'bob', body: i })).seq);
    const seen = async (session) => {
      const got = new Map();
      while (got.size < sent.length) {
        const m = await session.next('message', 10000);
        assert.equal(m.delivery, 1, `${session.name}: a first delivery`);
        got.set(m.seq, m.envelope.body);
      }
      return got;
    };
    const [gotA, gotB] = await Promise.all([seen(onA), seen(onB)]);
    for (const [i, seq] of sent.entries()) {
      assert.equal(gotA.get(seq), i);
      assert.equal(gotB.get(seq), i);
    }
    // Acked through either server: settled for both.
    for (const [i, seq] of sent.entries()) await (i % 2 ? onA : onB).ok('ack', { seq });
    await delay(300); // the other server hears of it over NATS
    for (const [i, seq] of sent.entries()) await (i % 2 ? onB : onA).fails('ack', { seq }, 'not_found');
    await delay(300);
    assert.deepEqual([onA.queued('message'), onB.queued('message')], [[], []]);
  });

  it('workers on both servers share the tasks; each task is completed exactly once', async () => {
    const ns = uniqueNs();
    const submitter = await env.connect(a, ns, 'submitter');
    const workers = [await env.connect(a, ns, 'wa'), await env.connect(b, ns, 'wb')];
    const completedBy = new Map(); // task → worker
    const perWorker = { wa: 0, wb: 0 };
    let stop = false;
    // Both registered before the first submit: a worker still registering when the tasks
    // arrive (a loaded machine) would leave them all to the other server.
    await Promise.all(workers.map((w) => w.ok('register', { jobs: ['resize'], slots: 2 })));
    const loops = workers.map(async (w) => {
      while (!stop) {
        let offer;
        try {
          offer = await w.next('offer', 500);
        } catch {
          continue;
        }
        const claim = await w.request('claim', { task: offer.task });
        if (claim.op !== 'ok') continue; // (cannot happen: one offer per task at a time)
        await delay(30); // some work, so that both servers get their share
        const done = await w.ok('complete', { task: offer.task, result: w.name });
        assert.notEqual(done.duplicate, true);
        assert.equal(completedBy.has(offer.task), false, `task ${offer.task} completed twice`);
        completedBy.set(offer.task, w.name);
        perWorker[w.name] += 1;
      }
    });
    const N = 30;
    const tasks = [];
    for (let i = 0; i < N; i++) tasks.push((await submitter.ok('submit', { job: 'resize', body: i })).task);
    const notices = new Map();
    // A worker loop that fails (an assertion, a request without a reply) fails the test at
    // once, with its own error, instead of leaving the notices to time out one by one.
    const aLoopFailed = Promise.race(loops.map((loop) => loop.then(() => new Promise(() => {}))));
    aLoopFailed.catch(() => {}); // seen by the race below, and again by Promise.all(loops)
    try {
      while (notices.size < N) {
        const next = submitter.next('message', 20000, (f) => f.envelope.from === '$broker');
        const m = await Promise.race([next, aLoopFailed]);
        await submitter.ok('ack', { seq: m.seq });
        assert.equal(m.envelope.type, 'amp.task.completed');
        assert.equal(notices.has(m.envelope.body.task), false, `two notices for ${m.envelope.body.task}`);
        notices.set(m.envelope.body.task, m.envelope.body.result);
      }
    } finally {
      stop = true;
      await Promise.all(loops);
    }
    assert.deepEqual([...notices.keys()].sort(), [...tasks].sort());
    assert.deepEqual([...completedBy.keys()].sort(), [...tasks].sort());
    for (const [task, by] of completedBy) assert.equal(notices.get(task), by);
    assert.ok(perWorker.wa > 0 && perWorker.wb > 0, `both servers' workers got tasks: ${JSON.stringify(perWorker)}`);
    assert.equal(perWorker.wa + perWorker.wb, N);
  });

  it('an offer goes to the least loaded worker, whichever server it is on (§7, §13)', async () => {
    const ns = uniqueNs();
    const submitter = await env.connect(a, ns, 'submitter');
    const watcher = await env.connect(a, ns, 'watcher');
    await watcher.ok('watch');
    const w1 = await env.connect(a, ns, 'w1');
    await w1.ok('register', { jobs: ['resize'], slots: 4 });
    for (let i = 0; i < 2; i++) {
      const task = (await submitter.ok('submit', { job: 'resize', body: i })).task;
      assert.equal((await w1.next('offer', 10000)).task, task);
      await w1.ok('claim', { task });
    }
    // w2 on server B, idle: server A hears of it (the registry, and B's word on its workers).
    const w2 = await env.connect(b, ns, 'w2');
    await w2.ok('register', { jobs: ['resize'], slots: 4 });
    await watcher.next('presence', 10000, (p) => p.participant === 'w2' && p.state === 'up');
    await delay(300);
    // 0/4 and 1/4 are less than w1's 2/4: both are w2's, whichever server fetched them.
    const tasks = [];
    for (let i = 0; i < 2; i++) {
      const task = (await submitter.ok('submit', { job: 'resize', body: 10 + i })).task;
      tasks.push(task);
      const o = await w2.next('offer', 10000);
      assert.equal(o.task, task);
      assert.equal(o.envelope.from, 'submitter');
      const claimed = await w2.ok('claim', { task });
      assert.equal(claimed.attempt, 1);
    }
    await delay(200);
    assert.deepEqual(w1.queued('offer'), []);
    for (const task of tasks) assert.equal((await w2.ok('complete', { task, result: 'b' })).state, 'completed');
  });

  it('a task cancelled through server A: its worker on server B is told at once (§7, §13)', async () => {
    const ns = uniqueNs();
    const alice = await env.connect(a, ns, 'alice');
    const w = await env.connect(b, ns, 'worker');
    await w.ok('register', { jobs: ['resize'] });
    const task = (await alice.ok('submit', { job: 'resize', body: 1 })).task;
    await w.next('offer', 10000);
    const claimed = await w.ok('claim', { task });
    await alice.ok('cancel', { task });
    // Well before the lease's 30 s would run out.
    const pushed = await w.next('cancelled', 5000);
    assert.deepEqual(pushed, { op: 'cancelled', task });
    await w.fails('complete', { task, result: 1, attempt: claimed.attempt }, 'lease_lost');
    // No longer a lease of the worker's session.
    assert.deepEqual((await w.ok('heartbeat')).leases, []);
    assert.deepEqual(w.queued('lease_lost'), []);
  });

  it("a holder whose session on the lease's server is gone hears lease_lost and cancelled on the other (§7, §13)", async () => {
    const ns = uniqueNs();
    const alice = await env.connect(b, ns, 'alice');
    const onA = await env.connect(a, ns, 'worker');
    await onA.ok('register', { jobs: ['quick'], slots: 2 });
    const claimed = [];
    for (let i = 0; i < 2; i++) {
      const task = (await alice.ok('submit', { job: 'quick', body: i })).task;
      assert.equal((await onA.next('offer', 10000)).task, task);
      await onA.ok('claim', { task });
      claimed.push(task);
    }
    const onB = await env.connect(b, ns, 'worker');
    await onA.close(); // the leases stay with server A's job queue
    await alice.ok('cancel', { task: claimed[0] });
    assert.deepEqual(await onB.next('cancelled', 5000), { op: 'cancelled', task: claimed[0] });
    // The other lease (2 s) runs out on server A: its holder is told on server B.
    assert.deepEqual(await onB.next('lease_lost', 10000), { op: 'lease_lost', task: claimed[1] });
  });

  it('a budget holds across the two servers', async () => {
    const ns = uniqueNs();
    const onA = await env.connect(a, ns, 'budgeted');
    const onB = await env.connect(b, ns, 'budgeted');
    await onA.ok('send', { to: 'bob', body: 1 });
    await onB.ok('send', { to: 'bob', body: 2 });
    await onA.ok('publish', { topic: 'news.eu', body: 3 });
    await onB.ok('submit', { job: 'resize', body: 4 });
    await onA.fails('send', { to: 'bob', body: 5 }, 'budget_exhausted');
    await onB.fails('send', { to: 'bob', body: 6 }, 'budget_exhausted');
    await onB.fails('publish', { topic: 'news.eu', body: 7 }, 'budget_exhausted');
    // another participant is not affected
    const other = await env.connect(b, ns, 'other');
    await other.ok('send', { to: 'bob', body: 8 });
  });

  it('presence: a watcher on one server sees a worker register and leave on the other', async () => {
    const ns = uniqueNs();
    const watcher = await env.connect(a, ns, 'watcher');
    await watcher.ok('watch');
    const w = await env.connect(b, ns, 'w');
    await w.ok('register', { jobs: ['resize'] });
    const up = await watcher.next('presence', 10000, (p) => p.participant === 'w');
    assert.deepEqual([up.state, up.reason], ['up', 'registered']);
    assert.deepEqual((await watcher.ok('who', { job: 'resize' })).participants.map((p) => p.participant), ['w']);
    await w.ok('bye');
    const down = await watcher.next('presence', 10000, (p) => p.participant === 'w');
    assert.deepEqual([down.state, down.reason], ['down', 'left']);
  });
});
