'use strict';
// The session and every error code of spec §9 that a client can provoke (spec §1, §3, §8,
// §9), the handshake, binary and oversized frames, and HTTP beside the WebSocket (§10), on
// both transports.

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');

const { ALL, Client, Env, delay, eventually, httpGet, jwt, suiteOptions, transports, uniqueNs } = require('./lib/harness');

const ORDER_SCHEMA = {
  $schema: 'http://json-schema.org/draft-07/schema#',
  type: 'object',
  properties: { w: { type: 'integer' } },
  required: ['w'],
};

const CONFIG = {
  limits: { max_frame_bytes: 4096, max_body_bytes: 1024, max_subscriptions: 4 },
  policy: {
    participants: {
      limited: { rate: { per_s: 5, burst: 2 } },
      budgeted: { budget: { per_day: 3 } },
    },
  },
  schemas: { 'order.v1': 'order.schema.json' },
};
const FILES = { 'order.schema.json': JSON.stringify(ORDER_SCHEMA) };

for (const transport of transports()) {
  describe(`protocol (${transport})`, suiteOptions(transport), () => {
    const env = new Env(transport);
    let s;
    let silent; // a connection that never says hello, opened at the start
    let silentSince;

    before(async () => {
      await env.setup();
      s = await env.server(CONFIG, { files: FILES });
      silent = await env.open(s);
      silentSince = Date.now();
    });
    after(() => env.teardown());

    it('hello answers the session fields', async () => {
      const ns = uniqueNs();
      const a = await env.connect(s, ns, 'alice');
      const a2 = await env.connect(s, ns, 'alice');
      const r = a.helloReply;
      assert.equal(r.participant, 'alice');
      assert.equal(r.ns, ns);
      assert.equal(r.heartbeat_s, 10);
      assert.equal(r.registry_ttl_s, 30);
      assert.equal(r.max_frame_bytes, 4096);
      assert.match(r.server, /^amp-server\/\d+\.\d+\.\d+/);
      assert.equal(typeof r.session, 'string');
      assert.ok(r.session.length > 0);
      assert.notEqual(a2.helloReply.session, r.session, 'every session has its own id');
      assert.equal(a.protocol, 'amp.v1');
    });

    it('a token that is not valid is unauthenticated and closes with 4401', async () => {
      const ns = uniqueNs();
      const now = Math.floor(Date.now() / 1000);
      const cases = {
        garbage: 'not-a-jwt',
        empty: '',
        'other secret': jwt.token('another-secret', { sub: 'alice', ns, grants: ALL }),
        'alg none': jwt.token(env.secret, { sub: 'alice', ns, grants: ALL, alg: 'none' }),
        'alg HS512': jwt.token(env.secret, { sub: 'alice', ns, grants: ALL, alg: 'HS512' }),
        expired: env.token(ns, 'alice', ALL, { exp: now - 3600 }),
        'not yet valid': env.token(ns, 'alice', ALL, { nbf: now + 3600 }),
        'no sub': jwt.sign({ ns, exp: now + 3600 }, env.secret),
        'no ns': jwt.sign({ sub: 'alice', exp: now + 3600 }, env.secret),
        'no exp': jwt.sign({ sub: 'alice', ns }, env.secret),
        'sub $broker': env.token(ns, '$broker'),
        'sub upper case': env.token(ns, 'Alice'),
        'ns with a dot': env.token('a.b', 'alice'),
        'invalid grant': env.token(ns, 'alice', { publish: ['News..x'] }),
      };
      await Promise.all(Object.entries(cases).map(async ([what, token]) => {
        const c = await env.open(s);
        const reply = await c.request('hello', { id: `h-${what}`, token });
        assert.equal(reply.op, 'error', `${what}: ${JSON.stringify(reply)}`);
        assert.equal(reply.code, 'unauthenticated', what);
        assert.equal(reply.id, `h-${what}`, what);
        const closed = await c.waitClose();
        assert.equal(closed.code, 4401, `${what}: closed with ${closed.code}`);
      }));
      // exp within the leeway (30 s by default) is still accepted
      const late = await env.open(s);
      await late.ok('hello', { token: env.token(ns, 'alice', ALL, { exp: now - 5 }) });
    });

    it('any op before hello is unauthenticated and the connection stays', async () => {
      const ns = uniqueNs();
      const c = await env.open(s);
      await c.fails('who', {}, 'unauthenticated');
      await c.fails('send', { to: 42, body: 1 }, 'unauthenticated');
      c.send({ op: 'ack', seq: 1 });
      const e = await c.next('error');
      assert.deepEqual([e.code, e.id], ['unauthenticated', null]);
      await c.ok('hello', { token: env.token(ns, 'alice') });
      await c.ok('who');
    });

    it('a second hello is bad_request and the session stays', async () => {
      const ns = uniqueNs();
      const c = await env.connect(s, ns, 'alice');
      await c.fails('hello', { token: env.token(ns, 'alice') }, 'bad_request');
      await c.fails('hello', { token: 'junk' }, 'bad_request');
      await c.ok('who');
      assert.equal(c.isClosed, false);
    });

    it('frames that are not usable are bad_request; the session stays', async () => {
      const ns = uniqueNs();
      const c = await env.connect(s, ns, 'alice');
      // No usable id: the error carries "id":null.
      const nullIdFrames = [
        'not json',
        '{"op":"who","id":1',
        '[1,2,3]',
        '"who"',
        '42',
        '{"op":"who","id":{"x":1}}',
        '{"op":"who","id":null}',
        '{"op":"who","id":1.5}',
        '{"op":"who","id":true}',
        `{"op":"who","id":"${'x'.repeat(65)}"}`,
        '{"op":"who","id":9007199254740992}',
      ];
      for (const text of nullIdFrames) {
        c.sendRaw(text);
        const e = await c.next('error');
        assert.equal(e.code, 'bad_request', text);
        assert.equal(e.id, null, text);
      }
      // The longest string id and the largest safe integer are usable.
      const longId = 'é'.repeat(64);
      assert.equal((await c.request('who', { id: longId })).id, longId);
      assert.equal((await c.request('who', { id: 9007199254740991 })).id, 9007199254740991);
      assert.equal((await c.request('who', { id: -3 })).id, -3);

      // With a usable id the error echoes it.
      const withId = [
        ['unknown op', { op: 'fly' }],
        ['missing op', {}],
        ['op not a string', { op: 7 }],
        ['send without to', { op: 'send', body: 1 }],
        ['send without body', { op: 'send', to: 'bob' }],
        ['to is a number', { op: 'send', to: 42, body: 1 }],
        ['headers not an object', { op: 'send', to: 'bob', body: 1, headers: 'x' }],
        ['ack seq not an integer', { op: 'ack', seq: 'x' }],
        ['nack delay negative', { op: 'nack', seq: 1, delay_ms: -1 }],
        // Past a day: refused before it could overflow a duration (UBSan saw it once).
        ['nack delay 2^53-1', { op: 'nack', seq: 1, delay_ms: 9007199254740991 }],
        ['fail retry_delay_ms 2^53-1', { op: 'fail', task: 't_x', error: { code: 'x', message: 'y' }, retry_delay_ms: 9007199254740991 }],
        ['complete attempt a string', { op: 'complete', task: 't_x', attempt: '1' }],
        ['publish without topic', { op: 'publish', body: 1 }],
        ['subscribe from misspelt', { op: 'subscribe', topic: 'news.>', from: { sq: 5 } }],
        ['subscribe from unknown word', { op: 'subscribe', topic: 'news.>', from: 'first' }],
        ['subscribe from seq 0', { op: 'subscribe', topic: 'news.>', from: { seq: 0 } }],
        ['subscribe from bad time', { op: 'subscribe', topic: 'news.>', from: { time: 'yesterday' } }],
        ['register without jobs', { op: 'register' }],
        ['register slots over 1024', { op: 'register', jobs: [], slots: 1025 }],
        ['submit max_attempts 0', { op: 'submit', job: 'resize', body: 1, max_attempts: 0 }],
        ['submit max_attempts 101', { op: 'submit', job: 'resize', body: 1, max_attempts: 101 }],
        ['claim without task', { op: 'claim' }],
        ['fail without error', { op: 'fail', task: 't_x' }],
        ['hello token not a string', { op: 'hello', token: 5 }],
      ];
      let n = 100;
      for (const [what, frame] of withId) {
        const id = n++;
        const reply = await c.requestRaw(JSON.stringify({ ...frame, id }), id);
        assert.equal(reply.op, 'error', `${what}: ${JSON.stringify(reply)}`);
        assert.equal(reply.code, 'bad_request', `${what}: ${JSON.stringify(reply)}`);
        assert.equal(reply.id, id, what);
      }
      // A frame without id that fails is reported with "id":null.
      c.send({ op: 'send', to: 42, body: 1 });
      const e = await c.next('error');
      assert.deepEqual([e.code, e.id], ['bad_request', null]);
      // Unknown members are ignored.
      await c.ok('who', { whatever: { nested: [1, 2] } });
      assert.equal(c.isClosed, false);
    });

    it('a request without id gets no ok, and its failure comes with "id":null', async () => {
      const ns = uniqueNs();
      const a = await env.connect(s, ns, 'alice');
      await env.connect(s, ns, 'bob');
      a.send({ op: 'send', to: 'bob', body: 'no id' });
      a.send({ op: 'ack', seq: 999999 });
      a.send({ op: 'nack', seq: 999999 });
      await a.ok('who'); // replies come in request order: everything before it is in
      assert.deepEqual(a.queued('ok'), []);
      const errors = a.queued('error');
      assert.equal(errors.length, 2, JSON.stringify(errors));
      for (const e of errors) assert.deepEqual([e.code, e.id], ['not_found', null]);
    });

    it('names outside the grammar are invalid_name, before the grants are looked at', async () => {
      const ns = uniqueNs();
      const none = await env.connect(s, ns, 'nobody', null); // no amp claim: own inbox only
      const cases = [
        ['send', { to: 'Bob', body: 1 }],
        ['send', { to: '$broker', body: 1 }],
        ['send', { to: 'bob', body: 1, reply_to: 'Al ice' }],
        ['send', { to: 'a.b', body: 1 }],
        ['send', { to: '', body: 1 }],
        ['publish', { topic: 'news..eu', body: 1 }],
        ['publish', { topic: 'news.*', body: 1 }],
        ['subscribe', { topic: 'News' }],
        ['subscribe', { topic: 'news.>.x' }],
        ['subscribe', { topic: 'news.>', sub: 'Bad Sub' }],
        ['unsubscribe', { sub: '' }],
        ['register', { jobs: ['Resize'] }],
        ['submit', { job: 'a.b', body: 1 }],
        ['who', { job: '*' }],
        ['claim', { task: 'bad task' }],
        ['heartbeat', { task: 'x y' }],
      ];
      for (const [op, fields] of cases) {
        const e = await none.fails(op, fields, 'invalid_name');
        assert.ok(e.message.length > 0);
      }
      // and the shape comes before the names
      await none.fails('send', { to: 42, body: 1 }, 'bad_request');
      // a valid name without the grant is forbidden
      await none.fails('send', { to: 'bob', body: 1 }, 'forbidden');
    });

    it('what is not granted is forbidden; who, watch and heartbeat need no grant', async () => {
      const ns = uniqueNs();
      const grants = {
        send: ['bob'],
        publish: ['news.>'],
        subscribe: ['news.>'],
        submit: ['resize'],
        work: ['resize'],
      };
      const a = await env.connect(s, ns, 'alice', grants);
      await a.ok('send', { to: 'bob', body: 1 });
      await a.fails('send', { to: 'carol', body: 1 }, 'forbidden');
      await a.ok('publish', { topic: 'news.eu', body: 1 });
      await a.fails('publish', { topic: 'sport.eu', body: 1 }, 'forbidden');
      await a.ok('subscribe', { topic: 'news.*' });
      await a.fails('subscribe', { topic: '>' }, 'forbidden');
      await a.fails('subscribe', { topic: 'sport.>' }, 'forbidden');
      await a.ok('submit', { job: 'resize', body: 1 });
      await a.fails('submit', { job: 'encode', body: 1 }, 'forbidden');
      await a.ok('register', { jobs: ['resize'] });
      await a.fails('register', { jobs: ['resize', 'encode'] }, 'forbidden');
      // forbidden comes before payload_too_large
      await a.fails('send', { to: 'carol', body: 'x'.repeat(2000) }, 'forbidden');

      const plain = await env.connect(s, ns, 'plain', null);
      await plain.fails('send', { to: 'bob', body: 1 }, 'forbidden');
      await plain.fails('publish', { topic: 'news.eu', body: 1 }, 'forbidden');
      await plain.fails('submit', { job: 'resize', body: 1 }, 'forbidden');
      await plain.ok('who');
      await plain.ok('watch');
      await plain.ok('heartbeat');
    });

    it('a body over max_body_bytes is payload_too_large', async () => {
      const ns = uniqueNs();
      const a = await env.connect(s, ns, 'alice');
      await env.connect(s, ns, 'bob');
      // 1024 bytes serialized (with the quotes) is the limit
      await a.ok('send', { to: 'bob', body: 'x'.repeat(1022) });
      const e = await a.fails('send', { to: 'bob', body: 'x'.repeat(1023) }, 'payload_too_large');
      assert.equal(e.path, '/body');
      await a.fails('publish', { topic: 'news.eu', body: { big: 'y'.repeat(1100) } }, 'payload_too_large');
      await a.fails('submit', { job: 'resize', body: ['z'.repeat(1100)] }, 'payload_too_large');
      // payload_too_large comes before invalid_envelope
      await a.fails('send', { to: 'bob', body: 'x'.repeat(1100), type: 'Bad Type!' }, 'payload_too_large');
    });

    it('envelope rules and body schemas are invalid_envelope with a path', async () => {
      const ns = uniqueNs();
      const a = await env.connect(s, ns, 'alice');
      let e = await a.fails('send', { to: 'bob', body: 1, type: 'Bad Type!' }, 'invalid_envelope');
      assert.equal(e.path, '/type');
      e = await a.fails('send', { to: 'bob', body: { w: 'wide' }, type: 'order.v1' }, 'invalid_envelope');
      assert.equal(e.path, '/body/w');
      assert.match(e.message, /order\.v1/);
      e = await a.fails('publish', { topic: 'orders.eu', body: {}, type: 'order.v1' }, 'invalid_envelope');
      assert.match(e.path, /^\/body/);
      await a.fails('submit', { job: 'resize', body: { w: 1.5 }, type: 'order.v1' }, 'invalid_envelope');
      // a matching body, and a type without schema, pass
      await a.ok('send', { to: 'bob', body: { w: 640 }, type: 'order.v1' });
      await a.ok('send', { to: 'bob', body: { w: 'any' }, type: 'order.v2' });
    });

    it('over the rate is rate_limited with retry_after_ms; after that long it passes', async () => {
      const ns = uniqueNs();
      const l = await env.connect(s, ns, 'limited');
      await l.ok('send', { to: 'bob', body: 1 });
      await l.ok('publish', { topic: 'news.eu', body: 2 });
      const e = await l.fails('submit', { job: 'resize', body: 3 }, 'rate_limited');
      assert.ok(Number.isInteger(e.retry_after_ms) && e.retry_after_ms >= 1, JSON.stringify(e));
      // earlier checks still come first
      await l.fails('send', { to: 'bob', body: 1, type: 'Bad Type!' }, 'invalid_envelope');
      await delay(e.retry_after_ms + 20);
      await l.ok('send', { to: 'bob', body: 4 });
      // another participant is not limited by it
      const a = await env.connect(s, ns, 'alice');
      for (let i = 0; i < 5; i++) await a.ok('send', { to: 'bob', body: i });
    });

    it('over the daily budget is budget_exhausted; duplicates do not count', async () => {
      const ns = uniqueNs();
      const b = await env.connect(s, ns, 'budgeted');
      const first = await b.ok('send', { to: 'bob', body: 1, msg_id: 'm-1' });
      const again = await b.ok('send', { to: 'bob', body: 1, msg_id: 'm-1' });
      assert.equal(again.duplicate, true);
      assert.equal(again.seq, first.seq);
      await b.ok('publish', { topic: 'news.eu', body: 2 });
      const sub = await b.ok('submit', { job: 'resize', body: 3, idempotency_key: 'k-1' });
      assert.equal(sub.created, true);
      // three units spent: the budget is exhausted for send, publish and new submits
      await b.fails('send', { to: 'bob', body: 4 }, 'budget_exhausted');
      await b.fails('publish', { topic: 'news.eu', body: 5 }, 'budget_exhausted');
      await b.fails('submit', { job: 'resize', body: 6 }, 'budget_exhausted');
      // the budget is per participant
      const a = await env.connect(s, ns, 'alice');
      await a.ok('send', { to: 'bob', body: 7 });
    });

    it('an idempotent resubmission is answered with its task even when the budget is spent', async () => {
      // Spec §7: the same idempotency_key returns the existing task "however often it is
      // retried"; a resubmission counts against the rate limit, not the budget.
      const ns = uniqueNs();
      const b = await env.connect(s, ns, 'budgeted');
      await b.ok('send', { to: 'bob', body: 1 });
      await b.ok('send', { to: 'bob', body: 2 });
      const first = await b.ok('submit', { job: 'resize', body: 3, idempotency_key: 'order-42' });
      assert.equal(first.created, true);
      await b.fails('send', { to: 'bob', body: 4 }, 'budget_exhausted');
      const again = await b.request('submit', { job: 'resize', body: 3, idempotency_key: 'order-42' });
      assert.deepEqual(again, { op: 'ok', id: again.id, task: first.task, created: false },
          `the retry of a submit that spent the last budget unit: ${JSON.stringify(again)}`);
    });

    it('max_subscriptions is limit_exceeded; a sub in use is conflict; an unknown one not_found', async () => {
      const ns = uniqueNs();
      const a = await env.connect(s, ns, 'alice');
      const named = await a.ok('subscribe', { topic: 'news.>' });
      // A name the server makes up is outside those a client makes up (never one chosen later);
      // a client may reuse it once it is free.
      assert.equal(named.sub, '_s1');
      await a.fails('subscribe', { topic: 'news.>', sub: named.sub }, 'conflict');
      await a.fails('subscribe', { topic: 'news.>', sub: '_x' }, 'invalid_name');
      await a.ok('subscribe', { topic: 'news.>', sub: 's1' });
      await a.ok('unsubscribe', { sub: 's1' });
      await a.ok('unsubscribe', { sub: named.sub });
      await a.ok('subscribe', { topic: 'news.>', sub: named.sub });
      await a.ok('unsubscribe', { sub: named.sub });
      const next = await a.ok('subscribe', { topic: 'news.>' });
      assert.equal(next.sub, '_s2');
      await a.ok('unsubscribe', { sub: next.sub });
      await a.ok('subscribe', { topic: 'news.>', sub: named.sub });
      await a.ok('subscribe', { topic: 'news.>', sub: '_s3' });
      assert.equal((await a.ok('subscribe', { topic: 'news.>' })).sub, '_s4', 'a name in use is passed over');
      await a.ok('unsubscribe', { sub: '_s3' });
      await a.ok('unsubscribe', { sub: '_s4' });
      await a.ok('subscribe', { topic: 'news.>', sub: 'two' });
      await a.fails('subscribe', { topic: 'sport.>', sub: 'two' }, 'conflict');
      await a.ok('subscribe', { topic: 'news.>', sub: 'three' });
      await a.ok('subscribe', { topic: 'news.>', sub: 'four' });
      const e = await a.fails('subscribe', { topic: 'news.>', sub: 'five' }, 'limit_exceeded');
      assert.match(e.message, /max_subscriptions|4/);
      await a.fails('unsubscribe', { sub: 'nope' }, 'not_found');
      await a.ok('unsubscribe', { sub: 'two' });
      await a.fails('unsubscribe', { sub: 'two' }, 'not_found');
      await a.ok('subscribe', { topic: 'news.>', sub: 'five' });
      // the limit is per session
      const a2 = await env.connect(s, ns, 'alice');
      await a2.ok('subscribe', { topic: 'news.>', sub: 'two' });
    });

    it('operations on what does not exist are not_found', async () => {
      const ns = uniqueNs();
      const a = await env.connect(s, ns, 'alice');
      const eve = await env.connect(s, ns, 'eve');
      await a.fails('ack', { seq: 999999 }, 'not_found');
      await a.fails('nack', { seq: 999999, delay_ms: 10 }, 'not_found');
      await a.fails('claim', { task: 't_nosuchtask' }, 'not_found');
      await a.fails('decline', { task: 't_nosuchtask' }, 'not_found');
      await a.fails('task', { task: 't_nosuchtask' }, 'not_found');
      await a.fails('cancel', { task: 't_nosuchtask' }, 'not_found');
      const { task } = await a.ok('submit', { job: 'resize', body: 1 });
      await eve.fails('task', { task }, 'not_found');
      await eve.fails('cancel', { task }, 'not_found');
      await eve.fails('claim', { task }, 'not_found');
      // the submitter sees it
      const r = await a.ok('task', { task });
      assert.equal(r.task.task, task);
    });

    it('a session never touches another namespace', async () => {
      const ns1 = uniqueNs();
      const ns2 = uniqueNs();
      const alice = await env.connect(s, ns1, 'alice');
      const bob1 = await env.connect(s, ns1, 'bob');
      const bob2 = await env.connect(s, ns2, 'bob');
      const admin2 = await env.connect(s, ns2, 'root', { ...ALL, admin: true });
      await bob2.ok('subscribe', { topic: 'news.>', sub: 'n' });
      const sent = await alice.ok('send', { to: 'bob', body: 'ns1 only' });
      assert.equal((await bob1.next('message')).seq, sent.seq);
      await alice.ok('publish', { topic: 'news.eu', body: 'ns1 only' });
      const { task } = await alice.ok('submit', { job: 'resize', body: 1 });
      await admin2.fails('task', { task }, 'not_found');
      await admin2.fails('cancel', { task }, 'not_found');
      await bob2.ok('who');
      assert.deepEqual(bob2.queued('message'), []);
      assert.deepEqual(bob2.queued('event'), []);
      // an admin of the namespace does see it
      const admin1 = await env.connect(s, ns1, 'root', { admin: true });
      assert.equal((await admin1.ok('task', { task })).task.ns, ns1);
    });

    it('a binary frame is bad_request with "id":null and the connection stays', async () => {
      const ns = uniqueNs();
      const a = await env.connect(s, ns, 'alice');
      a.sendBinary(Buffer.from(JSON.stringify({ op: 'who', id: 5 })));
      const e = await a.next('error');
      assert.deepEqual([e.code, e.id], ['bad_request', null]);
      await a.ok('who');
    });

    it('a frame over limits.max_frame_bytes closes the connection with 1009', async () => {
      const ns = uniqueNs();
      const a = await env.connect(s, ns, 'alice');
      // just under the limit: answered (the body is too large, the frame is not)
      const pad = 'p'.repeat(4000);
      await a.fails('send', { to: 'bob', body: pad }, 'payload_too_large');
      // exactly max_frame_bytes is allowed
      const head = '{"op":"who","id":"edge","pad":"';
      const exact = `${head}${'q'.repeat(4096 - head.length - 2)}"}`;
      assert.equal(Buffer.byteLength(exact), 4096);
      assert.equal((await a.requestRaw(exact, 'edge')).op, 'ok');
      a.sendRaw(`${head}${'q'.repeat(4097 - head.length - 2)}"}`);
      const closed = await a.waitClose();
      assert.equal(closed.code, 1009);
      // the server is fine
      const b = await env.connect(s, ns, 'bob');
      await b.ok('who');
    });

    it('subprotocols: amp.v1 is selected, none is accepted, others are refused with HTTP 400', async () => {
      const ns = uniqueNs();
      await assert.rejects(Client.open(s.url, { protocols: ['foo'] }), (err) => {
        assert.equal(err.statusCode, 400, err.message);
        return true;
      });
      await assert.rejects(Client.open(s.url, { protocols: ['amp.v2', 'foo'] }), (err) => err.statusCode === 400);
      const v1 = await env.open(s, { protocols: ['amp.v1'] });
      assert.equal(v1.protocol, 'amp.v1');
      const both = await env.open(s, { protocols: ['foo', 'amp.v1'] });
      assert.equal(both.protocol, 'amp.v1');
      const none = await env.open(s, { protocols: [] });
      assert.equal(none.protocol, '');
      await none.ok('hello', { token: env.token(ns, 'alice') });
      await none.ok('who');
      await assert.rejects(Client.open(s.url.replace('/amp', '/other')), (err) => err.statusCode === 404);
    });

    it('a connection that says no hello within 5 s gets unauthenticated and 4401', async () => {
      const e = await silent.next('error', 10000);
      const elapsed = Client.arrivedAt(e) - silentSince;
      assert.deepEqual([e.code, e.id], ['unauthenticated', null]);
      const closed = await silent.waitClose();
      assert.equal(closed.code, 4401);
      assert.ok(elapsed >= 4500 && elapsed < 9000, `closed after ${elapsed} ms`);
    });

    it('HTTP: /healthz and /readyz are 200, /metrics is Prometheus text', async () => {
      const health = await httpGet(`${s.http}/healthz`);
      assert.equal(health.status, 200);
      const ready = await httpGet(`${s.http}/readyz`);
      assert.equal(ready.status, 200);
      const m = await httpGet(`${s.http}/metrics`);
      assert.equal(m.status, 200);
      assert.match(m.headers['content-type'], /^text\/plain/);
      for (const name of ['amp_sessions', 'amp_frames_in_total', 'amp_frames_out_total', 'amp_errors_total',
        'amp_task_transitions_total', 'amp_offers_total', 'amp_lease_expiries_total', 'amp_backend_seconds']) {
        assert.match(m.body, new RegExp(`^# TYPE ${name} `, 'm'), name);
      }
      assert.match(m.body, /^amp_frames_in_total\{op="hello"\} [1-9]/m);
      assert.match(m.body, /^amp_frames_in_total\{op="binary"\} [1-9]/m);
      assert.match(m.body, /^amp_errors_total\{code="bad_request"\} [1-9]/m);
      assert.match(m.body, /^amp_errors_total\{code="unauthenticated"\} [1-9]/m);
      assert.match(m.body, /^amp_task_transitions_total\{to="queued"\} [1-9]/m);
      assert.match(m.body, /^amp_backend_seconds_bucket\{.*le="\+Inf"\} [1-9]/m);
      const sessions = Number(/^amp_sessions (\d+)/m.exec(m.body)[1]);
      assert.ok(sessions >= 1, `amp_sessions ${sessions}`);
      assert.equal((await httpGet(`${s.http}/nope`)).status, 404);
    });
  });

  describe(`max_sessions (${transport})`, suiteOptions(transport), () => {
    const env = new Env(transport);
    let s;
    before(async () => {
      await env.setup();
      s = await env.server({ limits: { max_sessions: 2 } });
    });
    after(() => env.teardown());

    it('over max_sessions hello is limit_exceeded and the connection closes with 1013', async () => {
      const ns = uniqueNs();
      const a = await env.connect(s, ns, 'alice');
      await env.connect(s, ns, 'bob');
      // a connection that has not said hello does not count
      const third = await env.open(s);
      const e = await third.fails('hello', { token: env.token(ns, 'carol') }, 'limit_exceeded');
      assert.ok(e.message.length > 0);
      assert.equal((await third.waitClose()).code, 1013);
      // a place freed is a place taken again
      await a.close();
      await eventually(async () => {
        const c = await env.open(s);
        const r = await c.request('hello', { token: env.token(ns, 'carol') });
        if (r.op !== 'ok') c.terminate();
        return r.op === 'ok';
      }, { what: 'a hello after a session closed' });
    });
  });
}
