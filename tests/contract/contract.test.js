'use strict';
// The contract asyncapi/amp.yaml against the code (issue 17, seed 003): the document is a
// valid AsyncAPI 3.1.0 document for @asyncapi/parser; its WebSocket channel carries every
// frame schema of schemas/frames/; and, through amp-contract-probe (contract_probe.cpp, which
// calls names.hpp and subjects.hpp), every address, stream, consumer, filter, bucket and key
// the code builds equals the one the contract renders from the same parameters, and the
// contract's token rules accept and refuse exactly the names names.hpp accepts and refuses.
//
// Environment: AMP_CONTRACT_PROBE (the probe binary), NODE_PATH (the locked npm modules of
// tests/e2e, which hold @asyncapi/parser).

const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { Parser, fromFile } = require('@asyncapi/parser');

const root = path.resolve(__dirname, '..', '..');
const contractFile = path.join(root, 'asyncapi', 'amp.yaml');
const probe = process.env.AMP_CONTRACT_PROBE;

let parsed;
async function contract() {
  if (!parsed) parsed = await fromFile(new Parser(), contractFile).parse();
  return parsed;
}

// A deterministic generator (mulberry32), so that a failure can be run again.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const pick = (random, list) => list[Math.floor(random() * list.length)];
const between = (random, lo, hi) => lo + Math.floor(random() * (hi - lo + 1));

// The characters of a bracket-expression body such as `a-z0-9_-` (notation of x-nats-contract).
function charset(body) {
  const out = [];
  for (let i = 0; i < body.length; ++i) {
    if (i + 2 < body.length && body[i + 1] === '-') {
      for (let c = body.charCodeAt(i); c <= body.charCodeAt(i + 2); ++c) out.push(String.fromCharCode(c));
      i += 2;
    } else {
      out.push(body[i]);
    }
  }
  return out;
}

// The rules of x-nats-contract's token types, read from the document: accepts(value), and
// generate(random) giving a valid value.
function tokenRules(types) {
  const rules = {};
  const rule = (name) => {
    if (rules[name]) return rules[name];
    const t = types[name];
    assert.ok(t, `token type ${name} is defined`);
    if (t.kind === 'token') {
      const first = new Set(charset(t.first));
      const alphabet = new Set(charset(t.alphabet));
      const firstList = [...first];
      const alphabetList = [...alphabet];
      const reserved = new Set(t.reserved || []);
      rules[name] = {
        accepts(v) {
          if (reserved.has(v) || !v.startsWith(t.prefix)) return false;
          const rest = [...v.slice(t.prefix.length)];
          if (rest.length < t.minLength || rest.length > t.maxLength) return false;
          return first.has(rest[0]) && rest.every((c) => alphabet.has(c));
        },
        generate(random) {
          const n = random() < 0.2 ? pick(random, [t.minLength, t.maxLength]) : between(random, t.minLength, t.maxLength);
          let v = t.prefix + pick(random, firstList);
          while (v.length < t.prefix.length + n) v += pick(random, alphabetList);
          return v;
        },
      };
    } else {
      const token = rule(t.token);
      const isPattern = t.kind === 'pattern';
      assert.ok(t.kind === 'tokens' || isPattern, `kind of ${name}`);
      rules[name] = {
        accepts(v) {
          const parts = v.split(t.separator);
          if (parts.length < t.minTokens || parts.length > t.maxTokens) return false;
          return parts.every((p, i) =>
            token.accepts(p) || (isPattern && (p === t.single || (p === t.tail && i === parts.length - 1))));
        },
        generate(random) {
          const n = between(random, t.minTokens, t.maxTokens);
          const parts = [];
          for (let i = 0; i < n; ++i) {
            const r = random();
            if (isPattern && r < 0.2) parts.push(t.single);
            else if (isPattern && i === n - 1 && r < 0.4) parts.push(t.tail);
            else parts.push(token.generate(random));
          }
          return parts.join(t.separator);
        },
      };
    }
    return rules[name];
  };
  for (const name of Object.keys(types)) rule(name);
  return rules;
}

// Values near a valid one: a character replaced, inserted or dropped, the value cut,
// doubled, or stripped of its first characters; and values every grammar must refuse.
const strange = ['A', 'Z', '.', '*', '>', ' ', '\t', '\n', '$', '/', '\\', 'é', '\u0000', '_', '-', '0', '9', 'a', 'z', 't', 'o', 'g', '..'];
function near(random, v) {
  const i = Math.floor(random() * (v.length + 1));
  switch (Math.floor(random() * 7)) {
    case 0: return v.slice(0, i) + pick(random, strange) + v.slice(i + 1);
    case 1: return v.slice(0, i) + pick(random, strange) + v.slice(i);
    case 2: return v.slice(0, i) + v.slice(i + 1);
    case 3: return v.slice(0, i);
    case 4: return v + v;
    case 5: return v.slice(Math.min(v.length, 1 + Math.floor(random() * 2)));
    default: return pick(random, strange) + v;
  }
}
const fixed = ['', '$broker', '>', '*', 'a', 'a.', '.a', 'a..b', 'a.>', 'a.*.b', '>.a', 't_', 'o_', 't_1', 'o_1',
  'a'.repeat(64), 'a'.repeat(65), `t_${'z'.repeat(62)}`, `t_${'z'.repeat(63)}`, Array(8).fill('a').join('.'),
  Array(9).fill('a').join('.'), `${Array(7).fill('a').join('.')}.>`, `${Array(8).fill('a').join('.')}.>`];

function runProbe(input) {
  assert.ok(probe, 'AMP_CONTRACT_PROBE names the probe');
  return JSON.parse(execFileSync(probe, { input: JSON.stringify(input), maxBuffer: 64 << 20 }));
}

// Renders `{param}` in `template` from `values`; every parameter must be given.
function render(template, values) {
  return template.replace(/\{([A-Za-z]+)\}/g, (_, p) => {
    assert.ok(p in values, `parameter ${p} of ${template} has a value`);
    return values[p];
  });
}

test('asyncapi/amp.yaml is a valid AsyncAPI 3.1.0 document, without errors or warnings', async () => {
  const { document, diagnostics } = await contract();
  assert.deepEqual(diagnostics.map((d) => `${d.severity} ${d.code}: ${d.message} at ${d.path.join('/')}`), []);
  assert.ok(document);
  assert.equal(document.version(), '3.1.0');
  const ext = document.extensions().get('x-nats-contract');
  assert.ok(ext, 'x-nats-contract is there');
});

test('the WebSocket channel carries every frame schema of schemas/frames/, each resolved from its file', async () => {
  const { document } = await contract();
  const session = document.channels().get('session');
  assert.equal(session.address(), '/amp');
  const wanted = new Map();
  const frames = path.join(root, 'schemas', 'frames');
  for (const f of fs.readdirSync(frames).filter((f) => f.endsWith('.json') && f !== 'names.json')) {
    wanted.set(`client_${f.slice(0, -5)}`, JSON.parse(fs.readFileSync(path.join(frames, f))).title);
  }
  for (const f of fs.readdirSync(path.join(frames, 'server')).filter((f) => f.endsWith('.json'))) {
    wanted.set(`server_${f.slice(0, -5)}`, JSON.parse(fs.readFileSync(path.join(frames, 'server', f))).title);
  }
  const got = new Map(session.messages().all().map((m) => [m.id(), m.payload().title()]));
  assert.deepEqual([...got.keys()].sort(), [...wanted.keys()].sort());
  for (const [id, title] of wanted) assert.equal(got.get(id), title, id);
  const receive = document.operations().get('receiveClientFrames').messages().all().map((m) => m.id()).sort();
  const send = document.operations().get('sendServerFrames').messages().all().map((m) => m.id()).sort();
  assert.deepEqual(receive, [...wanted.keys()].filter((k) => k.startsWith('client_')).sort());
  assert.deepEqual(send, [...wanted.keys()].filter((k) => k.startsWith('server_')).sort());
});

test('the token rules of the contract accept and refuse the same names as names.hpp', async () => {
  const { document } = await contract();
  const ext = document.extensions().get('x-nats-contract').value();
  const rules = tokenRules(ext.tokenTypes);
  const random = rng(17);
  const checked = ['Namespace', 'Participant', 'Job', 'Sink', 'Topic', 'TopicPattern', 'TaskId', 'OperationId'];
  const names = {};
  for (const type of checked) {
    const values = [...fixed];
    for (let i = 0; i < 300; ++i) {
      const v = rules[type].generate(random);
      values.push(v, near(random, v), near(random, near(random, v)));
    }
    names[type] = values;
  }
  const answer = runProbe({ names, addresses: [] });
  for (const type of checked) {
    const verdicts = answer.names[type];
    assert.equal(verdicts.length, names[type].length);
    let accepted = 0;
    names[type].forEach((v, i) => {
      assert.equal(rules[type].accepts(v), verdicts[i], `${type} ${JSON.stringify(v)}: contract vs names.hpp`);
      if (verdicts[i]) ++accepted;
    });
    // Both answers occur, many times each: the comparison is not vacuous.
    assert.ok(accepted > 300 && names[type].length - accepted > 200, `${type}: ${accepted} of ${names[type].length} accepted`);
  }
  // Ids as the broker makes them are inside the contract's token types.
  for (const [type, ids] of Object.entries(answer.generated)) {
    assert.equal(ids.length, 200);
    for (const id of ids) assert.ok(rules[type].accepts(id), `${type} ${id}, made by the broker`);
  }
});

test('every address, stream, consumer, filter, bucket and key subjects.hpp builds is the contract\'s', async () => {
  const { document } = await contract();
  const ext = document.extensions().get('x-nats-contract').value();
  const rules = tokenRules(ext.tokenTypes);
  const random = rng(2026);
  const nats = document.channels().all().filter((c) => c.servers().all().some((s) => s.protocol() === 'nats'));
  assert.deepEqual(nats.map((c) => c.id()).sort(), Object.keys(ext.channels).sort(),
    'x-nats-contract describes every NATS channel, and only those');

  const kinds = { ns: 'Namespace', participant: 'Participant', job: 'Job', topic: 'Topic', pattern: 'TopicPattern',
    sink: 'Sink', task: 'TaskId', operation: 'OperationId', gateway: 'Gateway', digest: 'Digest', day: 'Day' };
  const tuples = [];
  for (let i = 0; i < 60; ++i) {
    const t = {};
    for (const [param, type] of Object.entries(kinds)) t[param] = rules[type].generate(random);
    tuples.push(t);
  }
  const answer = runProbe({ names: {}, addresses: tuples });
  assert.equal(answer.addresses.length, tuples.length);

  tuples.forEach((values, i) => {
    const expected = {};
    for (const channel of nats) {
      const spec = ext.channels[channel.id()];
      // The channel's parameters are the AsyncAPI channel's, typed by the contract.
      assert.deepEqual(channel.parameters().all().map((p) => p.id()).sort(), Object.keys(spec.parameters).sort(), channel.id());
      for (const [param, type] of Object.entries(spec.parameters)) assert.equal(kinds[param], type, `${channel.id()}.${param}`);
      const id = channel.id();
      expected[`${id}.address`] = render(channel.address(), values);
      if (spec.stream) expected[`${id}.stream.name`] = render(spec.stream.name, values);
      if (spec.consumer) expected[`${id}.consumer`] = render(spec.consumer, values);
      if (spec.bucket) {
        expected[`${id}.bucket`] = render(spec.bucket, values);
        expected[`${id}.key`] = render(spec.key, values);
        assert.equal(channel.address(), `$KV.${spec.bucket}.${spec.key}`, `${id}: a KV channel's address is $KV.<bucket>.<key>`);
      }
      for (const [name, filter] of Object.entries(spec.filters || {})) {
        if (typeof filter === 'string') {
          expected[`${id}.filters.${name}`] = render(filter, values);
        } else {
          for (const [param, type] of Object.entries(filter.parameters)) assert.equal(kinds[param], type);
          expected[`${id}.filters.${name}`] = render(filter.address, values);
        }
      }
    }
    assert.deepEqual(answer.addresses[i], expected, `parameters ${JSON.stringify(values)}`);
  });
});
