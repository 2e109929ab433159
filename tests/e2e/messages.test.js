'use strict';
// Inbox messages (spec §5) and topics (spec §6) over real WebSocket connections, on both
// transports.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');

const { Client, Env, delay, httpGet, suiteOptions, transports, uniqueNs } = require('./lib/harness');

const TS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

for (const transport of transports()) {
  describe(`inbox (${transport})`, suiteOptions(transport), () => {
    const env = new Env(transport);
    let s; // default inbox_ack_s (30), inbox_window 3
    let quick; // inbox_ack_s 1
    before(async () => {
      await env.setup();
      [s, quick] = await Promise.all([env.server({ inbox_window: 3 }), env.server({ inbox_ack_s: 1 })]);
    });
    after(() => env.teardown());

    it('send delivers the envelope with the authenticated sender; ack settles it', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const bob = await env.connect(s, ns, 'bob');
      const sent = await alice.ok('send', {
        to: 'bob',
        body: { text: 'please review', n: [1, 2, 3] },
        type: 'review.request',
        headers: { k: 'v', trace: 't-1' },
        msg_id: 'm-1',
        reply_to: 'alice',
        correlation: 'c-1',
        from: 'mallory',
      });
      assert.ok(Number.isInteger(sent.seq) && sent.seq > 0, JSON.stringify(sent));
      assert.equal(sent.msg_id, 'm-1');
      assert.equal(sent.duplicate, false);
      const m = await bob.next('message');
      assert.equal(m.seq, sent.seq);
      assert.equal(m.delivery, 1);
      assert.match(m.envelope.ts, TS);
      const { ts, ...rest } = m.envelope;
      assert.deepEqual(rest, {
        id: 'm-1',
        from: 'alice',
        to: 'bob',
        ns,
        type: 'review.request',
        body: { text: 'please review', n: [1, 2, 3] },
        headers: { k: 'v', trace: 't-1' },
        reply_to: 'alice',
        correlation: 'c-1',
      });
      await bob.ok('ack', { seq: m.seq });
      await bob.fails('ack', { seq: m.seq }, 'not_found');
      await bob.fails('nack', { seq: m.seq }, 'not_found');

      // Without msg_id the server makes one, and it is the envelope's id; a `from` of any
      // type is ignored; any JSON is a body.
      for (const body of ['a string', 42, null, [true, false], { deep: { er: 1 } }]) {
        const r = await alice.ok('send', { to: 'bob', body, from: { name: 'mallory' } });
        assert.equal(typeof r.msg_id, 'string');
        assert.ok(r.msg_id.length > 0);
        const got = await bob.next('message');
        assert.equal(got.seq, r.seq);
        assert.equal(got.envelope.id, r.msg_id);
        assert.equal(got.envelope.from, 'alice');
        assert.deepEqual(got.envelope.body, body);
        assert.ok(got.seq > sent.seq);
        await bob.ok('ack', { seq: got.seq });
      }
    });

    it('pipelined sends to one recipient are stored and delivered in the order sent', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const bob = await env.connect(s, ns, 'bob');
      const carol = await env.connect(s, ns, 'carol');
      // 200 sends written at once, to two recipients in turn: none waits for another's ok.
      const sent = await Promise.all(Array.from({ length: 200 }, (_, i) =>
        alice.ok('send', { to: i % 2 ? 'carol' : 'bob', body: i })));
      for (const [who, first] of [[bob, 0], [carol, 1]]) {
        const mine = sent.filter((_, i) => i % 2 === first);
        const seqs = mine.map((r) => r.seq);
        assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b), 'stored in the order sent');
        for (let i = first; i < 200; i += 2) {
          const m = await who.next('message', 10000);
          assert.equal(m.envelope.body, i);
          assert.equal(m.seq, sent[i].seq);
          await who.ok('ack', { seq: m.seq });
        }
      }
    });

    it('nack delivers again with delivery incremented, after delay_ms', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const bob = await env.connect(s, ns, 'bob');
      const { seq } = await alice.ok('send', { to: 'bob', body: 'again' });
      const m1 = await bob.next('message');
      assert.deepEqual([m1.seq, m1.delivery], [seq, 1]);
      await bob.ok('nack', { seq });
      const m2 = await bob.next('message');
      assert.deepEqual([m2.seq, m2.delivery], [seq, 2]);
      const t0 = Date.now();
      await bob.ok('nack', { seq, delay_ms: 400 });
      const m3 = await bob.next('message');
      const waited = Date.now() - t0;
      assert.deepEqual([m3.seq, m3.delivery], [seq, 3]);
      assert.ok(waited >= 350, `redelivered after ${waited} ms, delay_ms was 400`);
      await bob.ok('ack', { seq });
      await bob.fails('ack', { seq }, 'not_found');
    });

    it('a repeated msg_id from the same sender to the same recipient is stored once', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const dave = await env.connect(s, ns, 'dave');
      const bob = await env.connect(s, ns, 'bob');
      const first = await alice.ok('send', { to: 'bob', body: 'once', msg_id: 'dup-1' });
      const second = await alice.ok('send', { to: 'bob', body: 'once', msg_id: 'dup-1' });
      assert.deepEqual([second.seq, second.msg_id, second.duplicate], [first.seq, 'dup-1', true]);
      // another recipient, or another sender: not a duplicate
      const toCarol = await alice.ok('send', { to: 'carol', body: 'once', msg_id: 'dup-1' });
      assert.equal(toCarol.duplicate, false);
      const fromDave = await dave.ok('send', { to: 'bob', body: 'once', msg_id: 'dup-1' });
      assert.equal(fromDave.duplicate, false);
      assert.notEqual(fromDave.seq, first.seq);
      const marker = await alice.ok('send', { to: 'bob', body: 'marker' });

      const got = [];
      for (let i = 0; i < 3; i++) {
        const m = await bob.next('message');
        got.push([m.seq, m.envelope.from, m.envelope.body]);
        await bob.ok('ack', { seq: m.seq });
      }
      assert.deepEqual(got, [
        [first.seq, 'alice', 'once'],
        [fromDave.seq, 'dave', 'once'],
        [marker.seq, 'alice', 'marker'],
      ]);
    });

    it('every session of the recipient gets the message; an ack from one settles it', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const bob1 = await env.connect(s, ns, 'bob', undefined, { name: 'bob1' });
      const bob2 = await env.connect(s, ns, 'bob', undefined, { name: 'bob2' });
      const { seq } = await alice.ok('send', { to: 'bob', body: 'to both' });
      const [m1, m2] = await Promise.all([bob1.next('message'), bob2.next('message')]);
      assert.equal(m1.seq, seq);
      assert.equal(m2.seq, seq);
      assert.deepEqual(m1.envelope, m2.envelope);
      await bob1.ok('ack', { seq });
      await bob2.fails('ack', { seq }, 'not_found');
    });

    it('a message waits for a recipient who is not connected', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const seqs = [];
      for (let i = 0; i < 5; i++) seqs.push((await alice.ok('send', { to: 'carol', body: { i } })).seq);
      const carol = await env.connect(s, ns, 'carol');
      for (let i = 0; i < 5; i++) {
        const m = await carol.next('message');
        assert.deepEqual([m.seq, m.delivery, m.envelope.body], [seqs[i], 1, { i }]);
        await carol.ok('ack', { seq: m.seq });
      }
      await carol.close();
      // acked messages do not come back to the next session
      const marker = await alice.ok('send', { to: 'carol', body: 'marker' });
      const again = await env.connect(s, ns, 'carol');
      const m = await again.next('message');
      assert.equal(m.seq, marker.seq);
    });

    it('what the last session did not ack goes to the next session', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const bob = await env.connect(s, ns, 'bob');
      const { seq } = await alice.ok('send', { to: 'bob', body: 'unacked' });
      const m = await bob.next('message');
      assert.equal(m.seq, seq);
      await bob.close();
      const t0 = Date.now();
      const bob2 = await env.connect(s, ns, 'bob');
      const m2 = await bob2.next('message', 15000);
      assert.equal(m2.seq, seq);
      assert.ok(m2.delivery >= 2);
      // handed back at once, not after inbox_ack_s (30 s here)
      assert.ok(Date.now() - t0 < 10000);
      await bob2.ok('ack', { seq });
    });

    it('a message handed back by a closed session counts one delivery per delivery', async () => {
      // Spec §5: `delivery` is incremented with each delivery. The message below reaches a
      // client twice: once before the session closes, once after; the second is delivery 2.
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const bob = await env.connect(s, ns, 'bob');
      const { seq } = await alice.ok('send', { to: 'bob', body: 'count me' });
      const m1 = await bob.next('message');
      assert.deepEqual([m1.seq, m1.delivery], [seq, 1]);
      await bob.close();
      const bob2 = await env.connect(s, ns, 'bob');
      const m2 = await bob2.next('message', 15000);
      assert.equal(m2.seq, seq);
      assert.equal(m2.delivery, 2, 'the second delivery to a client is delivery 2');
      await bob2.ok('ack', { seq });
    });

    it('at most inbox_window unacked messages are in flight to a participant', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(s, ns, 'alice');
      const seqs = [];
      for (let i = 0; i < 6; i++) seqs.push((await alice.ok('send', { to: 'bob', body: i })).seq);
      const bob = await env.connect(s, ns, 'bob');
      const first = [];
      for (let i = 0; i < 3; i++) first.push((await bob.next('message')).seq);
      assert.deepEqual(first, seqs.slice(0, 3));
      // the window is full: nothing more comes until an ack (a short look, no event to await)
      await delay(300);
      await bob.ok('who');
      assert.deepEqual(bob.queued('message'), [], 'a fourth message while three are unacked');
      await bob.ok('ack', { seq: seqs[0] });
      assert.equal((await bob.next('message')).seq, seqs[3]);
      for (const seq of seqs.slice(1, 4)) await bob.ok('ack', { seq });
      const rest = [(await bob.next('message')).seq, (await bob.next('message')).seq];
      assert.deepEqual(rest, seqs.slice(4));
    });

    it('what is not acked within inbox_ack_s is delivered again', async () => {
      const ns = uniqueNs();
      const alice = await env.connect(quick, ns, 'alice');
      const bob = await env.connect(quick, ns, 'bob');
      const { seq } = await alice.ok('send', { to: 'bob', body: 'ack me' });
      const m1 = await bob.next('message');
      assert.deepEqual([m1.seq, m1.delivery], [seq, 1]);
      const m2 = await bob.next('message', 10000);
      const after1 = Client.arrivedAt(m2) - Client.arrivedAt(m1);
      assert.deepEqual([m2.seq, m2.delivery], [seq, 2]);
      assert.ok(after1 >= 800, `delivered again after ${after1} ms; inbox_ack_s is 1`);
      await bob.ok('ack', { seq });
    });
  });

  describe(`topics (${transport})`, suiteOptions(transport), () => {
    const env = new Env(transport);
    let s;
    before(async () => {
      await env.setup();
      // bytes_per_s high enough for the slow-consumer test
      s = await env.server({ policy: { default: { rate: { bytes_per_s: 1000000000 } } } });
    });
    after(() => env.teardown());

    // Subscribes and returns the ok and the first `count` events of the subscription, and
    // checks that the ok came before every event.
    async function subscribe(c, fields, count) {
      const ok = await c.ok('subscribe', fields);
      const events = [];
      for (let i = 0; i < count; i++) events.push(await c.next('event', 10000, (e) => e.sub === ok.sub));
      for (const e of events) assert.ok(Client.order(ok) < Client.order(e), 'the ok of subscribe comes before its events');
      return { ok, events };
    }

    it('replay from all, last, {seq} and {time}; new by default; the ok comes first', async () => {
      const ns = uniqueNs();
      const pub = await env.connect(s, ns, 'pub');
      const sub = await env.connect(s, ns, 'sub');
      const e1 = await pub.ok('publish', { topic: 'news.eu', body: { n: 1 }, type: 'news.item', headers: { h: '1' } });
      await delay(5); // the {time} replay below needs a time between e1 and e2
      const between = new Date(Date.now()).toISOString();
      await delay(5);
      const e2 = await pub.ok('publish', { topic: 'news.us', body: { n: 2 } });
      const e3 = await pub.ok('publish', { topic: 'news.eu', body: { n: 3 } });
      const e4 = await pub.ok('publish', { topic: 'sport.eu', body: { n: 4 } });
      assert.ok(e1.seq < e2.seq && e2.seq < e3.seq && e3.seq < e4.seq);
      assert.equal(e1.duplicate, false);

      const all = await subscribe(sub, { topic: 'news.>', sub: 'all', from: 'all' }, 3);
      assert.equal(all.ok.sub, 'all');
      assert.deepEqual(all.events.map((e) => [e.seq, e.topic, e.envelope.body.n]),
          [[e1.seq, 'news.eu', 1], [e2.seq, 'news.us', 2], [e3.seq, 'news.eu', 3]]);
      const first = all.events[0];
      assert.equal(first.sub, 'all');
      assert.equal(first.envelope.from, 'pub');
      assert.equal(first.envelope.ns, ns);
      assert.equal(first.envelope.type, 'news.item');
      assert.deepEqual(first.envelope.headers, { h: '1' });
      assert.equal(first.envelope.id, e1.msg_id);
      assert.match(first.envelope.ts, TS);

      const last = await subscribe(sub, { topic: 'news.eu', sub: 'last', from: 'last' }, 1);
      assert.deepEqual(last.events.map((e) => e.seq), [e3.seq]);
      const fromSeq = await subscribe(sub, { topic: 'news.>', sub: 'seq', from: { seq: e2.seq } }, 2);
      assert.deepEqual(fromSeq.events.map((e) => e.seq), [e2.seq, e3.seq]);
      const fromTime = await subscribe(sub, { topic: '>', sub: 'time', from: { time: between } }, 3);
      assert.deepEqual(fromTime.events.map((e) => e.seq), [e2.seq, e3.seq, e4.seq]);
      const fresh = await subscribe(sub, { topic: 'news.*', sub: 'new' }, 0);
      assert.equal(fresh.ok.sub, 'new');
      const explicitNew = await subscribe(sub, { topic: 'news.eu', sub: 'new2', from: 'new' }, 0);
      assert.equal(explicitNew.ok.sub, 'new2');

      // One more event: every subscription gets exactly what follows, nothing replayed twice.
      const e5 = await pub.ok('publish', { topic: 'news.eu', body: { n: 5 } });
      for (const name of ['all', 'last', 'seq', 'time', 'new', 'new2']) {
        const e = await sub.next('event', 10000, (f) => f.sub === name);
        assert.equal(e.seq, e5.seq, `sub ${name}`);
      }
      assert.deepEqual(sub.queued('event'), []);
    });

    it('events come in stream order without a gap, also while they are published fast', async () => {
      const ns = uniqueNs();
      const pub = await env.connect(s, ns, 'pub');
      const sub = await env.connect(s, ns, 'sub');
      await sub.ok('subscribe', { topic: 'load.*', sub: 'l' });
      const seqs = await Promise.all(Array.from({ length: 100 }, (_, i) =>
        pub.ok('publish', { topic: i % 2 ? 'load.a' : 'load.b', body: i }).then((r) => r.seq)));
      const got = [];
      for (let i = 0; i < 100; i++) got.push((await sub.next('event', 10000)).seq);
      assert.deepEqual(got, [...seqs].sort((a, b) => a - b));
    });

    it('unsubscribe stops the events of that subscription only', async () => {
      const ns = uniqueNs();
      const pub = await env.connect(s, ns, 'pub');
      const sub = await env.connect(s, ns, 'sub');
      await sub.ok('subscribe', { topic: 'news.>', sub: 's1' });
      await sub.ok('subscribe', { topic: 'news.>', sub: 's2' });
      const a = await pub.ok('publish', { topic: 'news.eu', body: 'a' });
      assert.equal((await sub.next('event', 10000, (e) => e.sub === 's1')).seq, a.seq);
      assert.equal((await sub.next('event', 10000, (e) => e.sub === 's2')).seq, a.seq);
      await sub.ok('unsubscribe', { sub: 's1' });
      const b = await pub.ok('publish', { topic: 'news.eu', body: 'b' });
      const c = await pub.ok('publish', { topic: 'news.eu', body: 'c' });
      assert.equal((await sub.next('event', 10000, (e) => e.sub === 's2')).seq, b.seq);
      assert.equal((await sub.next('event', 10000, (e) => e.sub === 's2')).seq, c.seq);
      await sub.ok('who'); // one more round trip
      assert.deepEqual(sub.queued('event'), [], 'no event for the subscription that is gone');
      await sub.fails('unsubscribe', { sub: 's1' }, 'not_found');
      // the name is free again
      await sub.ok('subscribe', { topic: 'news.>', sub: 's1' });
    });

    it('a subscriber that does not read is dropped with last_seq and resumes from it without loss', { timeout: 120000 }, async () => {
      const ns = uniqueNs();
      const pub = await env.connect(s, ns, 'pub');
      const sub = await env.connect(s, ns, 'sub');
      await sub.ok('subscribe', { topic: 'bulk.>', sub: 'slow' });
      sub.ws.pause(); // stop reading: the server's buffer for this client fills up
      const body = 'b'.repeat(200 * 1024);
      const seqs = [];
      let dropped = null;
      // Publish 200 KB events until the server must have dropped the subscription (far
      // more than its 4 MiB limit plus what the sockets hold), at most 400 (80 MB).
      for (let i = 0; i < 400 && !dropped; i++) {
        const r = await pub.ok('publish', { topic: 'bulk.x', body: `${i}:${body}` });
        seqs.push(r.seq);
        if (i >= 100 && i % 20 === 0) {
          const m = await httpGet(`${s.http}/metrics`);
          if (/^amp_slow_consumers_total [1-9]/m.test(m.body)) dropped = i;
        }
      }
      assert.ok(dropped !== null, 'the server dropped the subscription (amp_slow_consumers_total)');
      sub.ws.resume();
      const drop = await sub.next('sub_dropped', 60000);
      assert.equal(drop.sub, 'slow');
      assert.equal(drop.reason, 'slow_consumer');
      const got = sub.queued('event').map((e) => e.seq);
      assert.ok(got.length > 0 && got.length < seqs.length, `${got.length} of ${seqs.length} events before the drop`);
      assert.deepEqual(got, seqs.slice(0, got.length), 'the events before the drop have no gap');
      assert.equal(drop.last_seq, got[got.length - 1]);
      assert.ok(Client.order(drop) > Client.order(sub.queued('event').pop()), 'sub_dropped after the last event');
      // Resume from last_seq + 1 until everything is in: nothing lost. (A replay of more
      // than the server's outbound limit before the ok is dropped again, by design, see
      // docs/protocol.md "Slow consumers"; each round must make progress.)
      const all = [...got];
      let from = drop.last_seq + 1;
      for (let round = 0; all.length < seqs.length; round++) {
        assert.ok(round < 50, 'resubscribing makes progress');
        const name = `again${round}`;
        await sub.ok('subscribe', { topic: 'bulk.>', sub: name, from: { seq: from } });
        const before = all.length;
        while (all.length < seqs.length) {
          const f = await sub.next(['event', 'sub_dropped'], 30000, (e) => e.sub === name);
          if (f.op === 'sub_dropped') {
            assert.equal(f.last_seq, all[all.length - 1], 'last_seq is the last event delivered');
            from = f.last_seq + 1;
            break;
          }
          all.push(f.seq);
        }
        assert.ok(all.length > before, `round ${round} delivered nothing`);
        if (all.length === seqs.length) await sub.ok('unsubscribe', { sub: name });
      }
      assert.deepEqual(all, seqs);
    });

    it('a replay larger than the outbound limit: the ok first, and every event up to last_seq delivered', { timeout: 60000 }, async () => {
      // Spec §6: a dropped subscriber "may subscribe again from {seq: N+1} and lose
      // nothing"; docs/protocol.md: the ok of subscribe comes before the first event, and
      // last_seq is the sequence before the first event not delivered. A client that
      // reads at once subscribes from "all" to 20 MB of history (the server's outbound
      // limit is 4 MiB): it may be dropped, but not lose what last_seq says it got.
      const ns = uniqueNs();
      const pub = await env.connect(s, ns, 'pub');
      const sub = await env.connect(s, ns, 'sub');
      const body = 'h'.repeat(200 * 1024);
      const seqs = [];
      for (let i = 0; i < 100; i++) seqs.push((await pub.ok('publish', { topic: 'hist.x', body: `${i}:${body}` })).seq);
      const ok = await sub.ok('subscribe', { topic: 'hist.>', sub: 'h', from: 'all' });
      const got = [];
      let drop = null;
      const early = []; // frames of the subscription that came before its ok
      while (got.length < seqs.length) {
        const f = await sub.next(['event', 'sub_dropped'], 30000, (e) => e.sub === 'h');
        if (Client.order(f) < Client.order(ok)) early.push(f.op);
        if (f.op === 'sub_dropped') {
          drop = f;
          break;
        }
        got.push(f.seq);
      }
      assert.deepEqual(got, seqs.slice(0, got.length), 'no gap');
      if (drop) {
        assert.equal(drop.last_seq, got.length ? got[got.length - 1] : seqs[0] - 1,
            `sub_dropped says last_seq ${drop.last_seq}, but the client got ${got.length} events ` +
            `(${got.length ? `${got[0]}..${got[got.length - 1]}` : 'none'}) and ${early.join(', ') || 'nothing'} ` +
            'before the ok of subscribe: resuming from last_seq + 1 loses the events in between');
      }
      assert.deepEqual(early, [], 'frames of the subscription before its ok');
    });

    it('a repeated msg_id on publish from the same sender and topic is stored once', async () => {
      const ns = uniqueNs();
      const pub = await env.connect(s, ns, 'pub');
      const other = await env.connect(s, ns, 'other');
      const sub = await env.connect(s, ns, 'sub');
      const p1 = await pub.ok('publish', { topic: 'news.eu', body: 1, msg_id: 'p-1' });
      const p2 = await pub.ok('publish', { topic: 'news.eu', body: 1, msg_id: 'p-1' });
      assert.deepEqual([p2.seq, p2.duplicate], [p1.seq, true]);
      const otherTopic = await pub.ok('publish', { topic: 'news.us', body: 1, msg_id: 'p-1' });
      assert.equal(otherTopic.duplicate, false);
      const otherSender = await other.ok('publish', { topic: 'news.eu', body: 1, msg_id: 'p-1' });
      assert.equal(otherSender.duplicate, false);
      const { events } = await subscribe(sub, { topic: 'news.>', from: 'all' }, 3);
      assert.deepEqual(events.map((e) => e.seq), [p1.seq, otherTopic.seq, otherSender.seq]);
      const marker = await pub.ok('publish', { topic: 'news.eu', body: 'marker' });
      assert.equal((await sub.next('event')).seq, marker.seq);
    });
  });
}
