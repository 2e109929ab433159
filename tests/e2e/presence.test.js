'use strict';
// Presence (spec §4): watch, entries that expire without heartbeats, bye; on both
// transports, with registry_ttl_s 2 and heartbeat_s 1.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');

const { Client, Env, delay, suiteOptions, transports, uniqueNs } = require('./lib/harness');

const TS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

for (const transport of transports()) {
  describe(`presence (${transport})`, suiteOptions(transport, { concurrency: true }), () => {
    const env = new Env(transport);
    let s;
    before(async () => {
      await env.setup();
      s = await env.server({ registry_ttl_s: 2, heartbeat_s: 1 });
    });
    after(() => env.teardown());

    const presence = (c, participant, state, timeoutMs = 10000) =>
      c.next('presence', timeoutMs, (p) => p.participant === participant && p.state === state);

    it('watch; up on register; down "expired" without heartbeats; heartbeats keep an entry', async () => {
      const ns = uniqueNs();
      const watcher = await env.connect(s, ns, 'watcher');
      assert.equal(watcher.helloReply.heartbeat_s, 1);
      assert.equal(watcher.helloReply.registry_ttl_s, 2);
      const w = await watcher.ok('watch');
      assert.deepEqual(w.participants, []);

      const silent = await env.connect(s, ns, 'silent');
      const busy = await env.connect(s, ns, 'busy');
      const reg = await silent.ok('register', { jobs: ['resize'], slots: 2, meta: { zone: 'eu' } });
      assert.equal(reg.expires_in_s, 2);
      await busy.ok('register', { jobs: [] });

      const up = await presence(watcher, 'silent', 'up');
      assert.equal(up.reason, 'registered');
      const { updated_at: u, expires_at: x, ...entry } = up.entry;
      assert.deepEqual(entry, { participant: 'silent', jobs: ['resize'], slots: 2, load: 0, meta: { zone: 'eu' } });
      assert.match(u, TS);
      assert.match(x, TS);
      assert.equal((await presence(watcher, 'busy', 'up')).reason, 'registered');

      // `busy` heartbeats every 500 ms; `silent` says nothing and expires
      let beating = true;
      const beats = (async () => {
        while (beating) {
          await busy.ok('heartbeat');
          await delay(500);
        }
      })();
      try {
        const down = await presence(watcher, 'silent', 'down', 15000);
        assert.equal(down.reason, 'expired');
        assert.equal(down.entry.participant, 'silent');
        const lived = Client.arrivedAt(down) - Client.arrivedAt(up);
        assert.ok(lived >= 1000, `expired ${lived} ms after it came up; registry_ttl_s is 2`);
        const live = (await watcher.ok('who')).participants.map((p) => p.participant);
        assert.deepEqual(live, ['busy']);
        // one more ttl of heartbeats: busy stays
        await delay(2200);
        assert.deepEqual((await watcher.ok('who')).participants.map((p) => p.participant), ['busy']);
        assert.deepEqual(watcher.queued('presence').filter((p) => p.participant === 'busy'), []);
      } finally {
        beating = false;
        await beats;
      }
      // the expired entry does not close the session; a heartbeat brings it back
      await silent.ok('who');
      assert.equal(silent.isClosed, false);
      await silent.ok('heartbeat');
      const back = await presence(watcher, 'silent', 'up');
      assert.equal(back.reason, 'registered');
      assert.deepEqual(back.entry.jobs, ['resize']);
    });

    it('an expired entry gets no offers but keeps its leases', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const watcher = await env.connect(s, ns, 'watcher');
      await watcher.ok('watch');
      const w = await env.connect(s, ns, 'worker');
      await w.ok('register', { jobs: ['resize'], slots: 2 });
      const t1 = (await alice.ok('submit', { job: 'resize', body: 1 })).task;
      assert.equal((await w.next('offer')).task, t1);
      await w.ok('claim', { task: t1 }); // lease_s is 30 (default)
      // silent: the entry expires (registry_ttl_s 2), the lease does not
      assert.equal((await presence(watcher, 'worker', 'down', 15000)).reason, 'expired');
      const t2 = (await alice.ok('submit', { job: 'resize', body: 2 })).task;
      await alice.ok('who');
      await w.ok('who');
      assert.deepEqual(w.queued('offer'), [], 'no offer to an expired entry');
      await w.ok('complete', { task: t1, result: 'still mine' });
      const n = await alice.next('message', 10000, (m) => m.envelope.from === '$broker');
      assert.deepEqual([n.envelope.body.task, n.envelope.body.state], [t1, 'completed']);
      // a heartbeat registers it again, and the waiting task is offered
      await w.ok('heartbeat');
      assert.equal((await w.next('offer', 10000)).task, t2);
    });

    it('watch answers the live entries; who lists them', async () => {
      const ns = uniqueNs();
      const a = await env.connect(s, ns, 'a');
      const b = await env.connect(s, ns, 'b');
      await a.ok('register', { jobs: ['x'] });
      await b.ok('register', { jobs: ['y'] });
      const watcher = await env.connect(s, ns, 'watcher');
      const w = await watcher.ok('watch');
      assert.deepEqual(w.participants.map((p) => p.participant).sort(), ['a', 'b']);
      assert.deepEqual((await watcher.ok('who', { job: 'x' })).participants.map((p) => p.participant), ['a']);
      // registering again: seen up again
      await a.ok('register', { jobs: ['x', 'z'] });
      const again = await presence(watcher, 'a', 'up');
      assert.deepEqual(again.entry.jobs, ['x', 'z']);
    });

    it('bye: down "left", ok, and the connection closes with 1000 (also without id)', async () => {
      const ns = uniqueNs();
      const watcher = await env.connect(s, ns, 'watcher');
      await watcher.ok('watch');
      const w1 = await env.connect(s, ns, 'w1');
      await w1.ok('register', { jobs: ['resize'] });
      await presence(watcher, 'w1', 'up');
      await w1.ok('bye');
      const closed = await w1.waitClose();
      assert.equal(closed.code, 1000);
      const down = await presence(watcher, 'w1', 'down');
      assert.equal(down.reason, 'left');
      assert.deepEqual((await watcher.ok('who')).participants, []);

      const w2 = await env.connect(s, ns, 'w2');
      await w2.ok('register', { jobs: ['resize'] });
      await presence(watcher, 'w2', 'up');
      w2.send({ op: 'bye' });
      assert.equal((await w2.waitClose()).code, 1000);
      assert.deepEqual(w2.queued('ok'), []);
      assert.equal((await presence(watcher, 'w2', 'down')).reason, 'left');
    });
  });
}
